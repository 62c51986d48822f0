// WindowedStream: writes are issued one at a time (as gRPC requires), the
// next as soon as the previous is done and the window allows.
#include "bench/windowed_stream.h"

namespace optstate::bench {

std::shared_ptr<grpc::Channel> MakeClientChannel(const std::string& target, int max_message_bytes) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(max_message_bytes);
  args.SetMaxSendMessageSize(max_message_bytes);
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  return grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args);
}

absl::Status WindowedStream::Run(grpc::GenericStub& stub, const char* method) {
  stub.PrepareBidiStreamingCall(&context_, method, grpc::StubOptions(), this);
  StartRead(&reply_);
  {
    std::lock_guard<std::mutex> lock(mu_);
    writing_ = true;
  }
  WriteNext();
  StartCall();
  std::unique_lock<std::mutex> lock(mu_);
  finished_.wait(lock, [&] { return done_; });
  if (!error_.ok()) return error_;
  if (!status_.ok()) return absl::UnavailableError(status_.error_message());
  if (answered_ < chunks_) return absl::UnavailableError("the stream ended early");
  return absl::OkStatus();
}

void WindowedStream::WriteNext() {
  const size_t i = next_++;
  const grpc::ByteBuffer* request = Request(i);
  if (i + 1 == chunks_) {
    StartWriteLast(request, grpc::WriteOptions());
  } else {
    StartWrite(request);
  }
}

bool WindowedStream::ClaimWrite() {
  if (writing_ || next_ >= chunks_ || next_ - answered_ >= window_) return false;
  writing_ = true;
  return true;
}

void WindowedStream::OnWriteDone(bool ok) {
  bool write;
  {
    std::lock_guard<std::mutex> lock(mu_);
    writing_ = false;
    if (!ok) return;  // The stream is failing; OnDone reports it.
    write = ClaimWrite();
  }
  if (write) WriteNext();
}

void WindowedStream::OnReadDone(bool ok) {
  if (!ok) return;
  // Replies come one at a time (the next read starts below), so Accept runs
  // alone.
  absl::Status error;
  const bool accepted = Accept(answered_, reply_, &error);
  bool write;
  bool more;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!accepted) {
      error_ = error;
      context_.TryCancel();
      return;
    }
    ++answered_;
    more = answered_ < chunks_;
    write = ClaimWrite();
  }
  if (more) StartRead(&reply_);
  if (write) WriteNext();
}

void WindowedStream::OnDone(const grpc::Status& status) {
  std::lock_guard<std::mutex> lock(mu_);
  status_ = status;
  done_ = true;
  finished_.notify_one();
}

}  // namespace optstate::bench

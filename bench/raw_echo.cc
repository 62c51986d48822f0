// Raw (ByteBuffer) echo: callback generic server reactor and a callback
// client reactor that keeps a window of chunks in flight, as Client::Step does.
#include "bench/raw_echo.h"

#include <condition_variable>
#include <mutex>
#include <string>

#include "echo.pb.h"  // Generated from bench/echo.proto.
#include "grpcpp/generic/async_generic_service.h"
#include "grpcpp/generic/generic_stub.h"

namespace optstate::bench {
namespace {

// The method name no registered service has, so the generic service gets it.
constexpr char kRawEchoMethod[] = "/optstate.bench.RawEcho/Echo";

// Echoes each message: read, write the same buffer back, read the next.
class RawEchoReactor final : public grpc::ServerGenericBidiReactor {
 public:
  RawEchoReactor() { StartRead(&buffer_); }

 private:
  void OnReadDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status::OK);
      return;
    }
    StartWrite(&buffer_);
  }
  void OnWriteDone(bool ok) override {
    if (!ok) {
      Finish(grpc::Status(grpc::StatusCode::UNAVAILABLE, "echo write failed"));
      return;
    }
    StartRead(&buffer_);
  }
  void OnDone() override { delete this; }

  grpc::ByteBuffer buffer_;
};

class RawEchoService final : public grpc::CallbackGenericService {
  grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext*) override {
    return new RawEchoReactor();
  }
};

// One step's stream. Writes are issued one at a time (as gRPC requires), the
// next as soon as the previous is done and the window allows.
class RawEchoCall final : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  RawEchoCall(const std::vector<grpc::ByteBuffer>& chunks, const std::vector<size_t>& sizes,
              size_t window)
      : chunks_(chunks), sizes_(sizes), window_(window) {}

  absl::Status Run(grpc::GenericStub& stub) {
    stub.PrepareBidiStreamingCall(&context_, kRawEchoMethod, grpc::StubOptions(), this);
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
    if (answered_ < chunks_.size()) return absl::UnavailableError("raw echo ended early");
    return absl::OkStatus();
  }

 private:
  // Called with writing_ set by the caller; issues chunk next_.
  void WriteNext() {
    const size_t i = next_++;
    if (i + 1 == chunks_.size()) {
      StartWriteLast(&chunks_[i], grpc::WriteOptions());
    } else {
      StartWrite(&chunks_[i]);
    }
  }

  // Takes the writer role if a chunk may go now.
  bool ClaimWrite() {
    if (writing_ || next_ >= chunks_.size() || next_ - answered_ >= window_) return false;
    writing_ = true;
    return true;
  }

  void OnWriteDone(bool ok) override {
    bool write;
    {
      std::lock_guard<std::mutex> lock(mu_);
      writing_ = false;
      if (!ok) return;  // The stream is failing; OnDone reports it.
      write = ClaimWrite();
    }
    if (write) WriteNext();
  }

  void OnReadDone(bool ok) override {
    if (!ok) return;
    bool write;
    bool more;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (reply_.Length() != sizes_[answered_]) {
        error_ = absl::InternalError("raw echo reply of the wrong size");
        context_.TryCancel();
        return;
      }
      ++answered_;
      more = answered_ < chunks_.size();
      write = ClaimWrite();
    }
    if (more) StartRead(&reply_);
    if (write) WriteNext();
  }

  void OnDone(const grpc::Status& status) override {
    std::lock_guard<std::mutex> lock(mu_);
    status_ = status;
    done_ = true;
    finished_.notify_one();
  }

  const std::vector<grpc::ByteBuffer>& chunks_;
  const std::vector<size_t>& sizes_;  // Serialized size of each chunk.
  const size_t window_;
  grpc::ClientContext context_;
  grpc::ByteBuffer reply_;
  std::mutex mu_;
  std::condition_variable finished_;
  size_t next_ = 0;      // Next chunk to write.
  size_t answered_ = 0;  // Replies received.
  bool writing_ = false;
  bool done_ = false;
  absl::Status error_;
  grpc::Status status_;
};

}  // namespace

std::unique_ptr<grpc::CallbackGenericService> MakeRawEchoService() {
  return std::make_unique<RawEchoService>();
}

struct RawEchoClient::Impl {
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<grpc::GenericStub> stub;
  size_t window = 0;
  std::vector<grpc::ByteBuffer> chunks;  // Serialized EchoChunk messages.
  std::vector<size_t> sizes;             // Their sizes in bytes.
};

RawEchoClient::RawEchoClient(const std::string& target, int max_message_bytes, int window,
                             const std::vector<size_t>& chunk_bytes)
    : impl_(std::make_unique<Impl>()) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(max_message_bytes);
  args.SetMaxSendMessageSize(max_message_bytes);
  // A connection per client, as optstate::Client has.
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  impl_->channel = grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args);
  impl_->stub = std::make_unique<grpc::GenericStub>(impl_->channel);
  impl_->window = static_cast<size_t>(window);
  uint64_t offset = 0;
  for (size_t bytes : chunk_bytes) {
    EchoChunk chunk;
    chunk.set_group("tensor");
    chunk.set_step(1);
    chunk.set_offset(offset);
    chunk.mutable_payload()->assign(bytes, '\1');
    offset += bytes;
    const std::string serialized = chunk.SerializeAsString();
    grpc::Slice slice(serialized);
    impl_->chunks.emplace_back(&slice, 1);
    impl_->sizes.push_back(serialized.size());
  }
}

RawEchoClient::~RawEchoClient() = default;

absl::Status RawEchoClient::Step() {
  if (impl_->chunks.empty()) return absl::OkStatus();
  RawEchoCall call(impl_->chunks, impl_->sizes, impl_->window);
  return call.Run(*impl_->stub);
}

}  // namespace optstate::bench

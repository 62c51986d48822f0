// Echo server and client. The client mirrors client/client_step.cc's stream:
// a writer thread bounded by a window, replies read on the calling thread.
#include "bench/echo_baseline.h"

#include <condition_variable>
#include <cstring>
#include <mutex>
#include <thread>

#include "absl/strings/str_cat.h"
#include "bench/raw_echo.h"
#include "bench/serve_until_signal.h"
#include "bench/windowed_stream.h"
#include "echo.grpc.pb.h"  // Generated from bench/echo.proto.

namespace optstate::bench {
namespace {

class EchoService final : public Echo::Service {
  grpc::Status Echo(grpc::ServerContext*,
                    grpc::ServerReaderWriter<EchoChunk, EchoChunk>* stream) override {
    EchoChunk chunk;
    while (stream->Read(&chunk)) {
      if (!stream->Write(chunk)) break;
    }
    return grpc::Status::OK;
  }
};

}  // namespace

int ServeEcho() {
  EchoService service;
  std::unique_ptr<grpc::CallbackGenericService> raw_echo = MakeRawEchoService();
  return ServeUntilSignal("echo", [&](grpc::ServerBuilder& builder) {
    builder.RegisterService(&service);
    builder.RegisterCallbackGenericService(raw_echo.get());
  });
}

struct EchoClient::Impl {
  std::unique_ptr<Echo::Stub> stub;
  size_t window;
};

EchoClient::EchoClient(const std::string& target, int max_message_bytes, int window)
    : impl_(std::make_unique<Impl>()) {
  impl_->stub = Echo::NewStub(MakeClientChannel(target, max_message_bytes));
  impl_->window = static_cast<size_t>(window);
}

EchoClient::~EchoClient() = default;

absl::Status EchoClient::Step(const std::vector<size_t>& chunk_bytes, const char* payload,
                              char* out) {
  grpc::ClientContext context;
  std::unique_ptr<grpc::ClientReaderWriter<EchoChunk, EchoChunk>> stream =
      impl_->stub->Echo(&context);
  std::mutex mu;
  std::condition_variable window_open;
  size_t answered = 0;
  bool stop = false;
  const size_t total = chunk_bytes.size();
  std::vector<size_t> offsets(total);
  for (size_t i = 1; i < total; ++i) offsets[i] = offsets[i - 1] + chunk_bytes[i - 1];

  std::thread writer([&] {
    EchoChunk request;
    for (size_t i = 0; i < total; ++i) {
      {
        std::unique_lock<std::mutex> lock(mu);
        window_open.wait(lock, [&] { return stop || i - answered < impl_->window; });
        if (stop) break;
      }
      request.Clear();
      request.set_group("tensor");
      request.set_step(1);
      request.set_offset(offsets[i]);
      request.set_payload(payload + offsets[i], chunk_bytes[i]);
      if (!stream->Write(request)) break;
    }
    stream->WritesDone();
  });
  EchoChunk reply;
  size_t got = 0;
  absl::Status status;
  for (; got < total && stream->Read(&reply); ++got) {
    if (reply.payload().size() != chunk_bytes[got]) {
      status = absl::InternalError("echo reply of the wrong size");
      break;
    }
    std::memcpy(out + offsets[got], reply.payload().data(), chunk_bytes[got]);
    std::lock_guard<std::mutex> lock(mu);
    ++answered;
    window_open.notify_one();
  }
  {
    std::lock_guard<std::mutex> lock(mu);
    stop = true;
    window_open.notify_one();
  }
  if (got < total) context.TryCancel();
  writer.join();
  grpc::Status finish = stream->Finish();
  if (!status.ok()) return status;
  if (!finish.ok()) return absl::UnavailableError(finish.error_message());
  if (got < total) return absl::UnavailableError("echo stream ended early");
  return absl::OkStatus();
}

}  // namespace optstate::bench

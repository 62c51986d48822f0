// Raw (ByteBuffer) echo: callback generic server reactor and a client stream
// that keeps a window of chunks in flight, as Client::Step does.
#include "bench/raw_echo.h"

#include <string>

#include "bench/windowed_stream.h"
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

// One step's stream: the pre-serialized chunks out, replies checked for size.
class RawEchoCall final : public WindowedStream {
 public:
  RawEchoCall(const std::vector<grpc::ByteBuffer>& chunks, const std::vector<size_t>& sizes,
              size_t window)
      : WindowedStream(chunks.size(), window), chunks_(chunks), sizes_(sizes) {}

 private:
  const grpc::ByteBuffer* Request(size_t index) override { return &chunks_[index]; }
  bool Accept(size_t index, const grpc::ByteBuffer& reply, absl::Status* error) override {
    if (reply.Length() == sizes_[index]) return true;
    *error = absl::InternalError("raw echo reply of the wrong size");
    return false;
  }

  const std::vector<grpc::ByteBuffer>& chunks_;
  const std::vector<size_t>& sizes_;  // Serialized size of each chunk.
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
  impl_->channel = MakeClientChannel(target, max_message_bytes);
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
  return call.Run(*impl_->stub, kRawEchoMethod);
}

}  // namespace optstate::bench

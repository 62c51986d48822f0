// The minimal AdamW service: a callback generic server whose reactor updates
// its state from each message and queues the reply, and a client stream that
// keeps a window of messages in flight, as Client::Step does.
#include "bench/raw_adamw.h"

#include <malloc.h>

#include <cstring>
#include <deque>
#include <map>
#include <mutex>

#include "absl/strings/string_view.h"
#include "bench/serve_until_signal.h"
#include "bench/windowed_stream.h"
#include "grpc/slice.h"
#include "grpcpp/generic/async_generic_service.h"
#include "grpcpp/generic/generic_stub.h"
#include "server/base/segmented_bytes.h"
#include "server/kernels/adamw_kernel.h"

namespace optstate::bench {
namespace {

constexpr char kRawAdamWMethod[] = "/optstate.bench.RawAdamW/Step";

// Each request: this header, then the gradient's wire bytes. Each reply: the
// updated params' wire bytes alone.
struct RawAdamWHeader {
  uint64_t client;        // Whose state.
  uint64_t step;          // t >= 1.
  uint64_t first;         // Index of the payload's first element in the client's state.
  uint64_t total;         // Elements of the client's state.
  uint32_t wire;          // WireType of the gradient and of the params returned.
  uint32_t check_finite;  // Nonzero: refuse the message, changing nothing, if any
                          // gradient element is not finite.
};

// Every client's p, m and v: fresh (RawAdamWInitialParam, m = v = 0) at the
// first message of a step 1 (so the configurations of one run can share a
// client's state, one after the other) and whenever the size changes. The
// reactor applies a stream's first message before reading the next, so no
// other message of the stream touches the state while it is reset.
class StateTable {
 public:
  struct State {
    std::vector<float> p, m, v;
  };
  State* Get(uint64_t client, uint64_t total, bool fresh) {
    std::lock_guard<std::mutex> lock(mu_);
    State& state = states_[client];  // std::map: the reference stays valid.
    if (fresh || state.p.size() != total) {
      state.p.resize(total);
      for (uint64_t i = 0; i < total; ++i) state.p[i] = RawAdamWInitialParam(i);
      state.m.assign(total, 0.0f);
      state.v.assign(total, 0.0f);
    }
    return &state;
  }

 private:
  std::mutex mu_;
  std::map<uint64_t, State> states_;
};

// The bytes of `slices`, in order, viewed in place (the slices must outlive
// the view).
SegmentedBytes ViewOf(const std::vector<grpc::Slice>& slices) {
  SegmentedBytes bytes;
  for (const grpc::Slice& slice : slices) {
    bytes.Append(absl::string_view(reinterpret_cast<const char*>(slice.begin()), slice.size()));
  }
  return bytes;
}

// Applies one request to the state and builds its reply; false for a request
// this benchmark's client would never send.
bool Apply(StateTable& table, const grpc::ByteBuffer& request, grpc::ByteBuffer* reply) {
  std::vector<grpc::Slice> slices;
  if (!request.Dump(&slices).ok()) return false;
  const SegmentedBytes bytes = ViewOf(slices);
  RawAdamWHeader header;
  if (bytes.size() < sizeof(header)) return false;
  bytes.CopyTo(0, sizeof(header), reinterpret_cast<char*>(&header));
  const auto wire = static_cast<WireType>(header.wire);
  if (wire != WireType::kFloat32 && wire != WireType::kBFloat16) return false;
  const size_t element_size = WireTypeSize(wire);
  const size_t payload = bytes.size() - sizeof(header);
  const size_t count = payload / element_size;
  if (payload % element_size != 0 || header.step == 0 || header.first > header.total ||
      count > header.total - header.first) {
    return false;
  }
  StateTable::State& state =
      *table.Get(header.client, header.total, header.step == 1 && header.first == 0);
  AdamWStepInputs inputs;
  inputs.step = header.step;
  const AdamWConstants constants = ComputeAdamWConstants(inputs);
  if (header.check_finite != 0 &&
      !bytes.ForEachElementRun(sizeof(header), element_size, count,
                               [&](size_t, size_t n, const char* gradient) {
                                 return FindNonFiniteGradient(gradient, wire, n, 1.0f) == n;
                               })) {
    return false;
  }
  grpc_slice out = grpc_slice_malloc_large(payload);
  char* params = reinterpret_cast<char*>(GRPC_SLICE_START_PTR(out));
  bytes.ForEachElementRun(
      sizeof(header), element_size, count, [&](size_t first, size_t n, const char* gradient) {
        const size_t at = header.first + first;
        AdamWUpdateAndEncode(constants, &state.p[at], &state.m[at], &state.v[at], gradient, wire, n,
                             params + first * element_size, wire);
        return true;
      });
  grpc::Slice owned(out, grpc::Slice::STEAL_REF);
  *reply = grpc::ByteBuffer(&owned, 1);
  return true;
}

// One stream: starts reading the next request before applying the one just
// read (except the first, which may reset the state), so messages are applied
// concurrently on gRPC's callback threads (they touch disjoint elements);
// replies are written one at a time, in order.
class RawAdamWReactor final : public grpc::ServerGenericBidiReactor {
 public:
  explicit RawAdamWReactor(StateTable* table) : table_(*table) { StartRead(&request_); }

 private:
  void OnReadDone(bool ok) override {
    grpc::ByteBuffer request;
    uint64_t seq = 0;
    {
      std::lock_guard<std::mutex> lock(mu_);
      if (!ok || !status_.ok()) {
        reads_done_ = true;
        MaybeFinishLocked();
        return;
      }
      request.Swap(&request_);
      seq = next_seq_++;
      ++applying_;
    }
    if (seq != 0) StartRead(&request_);
    grpc::ByteBuffer reply;
    const bool applied = Apply(table_, request, &reply);
    if (seq == 0) StartRead(&request_);
    grpc::ByteBuffer* write = nullptr;
    {
      std::lock_guard<std::mutex> lock(mu_);
      --applying_;
      if (!applied && status_.ok()) {
        status_ = grpc::Status(grpc::StatusCode::INVALID_ARGUMENT, "malformed raw AdamW request");
      }
      if (status_.ok()) completed_[seq].Swap(&reply);
      while (!completed_.empty() && completed_.begin()->first == next_write_seq_) {
        replies_.emplace_back().Swap(&completed_.begin()->second);
        completed_.erase(completed_.begin());
        ++next_write_seq_;
      }
      if (!writing_ && !replies_.empty() && status_.ok()) {
        writing_ = true;
        write = &replies_.front();  // Deque elements stay put as others are added.
      }
      MaybeFinishLocked();
    }
    if (write != nullptr) StartWrite(write);
  }

  void OnWriteDone(bool ok) override {
    grpc::ByteBuffer* write = nullptr;
    {
      std::lock_guard<std::mutex> lock(mu_);
      replies_.pop_front();
      if (!ok && status_.ok()) {
        status_ = grpc::Status(grpc::StatusCode::UNAVAILABLE, "raw AdamW write failed");
      }
      if (replies_.empty() || !status_.ok()) {
        writing_ = false;
        MaybeFinishLocked();
      } else {
        write = &replies_.front();
      }
    }
    if (write != nullptr) StartWrite(write);
  }

  // Finishes once reading has ended (or the stream failed), nothing is being
  // applied and no write is in flight.
  void MaybeFinishLocked() {
    const bool done = reads_done_ || !status_.ok();
    const bool drained = status_.ok() ? replies_.empty() && completed_.empty() : true;
    if (done && drained && applying_ == 0 && !writing_ && !finished_) {
      finished_ = true;
      Finish(status_);
    }
  }

  void OnDone() override { delete this; }

  StateTable& table_;
  grpc::ByteBuffer request_;  // The read in flight.
  std::mutex mu_;
  uint64_t next_seq_ = 0;        // Of the next request read.
  uint64_t next_write_seq_ = 0;  // Of the next reply to queue for writing.
  int applying_ = 0;
  std::map<uint64_t, grpc::ByteBuffer> completed_;  // Applied, waiting for earlier ones.
  std::deque<grpc::ByteBuffer> replies_;            // Front: being written while writing_.
  bool writing_ = false;
  bool reads_done_ = false;
  bool finished_ = false;
  grpc::Status status_;
};

class RawAdamWService final : public grpc::CallbackGenericService {
  grpc::ServerGenericBidiReactor* CreateReactor(grpc::GenericCallbackServerContext*) override {
    return new RawAdamWReactor(&table_);
  }
  StateTable table_;
};

// One step's stream on the client.
class RawAdamWCall final : public WindowedStream {
 public:
  struct Plan {
    uint64_t client;
    uint64_t total;
    WireType wire;
    bool caller_holds_float;
    bool guarded;
    const float* gradient_float;           // Narrowed per message when lent is empty...
    const void* gradient_wire;             // ... or copied from here (fp32, or a bf16 caller).
    const std::vector<grpc::Slice>* lent;  // Each chunk's gradient wire bytes, or empty.
    const std::vector<size_t>* chunk_bytes;
    size_t window;
  };

  RawAdamWCall(const Plan& plan, uint64_t step, void* params_out)
      : WindowedStream(plan.chunk_bytes->size(), plan.window),
        plan_(plan),
        step_(step),
        params_out_(params_out) {}

  absl::Status Run(grpc::GenericStub& stub) {
    if (plan_.guarded) {
      // The whole step, before any of it is sent, as Client::Step checks it.
      const bool finite = plan_.caller_holds_float
                              ? AllNarrowToFinite(plan_.wire, plan_.gradient_float, plan_.total)
                              : AllWireFinite(plan_.wire, plan_.gradient_wire, plan_.total);
      if (!finite) return absl::InvalidArgumentError("gradient not finite");
    }
    return WindowedStream::Run(stub, kRawAdamWMethod);
  }

 private:
  size_t element_size() const { return WireTypeSize(plan_.wire); }

  // The header, then the chunk's gradient: lent, narrowed or copied.
  const grpc::ByteBuffer* Request(size_t index) override {
    const size_t bytes = (*plan_.chunk_bytes)[index];
    const RawAdamWHeader header{plan_.client,
                                step_,
                                sent_elements_,
                                plan_.total,
                                static_cast<uint32_t>(plan_.wire),
                                plan_.guarded ? 1u : 0u};
    grpc::Slice slices[2] = {grpc::Slice(&header, sizeof(header)), grpc::Slice()};
    if (!plan_.lent->empty()) {
      slices[1] = (*plan_.lent)[index];
    } else {
      grpc_slice copy = grpc_slice_malloc_large(bytes);
      if (plan_.caller_holds_float && plan_.wire != WireType::kFloat32) {
        EncodeFromFloat(plan_.wire, plan_.gradient_float + sent_elements_,
                        GRPC_SLICE_START_PTR(copy), bytes / element_size());
      } else {
        std::memcpy(GRPC_SLICE_START_PTR(copy),
                    static_cast<const char*>(plan_.gradient_wire) + sent_elements_ * element_size(),
                    bytes);
      }
      slices[1] = grpc::Slice(copy, grpc::Slice::STEAL_REF);
    }
    sent_elements_ += bytes / element_size();
    request_ = grpc::ByteBuffer(slices, 2);
    return &request_;
  }

  // Moves the reply's params into the caller's buffer at the chunk's place.
  bool Accept(size_t index, const grpc::ByteBuffer& reply, absl::Status* error) override {
    const size_t bytes = (*plan_.chunk_bytes)[index];
    std::vector<grpc::Slice> slices;
    if (reply.Length() != bytes || !reply.Dump(&slices).ok()) {
      *error = absl::InternalError("raw AdamW reply of the wrong size");
      return false;
    }
    const SegmentedBytes params = ViewOf(slices);
    const size_t size = element_size();
    params.ForEachElementRun(0, size, bytes / size, [&](size_t first, size_t n, const char* data) {
      const size_t at = received_elements_ + first;
      if (plan_.caller_holds_float) {
        DecodeToFloat(plan_.wire, data, static_cast<float*>(params_out_) + at, n);
      } else {
        std::memcpy(static_cast<char*>(params_out_) + at * size, data, n * size);
      }
      return true;
    });
    received_elements_ += bytes / size;
    return true;
  }

  const Plan& plan_;
  const uint64_t step_;
  void* const params_out_;
  grpc::ByteBuffer request_;        // The write in flight.
  uint64_t sent_elements_ = 0;      // Elements in the chunks built (writer only).
  uint64_t received_elements_ = 0;  // Elements delivered (reader only).
};

}  // namespace

int ServeRawAdamW() {
  // As optstated: chunk buffers come back from the heap instead of fresh mmaps.
  mallopt(M_MMAP_THRESHOLD, 32 << 20);
  mallopt(M_TRIM_THRESHOLD, 1 << 30);
  RawAdamWService service;
  return ServeUntilSignal("raw adamw", [&](grpc::ServerBuilder& builder) {
    builder.RegisterCallbackGenericService(&service);
  });
}

struct RawAdamWClient::Impl {
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<grpc::GenericStub> stub;
  std::vector<size_t> chunk_bytes;
  std::vector<grpc::Slice> lent;
  RawAdamWCall::Plan plan;
};

RawAdamWClient::RawAdamWClient(const std::string& target, int max_message_bytes, int window,
                               uint64_t client_id, const std::vector<size_t>& chunk_bytes,
                               WireType wire, bool caller_holds_float, bool guarded,
                               const float* gradient_float, const void* gradient_wire)
    : impl_(std::make_unique<Impl>()) {
  impl_->channel = MakeClientChannel(target, max_message_bytes);
  impl_->stub = std::make_unique<grpc::GenericStub>(impl_->channel);
  impl_->chunk_bytes = chunk_bytes;
  uint64_t total_bytes = 0;
  for (size_t bytes : chunk_bytes) total_bytes += bytes;
  const bool narrow_per_step = caller_holds_float && wire != WireType::kFloat32;
  if (!narrow_per_step && !guarded) {
    const char* at = static_cast<const char*>(gradient_wire);
    for (size_t bytes : chunk_bytes) {
      // The caller's bytes themselves: gRPC never frees them.
      impl_->lent.emplace_back(grpc_slice_new(const_cast<char*>(at), bytes, [](void*) {}),
                               grpc::Slice::STEAL_REF);
      at += bytes;
    }
  }
  impl_->plan = RawAdamWCall::Plan{client_id,
                                   total_bytes / WireTypeSize(wire),
                                   wire,
                                   caller_holds_float,
                                   guarded,
                                   gradient_float,
                                   gradient_wire,
                                   &impl_->lent,
                                   &impl_->chunk_bytes,
                                   static_cast<size_t>(window)};
}

RawAdamWClient::~RawAdamWClient() = default;

absl::Status RawAdamWClient::Step(uint64_t step, void* params_out) {
  if (impl_->chunk_bytes.empty()) return absl::OkStatus();
  RawAdamWCall call(impl_->plan, step, params_out);
  return call.Run(*impl_->stub);
}

}  // namespace optstate::bench

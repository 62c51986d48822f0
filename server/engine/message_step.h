// One Step message of several chunks stepped as a unit: every chunk checked
// before any is applied, then the chunks applied in order or, for a large
// message of independent chunks, at once over the engine's pool. How a
// message's work is spread is decided here; the transport reads the message
// into MessageChunks and writes the reply.
#ifndef OPTSTATE_SERVER_ENGINE_MESSAGE_STEP_H_
#define OPTSTATE_SERVER_ENGINE_MESSAGE_STEP_H_

#include <cstddef>
#include <cstdint>
#include <optional>
#include <vector>

#include "absl/functional/function_ref.h"
#include "absl/status/status.h"
#include "optstate/message_limits.h"
#include "server/engine/step_engine.h"

namespace optstate {

// Bytes [offset, offset + bytes) of a shared-memory region a chunk names.
// The caller has bounds-checked it, so the end does not wrap.
struct RegionSpan {
  uint64_t region = 0;  // The region's id.
  uint64_t offset = 0;
  uint64_t bytes = 0;
};

// One chunk of a message, as the transport made it from what it read.
struct MessageChunk {
  // OK, or why the transport could not make a chunk of what it read (a bad
  // field, a region not found or out of bounds): the chunk is then refused
  // in its turn, as if Validate had refused it.
  absl::Status read_status;
  // The chunk; its gradient is the message's bytes or a region's slice.
  StepChunk chunk;
  // The region slice the params go to instead of the reply (null: the
  // reply). It must hold exactly the chunk's params in chunk.param_type;
  // they are written with ParamsStore::kStreaming.
  char* params_out = nullptr;
  // The region slices the chunk names, if any: where the gradient was read
  // from (chunk.gradient is then over it) and params_out's.
  std::optional<RegionSpan> gradient_region;
  std::optional<RegionSpan> params_region;
};

// What the sender says it checked of a message (StepRequest.gradients_checked).
enum class SenderChecked {
  kNothing,  // Every chunk's values are checked before any chunk is applied.
  // Every gradient value is finite after grad_scale, by the sender's own
  // check: a chunk of at most kCheckedAsAppliedBytes
  // (optstate/message_limits.h) of gradient has its values checked just
  // before it is applied (in cache: applied at once, by the thread that
  // then updates it), so a bad one is still refused unapplied, but other
  // chunks may be applied by then; larger chunks are checked before any is
  // applied, as without.
  kValues,
};

// What of a message a refusal of one of its chunks left applied.
enum class MessageApplied {
  kNothing,       // Refused before any chunk was applied.
  kChunksBefore,  // Applied in order: the chunks before the refused one were.
  kOthers,        // Applied at once: the other chunks were, where they could be.
};

// The first refusal of a message's chunks; OK status: none.
struct MessageRefusal {
  size_t chunk = 0;  // The refused chunk's index in the message.
  absl::Status status;
  MessageApplied applied = MessageApplied::kNothing;

  bool ok() const { return status.ok(); }
};

// Not thread-safe: one per message, driven by one thread (Check, then
// Apply), which hands work to the engine's pool itself.
//
// A message of at least 4 MiB of gradients, on a pool of more than one
// thread, is spread over the pool: the gradients' values are checked in
// parts on its threads, and when no two chunks cover one page of a group
// (chunks of distinct groups, or of disjoint pages of one) and no
// chunk's params_region shares a byte with another chunk's region slices,
// the chunks are applied at once, one ParallelFor over them (the CPU backend
// may still split a chunk's update over idle threads). Every answer is the
// one the message applied in order on one thread gives, but for a chunk
// refused for its pages' state while applied at once: the others are then
// applied where they could be. Any other message is applied in order on the
// calling thread (each chunk's update still split over the pool by the CPU
// backend).
//
// With SenderChecked::kValues, the values of a chunk of at most
// kCheckedAsAppliedBytes of gradient are checked by Apply, by the thread
// that applies the chunk, before its first write, instead of by Check:
// every other answer is the same, but a bad value there refuses its chunk
// with the chunks before it applied (in order) or the others (at once).
// Applied at once, with at least two chunks for each thread (the calling
// one and the pool's), each thread takes its next chunk before it applies
// the one it holds, and that update reads the next chunk's gradient among
// its own loads (StepEngine::Apply's CheckAhead), where the check costs
// little beside an update bound by its arithmetic. A chunk that was not
// checked so is checked on its own just before it is applied: the first a
// thread takes, one whose gradient is in pieces, one after a large chunk
// (checked with the others) or after a chunk that was refused, wholly
// replayed or whose update failed, and one found with a bad value (the
// check on its own names the first).
class MessageStep {
 public:
  // `engine`, and what the chunks' gradients and params_out point to, must
  // outlive this.
  MessageStep(StepEngine* engine, std::vector<MessageChunk> chunks,
              SenderChecked sender_checked = SenderChecked::kNothing);

  // Checks every chunk in order, up to the first refusal: its read_status,
  // StepEngine::Validate, and that a params_out region holds the chunk's
  // params exactly (INVALID_ARGUMENT). A bad gradient value comes before
  // every refusal of a later chunk, and before the params_out size of its
  // own, as a check in order finds it (but the values of chunks left to
  // Apply, which are not checked here). Changes nothing; applied is
  // kNothing. Call once, before Apply.
  MessageRefusal Check();

  // Bytes of chunk i's params that go into the reply (0 when they go to
  // params_out). After Check passed.
  uint64_t reply_params_bytes(size_t i) const;

  // Applies the checked chunks (StepEngine::Apply), in order or at once (see
  // the class comment). `reserve_params(i, bytes)` gives where chunk i's
  // params go when they go into the reply; `applied(i)` is called once chunk
  // i is applied (result(i) is then set), by the thread that applied it, so
  // its answer can be made there; applied at once, both are called on the
  // pool's threads, once per chunk. The first refused chunk (in message
  // order) is returned, with kChunksBefore (in order: the rest was not
  // tried) or kOthers (at once). Call once, after Check passed.
  MessageRefusal Apply(absl::FunctionRef<char*(size_t chunk, size_t bytes)> reserve_params,
                       absl::FunctionRef<void(size_t chunk)> applied);
  MessageRefusal Apply(absl::FunctionRef<char*(size_t chunk, size_t bytes)> reserve_params) {
    return Apply(reserve_params, [](size_t) {});
  }

  size_t size() const { return chunks_.size(); }
  const StepChunk& chunk(size_t i) const { return chunks_[i].chunk; }
  // After Apply passed.
  const StepChunkResult& result(size_t i) const { return *results_[i]; }

 private:
  // Whether the chunks may be applied at once: spread, and no two of them
  // touch one page or write params where another reads or writes.
  bool AtOnce() const;
  // The deferred value checks of chunks [0, n) but those left to Apply, in
  // parts on the pool: the first bad value's refusal (in element order), or
  // OK.
  MessageRefusal CheckValuesSpread(size_t n) const;
  // Chunk i's gradient for the chunk before it to check as it updates: when
  // there is a chunk i, its values are left to Apply and its gradient is in
  // one piece.
  std::optional<CheckAhead> CheckAheadOf(size_t i) const;

  StepEngine* const engine_;
  std::vector<MessageChunk> chunks_;
  bool spread_ = false;
  // Per chunk: its values are checked by Apply, just before it is applied.
  std::vector<bool> checked_as_applied_;
  std::vector<ValidatedChunk> validated_;
  // Default-constructed: UNKNOWN (not applied), with no message to allocate.
  std::vector<absl::StatusOr<StepChunkResult>> results_;
};

}  // namespace optstate

#endif  // OPTSTATE_SERVER_ENGINE_MESSAGE_STEP_H_

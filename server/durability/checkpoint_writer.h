// Writes one checkpoint of a set of groups into --state_dir, crash-safely:
// after a crash at any moment, the directory holds every earlier complete
// checkpoint, and this one either whole or not at all.
#ifndef OPTSTATE_SERVER_DURABILITY_CHECKPOINT_WRITER_H_
#define OPTSTATE_SERVER_DURABILITY_CHECKPOINT_WRITER_H_

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "server/backends/step_backend.h"
#include "server/durability/checkpoint_format.h"
#include "server/state/group.h"

namespace optstate {

struct CheckpointTarget {
  std::shared_ptr<Group> group;
  // When set, every page must be captured at exactly this step.
  std::optional<uint64_t> exact_step;
  // Named by the Checkpoint call: deleted while it is written, the
  // checkpoint fails NOT_FOUND. Otherwise a group deleted meanwhile is left
  // out of the checkpoint (as if deleted before it).
  bool named = false;
};

// Where a checkpoint's time went, summed over its groups. Capture and
// checksum run on the calling thread, the writes on a second one at the same
// time, so the parts add up to more than the whole.
struct WriteTimes {
  absl::Duration capture;   // Copying pages under their locks.
  absl::Duration checksum;  // CRC32C of the copies.
  absl::Duration write;     // writev into the file (and starting writeback).
  absl::Duration sync;      // fsync of the data files.
};

struct WrittenCheckpoint {
  std::string id;
  uint64_t bytes = 0;  // Data files and manifest.
  Manifest manifest;
  WriteTimes times;
};

// Not thread-safe: one checkpoint is written at a time.
class CheckpointWriter {
 public:
  // `backend` must outlive the writer. A checkpoint holds at most two runs
  // of copied pages at a time, each max(buffer_bytes, one page of params, m
  // and v): one being captured, one being written. `commit_gate` (may be
  // null; StateStore::commit_gate(), which its deletes hold shared) is held
  // exclusively from the moment a checkpoint fixes its list of groups until
  // its directory is renamed into place.
  CheckpointWriter(std::string state_dir, uint64_t page_elements, StepBackend* backend,
                   uint64_t buffer_bytes, absl::Mutex* commit_gate = nullptr);

  // Writes checkpoint `sequence` of `targets` and returns once it is
  // durable. `step` is recorded as the checkpoint's step. A target group
  // deleted before the checkpoint fixes its list of groups is left out, as
  // if deleted before it (NOT_FOUND, nothing written, when it is `named`);
  // one deleted after comes after it. On error (FAILED_PRECONDITION when a
  // page with an exact_step was captured at another step, the file
  // system's error otherwise) nothing of it is left that a restore would
  // read, and earlier checkpoints are untouched.
  absl::StatusOr<WrittenCheckpoint> Write(uint64_t sequence, uint64_t step,
                                          const std::vector<CheckpointTarget>& targets);

  // Removes complete checkpoints older than the newest `keep` (at least 1)
  // and temporary directories other than `except` (the one being written).
  // Checkpoints `refused` (by sequence number: those a restore refused) are
  // neither counted among the `keep` nor removed: a damaged newer one must
  // not push out a good older one, and is left for its cause to be found.
  absl::Status Prune(int keep, const std::string& except = "",
                     const std::vector<uint64_t>& refused = {});

  // Removes every temporary directory (ckpt-N.tmp: a checkpoint a crash cut
  // short, or a removal a crash interrupted) and returns their names. Only
  // for start-up, under the state_dir's lock, before any checkpoint is
  // written: a crash loop would otherwise leave one more a crash, each as
  // large as the state, until a checkpoint completed.
  absl::StatusOr<std::vector<std::string>> RemoveUnfinished();

 private:
  absl::Status WriteGroup(uint64_t sequence, size_t index, const CheckpointTarget& target,
                          const std::string& path, ManifestGroup* entry, WriteTimes* times);

  const std::string state_dir_;
  const uint64_t page_elements_;
  StepBackend* const backend_;
  const uint64_t buffer_bytes_;
  absl::Mutex* const commit_gate_;
};

}  // namespace optstate

#endif  // OPTSTATE_SERVER_DURABILITY_CHECKPOINT_WRITER_H_

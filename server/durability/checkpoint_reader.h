// Restores the newest complete checkpoint in --state_dir at start: every
// file's size and checksum verified before anything is installed, falling
// back to older checkpoints when one is refused.
#ifndef OPTSTATE_SERVER_DURABILITY_CHECKPOINT_READER_H_
#define OPTSTATE_SERVER_DURABILITY_CHECKPOINT_READER_H_

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "server/base/thread_pool.h"
#include "server/durability/checkpoint_format.h"
#include "server/engine/state_store.h"

namespace optstate {

struct RestoreOutcome {
  std::string restored_id;  // "" when none was restored.
  uint64_t restored_step = 0;
  uint64_t next_sequence = 1;         // For the next checkpoint written.
  std::vector<std::string> refusals;  // One per refused checkpoint: file and fault.
  std::vector<uint64_t> refused_sequences;  // Their sequence numbers.
  // Whether one was refused for a cause other than damage (DATA_LOSS): other
  // flags, a newer format, a file it could not open. Fixed, it would load.
  bool refused_for_a_fixable_cause = false;
};

// Loads checkpoint `dir` (a path) into staged groups, verifying the
// manifest, the page size, and every data file's size, checksum and page
// records; DATA_LOSS or FAILED_PRECONDITION naming the file and what is
// wrong. Nothing is published. A group's file is read in up to
// pool->size() pieces at once (pool may be null: one piece). With `wanted`
// (may be null), only the groups it accepts are staged and their files read
// (the manifest is verified whole either way).
using ManifestGroupFilter = std::function<bool(const ManifestGroup&)>;
absl::StatusOr<std::vector<StagedGroup>> LoadCheckpoint(StateStore* store, const std::string& dir,
                                                        Manifest* manifest,
                                                        ThreadPool* pool = nullptr,
                                                        const ManifestGroupFilter& wanted = {});

// The checkpoints of `state_dir` that are complete (not being written), by
// sequence number, newest first, as paths.
absl::StatusOr<std::vector<std::string>> CompleteCheckpointsNewestFirst(
    const std::string& state_dir);

// Restores into the (empty) store the newest checkpoint of `state_dir` that
// loads whole, logging each refused one. Only a file system error reading
// the directory is an error; finding no usable checkpoint is an outcome
// with restored_id empty.
absl::StatusOr<RestoreOutcome> RestoreNewest(StateStore* store, const std::string& state_dir,
                                             ThreadPool* pool = nullptr);

}  // namespace optstate

#endif  // OPTSTATE_SERVER_DURABILITY_CHECKPOINT_READER_H_

// A group sealed for a move to another daemon (a client's Rebalance): once
// sealed, no step applies to it, so the state exported after the seal is the
// group's last; the copy imported on the new daemon is then the current one.
// Not kept in checkpoints: with --state_dir the daemon keeps its seals in
// <state_dir>/MOVES (durability/move_notes_file.h) and seals a restored copy
// again; without one a restarted daemon holds the group unsealed, and the
// next Rebalance tells the copies apart by their page steps. An import into
// the sealed group replaces its state and unseals it.
#ifndef OPTSTATE_SERVER_STATE_GROUP_MOVE_H_
#define OPTSTATE_SERVER_STATE_GROUP_MOVE_H_

#include <atomic>
#include <string>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace optstate {

// Thread-safe.
class GroupMove {
 public:
  // Set with every page mutex of the group held, so a step that takes its
  // page mutexes after the seal sees it. A second seal names the new
  // destination (a Rebalance finishing an earlier one's move).
  void Seal(std::string moved_to) ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    moved_to_ = std::move(moved_to);
    sealed_.store(true, std::memory_order_release);
  }
  // Steppable here again: an import made this daemon the group's home (a
  // Rebalance that moves it back, or finishes a move by copying it in place).
  void Unseal() ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    moved_to_.clear();
    sealed_.store(false, std::memory_order_release);
  }
  bool sealed() const { return sealed_.load(std::memory_order_acquire); }
  // The daemon it moves to, as the client named it ("" until sealed).
  std::string moved_to() const ABSL_LOCKS_EXCLUDED(mu_) {
    absl::MutexLock lock(&mu_);
    return moved_to_;
  }

 private:
  std::atomic<bool> sealed_{false};
  mutable absl::Mutex mu_;
  std::string moved_to_ ABSL_GUARDED_BY(mu_);
};

}  // namespace optstate

#endif  // OPTSTATE_SERVER_STATE_GROUP_MOVE_H_

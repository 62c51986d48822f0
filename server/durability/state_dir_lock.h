// One daemon per --state_dir: an exclusive flock on <state_dir>/LOCK, held
// for the daemon's life and released by the kernel when the process ends,
// however it ends (so a killed daemon never leaves it held).
//
// Two daemons writing one state_dir would number their checkpoints from the
// same scan, remove each other's unfinished ones and prune each other's
// complete ones; the lock refuses the second at start instead.
#ifndef OPTSTATE_SERVER_DURABILITY_STATE_DIR_LOCK_H_
#define OPTSTATE_SERVER_DURABILITY_STATE_DIR_LOCK_H_

#include <string>

#include "absl/status/statusor.h"
#include "server/durability/file_util.h"

namespace optstate {

inline constexpr char kStateDirLockName[] = "LOCK";

// Holds the lock until destroyed.
class StateDirLock {
 public:
  StateDirLock(StateDirLock&&) = default;
  // Takes the lock without waiting. FAILED_PRECONDITION naming the holder's
  // process id when another process (or another lock in this one) holds it;
  // FAILED_PRECONDITION when LOCK cannot be created for want of permission
  // or on a read-only file system, INTERNAL with the system's error
  // otherwise. The holder's pid is
  // written into LOCK for that message only: the flock, not the file's text,
  // is the lock. A LOCK this process may only read (another user's, or a
  // read-only state_dir) is locked all the same, without the pid.
  static absl::StatusOr<StateDirLock> Acquire(const std::string& state_dir);

  // OK while <state_dir>/LOCK is still the file this lock holds. The flock
  // is on the file, not its name: once LOCK is removed or replaced (the
  // state_dir too), another daemon can lock a new LOCK there, so the holder
  // must write nothing more; FAILED_PRECONDITION saying so.
  absl::Status StillHeld() const;

 private:
  StateDirLock(ScopedFd fd, std::string path) : fd_(std::move(fd)), path_(std::move(path)) {}
  // flock on `fd` (LOCK at `path`); the pid written when `writable`.
  static absl::StatusOr<StateDirLock> LockOrRefuse(ScopedFd fd, const std::string& state_dir,
                                                   const std::string& path, bool writable);
  ScopedFd fd_;
  std::string path_;  // <state_dir>/LOCK
};

}  // namespace optstate

#endif  // OPTSTATE_SERVER_DURABILITY_STATE_DIR_LOCK_H_

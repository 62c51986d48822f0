// The state_dir lock: flock(LOCK_EX | LOCK_NB) on <state_dir>/LOCK.
#include "server/durability/state_dir_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"

namespace optstate {

absl::StatusOr<StateDirLock> StateDirLock::Acquire(const std::string& state_dir) {
  const std::string path = absl::StrCat(state_dir, "/", kStateDirLockName);
  ScopedFd fd(open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644));
  const int open_error = errno;  // The read-only try below must not hide it.
  bool writable = true;
  if (fd.get() < 0 && (open_error == EACCES || open_error == EROFS)) {
    // A LOCK another user made, or a read-only state_dir (a restore to
    // inspect): flock needs only a descriptor; the pid is not written.
    ScopedFd read_only(open(path.c_str(), O_RDONLY | O_CLOEXEC));
    if (read_only.get() >= 0) {
      writable = false;
      return LockOrRefuse(std::move(read_only), state_dir, path, writable);
    }
  }
  if (fd.get() < 0) {
    // Permissions and a read-only mount are the operator's to fix, as for
    // every other file of the state_dir (file_util.h).
    const bool fixable = open_error == EACCES || open_error == EPERM || open_error == EROFS;
    const std::string message = absl::StrCat(
        "cannot open ", path, ": ", std::strerror(open_error),
        fixable ? " (give the daemon's user write access to --state_dir, or another --state_dir)"
                : "");
    return fixable ? absl::FailedPreconditionError(message) : absl::InternalError(message);
  }
  return LockOrRefuse(std::move(fd), state_dir, path, writable);
}

absl::StatusOr<StateDirLock> StateDirLock::LockOrRefuse(ScopedFd fd, const std::string& state_dir,
                                                        const std::string& path, bool writable) {
  if (flock(fd.get(), LOCK_EX | LOCK_NB) != 0) {
    if (errno != EWOULDBLOCK) {
      return absl::InternalError(absl::StrCat("cannot lock ", path, ": ", std::strerror(errno)));
    }
    char text[32] = {};
    const ssize_t n = pread(fd.get(), text, sizeof(text) - 1, 0);
    const std::string holder(absl::StripAsciiWhitespace(n > 0 ? std::string(text, n) : ""));
    return absl::FailedPreconditionError(absl::StrCat(
        "--state_dir=", state_dir, " is in use by another optstated",
        holder.empty() ? "" : absl::StrCat(" (pid ", holder, ")"), ", which holds ", path,
        "; two daemons writing one state_dir would remove each other's checkpoints: stop that "
        "daemon first, or give this one its own --state_dir"));
  }
  const std::string pid = absl::StrCat(getpid(), "\n");
  if (writable &&
      (ftruncate(fd.get(), 0) != 0 || pwrite(fd.get(), pid.data(), pid.size(), 0) < 0)) {
    return absl::InternalError(absl::StrCat("cannot write ", path, ": ", std::strerror(errno)));
  }
  return StateDirLock(std::move(fd), path);
}

absl::Status StateDirLock::StillHeld() const {
  struct stat held, named;
  if (fstat(fd_.get(), &held) != 0) {
    return absl::InternalError(absl::StrCat("cannot stat the held ", path_, ": ",
                                            std::strerror(errno)));
  }
  if (stat(path_.c_str(), &named) == 0 && named.st_dev == held.st_dev &&
      named.st_ino == held.st_ino) {
    return absl::OkStatus();
  }
  return absl::FailedPreconditionError(absl::StrCat(
      path_, " is no longer the lock file this daemon holds (it, or the state_dir, was removed "
      "or replaced while it ran), so another optstated may have locked the state_dir and be "
      "writing there: no checkpoint is written. Stop this daemon (its state since its last "
      "checkpoint is lost) or make sure no other uses the state_dir and restart it"));
}

}  // namespace optstate

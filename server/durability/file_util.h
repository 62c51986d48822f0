// The file operations a crash-safe checkpoint is made of (write all, fsync a
// file or a directory, rename, remove a tree), each failing with a status
// that names the path and the system's reason.
#ifndef OPTSTATE_SERVER_DURABILITY_FILE_UTIL_H_
#define OPTSTATE_SERVER_DURABILITY_FILE_UTIL_H_

#include <sys/uio.h>

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace optstate {

// An open file descriptor, closed when destroyed.
class ScopedFd {
 public:
  explicit ScopedFd(int fd = -1) : fd_(fd) {}
  ScopedFd(ScopedFd&& other) noexcept : fd_(other.fd_) { other.fd_ = -1; }
  ScopedFd& operator=(ScopedFd&&) = delete;
  ~ScopedFd();
  int get() const { return fd_; }

 private:
  int fd_;
};

// Creates (truncating) `path` for writing.
absl::StatusOr<ScopedFd> CreateFile(const std::string& path);
// Opens a regular file for reading; FAILED_PRECONDITION for anything else
// (a FIFO, a directory), without blocking on it.
absl::StatusOr<ScopedFd> OpenForReading(const std::string& path);
// Writes every byte of the pieces, retrying short writes.
absl::Status WriteAll(int fd, std::vector<iovec> pieces, const std::string& path);
// Reads exactly `n` bytes; DATA_LOSS naming the path when the file ends first.
absl::Status ReadExactly(int fd, void* data, size_t n, const std::string& path);
// The same from byte `offset` (pread: threads may share the descriptor).
absl::Status PreadExactly(int fd, void* data, size_t n, uint64_t offset, const std::string& path);
absl::Status SyncFile(int fd, const std::string& path);
// fsync of a directory: makes the names created, renamed or removed in it durable.
absl::Status SyncDirectory(const std::string& path);
absl::Status MakeDirectory(const std::string& path);
// mkdir -p.
absl::Status MakeDirectories(const std::string& path);
absl::Status Rename(const std::string& from, const std::string& to);
// Removes a directory and the files in it (one level: checkpoints have no
// subdirectories); OK when it does not exist.
absl::Status RemoveTree(const std::string& path);
// Names in `path` (not "." and ".."), unsorted.
absl::StatusOr<std::vector<std::string>> ListDirectory(const std::string& path);
// Size in bytes; NOT_FOUND when there is no such file.
absl::StatusOr<uint64_t> FileSize(const std::string& path);

}  // namespace optstate

#endif  // OPTSTATE_SERVER_DURABILITY_FILE_UTIL_H_

// POSIX calls with their errors turned into statuses.
#include "server/durability/file_util.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/str_cat.h"

namespace optstate {
namespace {

absl::Status Errno(absl::string_view what, const std::string& path) {
  const int e = errno;
  std::string message = absl::StrCat(what, " ", path, ": ", std::strerror(e));
  if (e == ENOENT) return absl::NotFoundError(message);
  if (e == ENOSPC || e == EDQUOT) return absl::ResourceExhaustedError(message);
  // The operator's to fix (permissions, a file system mounted read-only),
  // as a removed state_dir is.
  if (e == EACCES || e == EPERM || e == EROFS) return absl::FailedPreconditionError(message);
  return absl::InternalError(message);
}

// For what writes: a missing directory there is no missing thing a caller
// asked for (NOT_FOUND means a group to a checkpoint's caller), but a
// state_dir changed under the daemon.
absl::Status WriteErrno(absl::string_view what, const std::string& path) {
  const int e = errno;
  if (e != ENOENT) return Errno(what, path);
  return absl::FailedPreconditionError(
      absl::StrCat(what, " ", path, ": ", std::strerror(e),
                   " (was the state_dir, or part of it, removed while the daemon ran?)"));
}

}  // namespace

ScopedFd::~ScopedFd() {
  if (fd_ >= 0) close(fd_);
}

absl::StatusOr<ScopedFd> CreateFile(const std::string& path) {
  const int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return WriteErrno("cannot create", path);
  return ScopedFd(fd);
}

absl::StatusOr<ScopedFd> OpenForReading(const std::string& path) {
  // O_NONBLOCK: a FIFO put where a file was expected would block the open
  // (and the daemon's start) until something wrote to it.
  const int fd = open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK);
  if (fd < 0) return Errno("cannot open", path);
  ScopedFd file(fd);
  struct stat st;
  if (fstat(fd, &st) != 0) return Errno("cannot stat", path);
  if (!S_ISREG(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat(path, " is not a regular file"));
  }
  if (fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) & ~O_NONBLOCK) != 0) {
    return Errno("cannot set blocking reads on", path);
  }
  return file;
}

absl::Status WriteAll(int fd, std::vector<iovec> pieces, const std::string& path) {
  size_t first = 0;
  while (first < pieces.size()) {
    const int count = static_cast<int>(std::min<size_t>(pieces.size() - first, IOV_MAX));
    const ssize_t n = writev(fd, pieces.data() + first, count);
    if (n < 0) {
      if (errno == EINTR) continue;
      return WriteErrno("cannot write", path);
    }
    size_t left = static_cast<size_t>(n);
    while (first < pieces.size() && left >= pieces[first].iov_len) {
      left -= pieces[first].iov_len;
      ++first;
    }
    if (left > 0) {
      pieces[first].iov_base = static_cast<char*>(pieces[first].iov_base) + left;
      pieces[first].iov_len -= left;
    }
  }
  return absl::OkStatus();
}

absl::Status ReadExactly(int fd, void* data, size_t n, const std::string& path) {
  auto* p = static_cast<char*>(data);
  while (n > 0) {
    const ssize_t got = read(fd, p, n);
    if (got < 0) {
      if (errno == EINTR) continue;
      return Errno("cannot read", path);
    }
    if (got == 0) return absl::DataLossError(absl::StrCat(path, " ends early (truncated)"));
    p += got;
    n -= static_cast<size_t>(got);
  }
  return absl::OkStatus();
}

absl::Status PreadExactly(int fd, void* data, size_t n, uint64_t offset, const std::string& path) {
  auto* p = static_cast<char*>(data);
  while (n > 0) {
    const ssize_t got = pread(fd, p, n, static_cast<off_t>(offset));
    if (got < 0) {
      if (errno == EINTR) continue;
      return Errno("cannot read", path);
    }
    if (got == 0) return absl::DataLossError(absl::StrCat(path, " ends early (truncated)"));
    p += got;
    n -= static_cast<size_t>(got);
    offset += static_cast<uint64_t>(got);
  }
  return absl::OkStatus();
}

absl::Status SyncFile(int fd, const std::string& path) {
  if (fsync(fd) != 0) return WriteErrno("cannot fsync", path);
  return absl::OkStatus();
}

absl::Status SyncDirectory(const std::string& path) {
  const int fd = open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return WriteErrno("cannot open directory", path);
  ScopedFd closer(fd);
  if (fsync(fd) != 0) return Errno("cannot fsync directory", path);
  return absl::OkStatus();
}

absl::Status MakeDirectory(const std::string& path) {
  if (mkdir(path.c_str(), 0755) != 0) return WriteErrno("cannot create directory", path);
  return absl::OkStatus();
}

absl::Status MakeDirectories(const std::string& path) {
  for (size_t at = 1; at <= path.size(); ++at) {
    if (at != path.size() && path[at] != '/') continue;
    const std::string prefix = path.substr(0, at);
    if (mkdir(prefix.c_str(), 0755) != 0 && errno != EEXIST) {
      return Errno("cannot create directory", prefix);
    }
  }
  struct stat st;
  if (stat(path.c_str(), &st) != 0 || !S_ISDIR(st.st_mode)) {
    return absl::FailedPreconditionError(absl::StrCat(path, " is not a directory"));
  }
  return absl::OkStatus();
}

absl::Status Rename(const std::string& from, const std::string& to) {
  if (rename(from.c_str(), to.c_str()) != 0) return WriteErrno("cannot rename to " + to + ":", from);
  return absl::OkStatus();
}

absl::Status RemoveTree(const std::string& path) {
  absl::StatusOr<std::vector<std::string>> names = ListDirectory(path);
  if (absl::IsNotFound(names.status())) return absl::OkStatus();
  if (!names.ok()) return names.status();
  for (const std::string& name : *names) {
    const std::string file = path + "/" + name;
    if (unlink(file.c_str()) != 0 && errno != ENOENT) return Errno("cannot remove", file);
  }
  if (rmdir(path.c_str()) != 0 && errno != ENOENT) return Errno("cannot remove directory", path);
  return absl::OkStatus();
}

absl::StatusOr<std::vector<std::string>> ListDirectory(const std::string& path) {
  DIR* dir = opendir(path.c_str());
  if (dir == nullptr) return Errno("cannot list", path);
  std::vector<std::string> names;
  while (dirent* entry = readdir(dir)) {
    const std::string name = entry->d_name;
    if (name != "." && name != "..") names.push_back(name);
  }
  closedir(dir);
  return names;
}

absl::StatusOr<uint64_t> FileSize(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) return Errno("cannot stat", path);
  return static_cast<uint64_t>(st.st_size);
}

}  // namespace optstate

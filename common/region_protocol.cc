// sendmsg/recvmsg with one SCM_RIGHTS fd, and sealed memfds.
#include "common/region_protocol.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>

#include "absl/strings/str_cat.h"

namespace optstate::region_protocol {
namespace {

absl::Status Errno(absl::string_view what) {
  return absl::UnavailableError(absl::StrCat(what, ": ", std::strerror(errno)));
}

}  // namespace

absl::Status Send(int socket, const void* record, size_t bytes, int fd) {
  struct iovec iov;
  iov.iov_base = const_cast<void*>(record);
  iov.iov_len = bytes;
  struct msghdr msg;
  std::memset(&msg, 0, sizeof(msg));
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  alignas(struct cmsghdr) char control[CMSG_SPACE(sizeof(int))];
  if (fd >= 0) {
    std::memset(control, 0, sizeof(control));
    msg.msg_control = control;
    msg.msg_controllen = sizeof(control);
    struct cmsghdr* cmsg = CMSG_FIRSTHDR(&msg);
    cmsg->cmsg_level = SOL_SOCKET;
    cmsg->cmsg_type = SCM_RIGHTS;
    cmsg->cmsg_len = CMSG_LEN(sizeof(int));
    std::memcpy(CMSG_DATA(cmsg), &fd, sizeof(int));
  }
  for (;;) {
    const ssize_t sent = sendmsg(socket, &msg, MSG_NOSIGNAL);
    if (sent == static_cast<ssize_t>(bytes)) return absl::OkStatus();
    if (sent < 0 && errno == EINTR) continue;
    if (sent < 0) return Errno("region socket send");
    return absl::UnavailableError("region socket send: short write");
  }
}

absl::Status Receive(int socket, void* record, size_t bytes, int* fd) {
  if (fd != nullptr) *fd = -1;
  struct iovec iov;
  iov.iov_base = record;
  iov.iov_len = bytes;
  struct msghdr msg;
  std::memset(&msg, 0, sizeof(msg));
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  // Room for a few fds, so a sender attaching more is seen and refused
  // (their fds closed) rather than leaving them in a truncated message.
  alignas(struct cmsghdr) char control[CMSG_SPACE(8 * sizeof(int))];
  msg.msg_control = control;
  msg.msg_controllen = sizeof(control);
  ssize_t got;
  do {
    // MSG_TRUNC: a longer record's whole length is returned (SOCK_SEQPACKET),
    // so a refusal can say how long it was.
    got = recvmsg(socket, &msg, MSG_CMSG_CLOEXEC | MSG_TRUNC);
  } while (got < 0 && errno == EINTR);
  if (got < 0) return Errno("region socket receive");
  // Collect every fd that came, whatever else is wrong.
  int fds[8];
  int count = 0;
  for (struct cmsghdr* cmsg = CMSG_FIRSTHDR(&msg); cmsg != nullptr;
       cmsg = CMSG_NXTHDR(&msg, cmsg)) {
    if (cmsg->cmsg_level != SOL_SOCKET || cmsg->cmsg_type != SCM_RIGHTS) continue;
    const size_t n = (cmsg->cmsg_len - CMSG_LEN(0)) / sizeof(int);
    for (size_t i = 0; i < n && count < 8; ++i) {
      std::memcpy(&fds[count++], CMSG_DATA(cmsg) + i * sizeof(int), sizeof(int));
    }
  }
  auto close_all = [&] {
    for (int i = 0; i < count; ++i) close(fds[i]);
  };
  if (got == 0) {
    close_all();
    return absl::UnavailableError("closed");
  }
  if ((msg.msg_flags & (MSG_CTRUNC | MSG_TRUNC)) != 0 || count > 1 ||
      static_cast<size_t>(got) != bytes) {
    close_all();
    return absl::InvalidArgumentError(absl::StrCat(
        "a region socket record must be ", bytes, " bytes with at most one fd attached; got ", got,
        " bytes and ", count, (msg.msg_flags & MSG_CTRUNC) != 0 ? "+" : "", " fds"));
  }
  if (count == 1) {
    if (fd != nullptr) {
      *fd = fds[0];
    } else {
      close(fds[0]);
    }
  }
  return absl::OkStatus();
}

void SetStatus(const absl::Status& status, Reply* reply) {
  reply->code = static_cast<uint32_t>(status.code());
  std::memset(reply->message, 0, sizeof(reply->message));
  const absl::string_view text = status.message();
  // An OK status has no text (and may give a null data pointer).
  if (!text.empty()) {
    std::memcpy(reply->message, text.data(), std::min(text.size(), sizeof(reply->message) - 1));
  }
}

absl::Status StatusOf(const Reply& reply) {
  if (reply.code == 0) return absl::OkStatus();
  const size_t length = strnlen(reply.message, sizeof(reply.message));
  return absl::Status(static_cast<absl::StatusCode>(reply.code),
                      absl::string_view(reply.message, length));
}

absl::StatusOr<int> Connect(const std::string& path, Reply* hello) {
  sockaddr_un address;
  std::memset(&address, 0, sizeof(address));
  address.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof(address.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat("region socket path '", path, "' is too long"));
  }
  std::memcpy(address.sun_path, path.data(), path.size());
  const int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  if (fd < 0) return Errno("socket");
  if (connect(fd, reinterpret_cast<const sockaddr*>(&address), sizeof(address)) != 0) {
    absl::Status status = Errno(absl::StrCat("connect to region socket ", path));
    close(fd);
    return status;
  }
  absl::Status status = Receive(fd, hello, sizeof(*hello), nullptr);
  if (status.ok() && (hello->magic != kMagic || hello->op != static_cast<uint32_t>(Op::kHello))) {
    status = absl::UnavailableError(absl::StrCat(path, " is not an optstated region socket"));
  }
  if (!status.ok()) {
    close(fd);
    return absl::UnavailableError(status.message());
  }
  if (absl::Status refused = StatusOf(*hello); !refused.ok()) {
    close(fd);  // The daemon took no connection (its limit of them).
    return refused;
  }
  return fd;
}

absl::Status Authenticate(int socket, const std::string& token) {
  if (token.empty() || token.size() > kMaxTokenBytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("a token is 1 to ", kMaxTokenBytes, " bytes, got ", token.size()));
  }
  Request request;
  request.op = static_cast<uint32_t>(Op::kAuthenticate);
  request.region = token.size();
  if (absl::Status s = Send(socket, &request, sizeof(request)); !s.ok()) return s;
  if (absl::Status s = Send(socket, token.data(), token.size()); !s.ok()) return s;
  Reply reply;
  absl::Status status = Receive(socket, &reply, sizeof(reply), nullptr);
  if (!status.ok()) return absl::UnavailableError(status.message());
  return StatusOf(reply);
}

absl::StatusOr<Reply> Call(int socket, const Request& request, int fd) {
  if (absl::Status s = Send(socket, &request, sizeof(request), fd); !s.ok()) return s;
  Reply reply;
  absl::Status status = Receive(socket, &reply, sizeof(reply), nullptr);
  if (!status.ok()) return absl::UnavailableError(status.message());
  if (reply.magic != kMagic) return absl::UnavailableError("a region socket reply with bad magic");
  return reply;
}

absl::StatusOr<int> CreateSealedMemfd(const std::string& name, uint64_t bytes) {
  const int fd = memfd_create(name.c_str(), MFD_CLOEXEC | MFD_ALLOW_SEALING);
  if (fd < 0) return Errno("memfd_create");
  if (bytes > static_cast<uint64_t>(std::numeric_limits<off_t>::max()) ||
      ftruncate(fd, static_cast<off_t>(bytes)) != 0) {
    const int error =
        bytes > static_cast<uint64_t>(std::numeric_limits<off_t>::max()) ? EFBIG : errno;
    close(fd);
    return absl::ResourceExhaustedError(absl::StrCat(
        "this process could not make a shared-memory file of ", bytes,
        " bytes (memfd ftruncate: ", std::strerror(error), "); nothing was asked of the daemon"));
  }
  if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
    absl::Status status = Errno("F_ADD_SEALS");
    close(fd);
    return status;
  }
  return fd;
}

}  // namespace optstate::region_protocol

// The region socket's serving loop: poll over the listening socket and every
// connection; each record is answered at once (registration maps a file,
// which takes microseconds), so one thread serves all clients.
#include "server/regions/region_socket_server.h"

#include <fcntl.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <optional>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/region_protocol.h"
#include "server/base/log.h"

namespace optstate {
namespace {

namespace rp = region_protocol;

// Connections beyond this are answered RESOURCE_EXHAUSTED and closed as they
// come: at most 4096, and at most
// a quarter of the process's descriptor limit, so region clients cannot take
// the descriptors gRPC and checkpoints need.
size_t MaxConnections() {
  static const size_t limit = [] {
    rlimit fds;
    size_t quarter = 256;
    if (getrlimit(RLIMIT_NOFILE, &fds) == 0 && fds.rlim_cur != RLIM_INFINITY) {
      quarter = static_cast<size_t>(fds.rlim_cur / 4);
    } else if (getrlimit(RLIMIT_NOFILE, &fds) == 0) {
      quarter = 4096;
    }
    return std::max<size_t>(1, std::min<size_t>(4096, quarter));
  }();
  return limit;
}

absl::StatusOr<sockaddr_un> AddressOf(const std::string& path) {
  sockaddr_un address;
  std::memset(&address, 0, sizeof(address));
  address.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof(address.sun_path)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "--region_socket path '", path, "' must be 1 to ", sizeof(address.sun_path) - 1, " bytes"));
  }
  std::memcpy(address.sun_path, path.data(), path.size());
  return address;
}

// Removes a socket file nothing listens on any more.
absl::Status ClearStale(const std::string& path, const sockaddr_un& address) {
  struct stat st;
  if (lstat(path.c_str(), &st) != 0) return absl::OkStatus();
  if (!S_ISSOCK(st.st_mode)) {
    return absl::FailedPreconditionError(
        absl::StrCat("--region_socket path '", path, "' exists and is not a socket"));
  }
  const int probe = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  const bool live = probe >= 0 && connect(probe, reinterpret_cast<const sockaddr*>(&address),
                                          sizeof(address)) == 0;
  if (probe >= 0) close(probe);
  if (live) {
    return absl::UnavailableError(
        absl::StrCat("--region_socket '", path, "' is served by another process"));
  }
  unlink(path.c_str());
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<RegionSocketServer>> RegionSocketServer::Start(
    const std::string& path, unsigned mode, RegionRegistry* registry, const std::string& daemon_id,
    TokenCheck check_token, CredentialCheck still_valid) {
  absl::StatusOr<sockaddr_un> address = AddressOf(path);
  if (!address.ok()) return address.status();
  if (absl::Status s = ClearStale(path, *address); !s.ok()) return s;
  const int fd = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd < 0) return absl::UnavailableError(absl::StrCat("socket: ", std::strerror(errno)));
  if (bind(fd, reinterpret_cast<const sockaddr*>(&*address), sizeof(*address)) != 0 ||
      chmod(path.c_str(), mode) != 0 || listen(fd, 128) != 0) {
    absl::Status status = absl::UnavailableError(
        absl::StrCat("cannot serve --region_socket '", path, "': ", std::strerror(errno)));
    close(fd);
    unlink(path.c_str());
    return status;
  }
  const int wake = eventfd(0, EFD_CLOEXEC);
  if (wake < 0) {
    close(fd);
    unlink(path.c_str());
    return absl::UnavailableError(absl::StrCat("eventfd: ", std::strerror(errno)));
  }
  std::unique_ptr<RegionSocketServer> server(new RegionSocketServer(
      path, fd, wake, registry, daemon_id, std::move(check_token), std::move(still_valid)));
  server->thread_ = std::thread([s = server.get()] { s->Serve(); });
  return server;
}

RegionSocketServer::RegionSocketServer(std::string path, int listen_fd, int wake_fd,
                                       RegionRegistry* registry, std::string daemon_id,
                                       TokenCheck check_token, CredentialCheck still_valid)
    : path_(std::move(path)),
      listen_fd_(listen_fd),
      wake_fd_(wake_fd),
      registry_(registry),
      daemon_id_(std::move(daemon_id)),
      check_token_(std::move(check_token)),
      still_valid_(std::move(still_valid)) {}

void RegionSocketServer::Revalidate() {
  revalidate_.store(true);
  const uint64_t one = 1;
  if (write(wake_fd_, &one, sizeof(one)) < 0) Log(LogLevel::kError, "region socket: wake failed");
}

RegionSocketServer::~RegionSocketServer() {
  stopping_.store(true);
  const uint64_t one = 1;
  if (write(wake_fd_, &one, sizeof(one)) < 0) Log(LogLevel::kError, "region socket: wake failed");
  thread_.join();
  close(listen_fd_);
  close(wake_fd_);
  unlink(path_.c_str());
}

void RegionSocketServer::Serve() {
  std::vector<Connection> connections;
  std::vector<pollfd> polled;
  auto end_connection = [&](size_t i) {
    registry_->CloseSession(connections[i].key);
    close(connections[i].fd);
    connections[i] = std::move(connections.back());
    connections.pop_back();
  };
  for (;;) {
    // A connection that has not authenticated within kAuthenticateWithin
    // (where the daemon has tenants) is ended: ones that never do would
    // otherwise hold the connection slots of every tenant's trainers.
    const auto now = std::chrono::steady_clock::now();
    auto first_due = std::chrono::steady_clock::time_point::max();
    for (size_t i = connections.size(); i-- > 0;) {
      if (connections[i].authenticated) continue;
      const auto due = connections[i].opened + kAuthenticateWithin;
      if (due <= now) {
        end_connection(i);
      } else {
        first_due = std::min(first_due, due);
      }
    }
    const int timeout_ms =
        first_due == std::chrono::steady_clock::time_point::max()
            ? -1
            : static_cast<int>(
                  std::chrono::duration_cast<std::chrono::milliseconds>(first_due - now).count()) +
                  1;
    polled.clear();
    polled.push_back({wake_fd_, POLLIN, 0});
    polled.push_back({listen_fd_, POLLIN, 0});
    for (const Connection& c : connections) polled.push_back({c.fd, POLLIN, 0});
    if (poll(polled.data(), polled.size(), timeout_ms) < 0) {
      if (errno == EINTR) continue;
      Log(LogLevel::kError, "region socket: poll: ", std::strerror(errno));
      break;
    }
    if (polled[0].revents != 0) {
      uint64_t woken = 0;
      if (read(wake_fd_, &woken, sizeof(woken)) < 0 && errno != EAGAIN) {
        Log(LogLevel::kError, "region socket: wake read: ", std::strerror(errno));
      }
      if (stopping_.load()) break;
      if (revalidate_.exchange(false) && still_valid_ != nullptr) {
        for (size_t i = connections.size(); i-- > 0;) {
          const Connection& c = connections[i];
          if (!c.authenticated || c.holder.credential.empty() ||
              still_valid_(c.holder.credential, c.holder.tenant)) {
            continue;
          }
          Log(LogLevel::kInfo, "region socket: a connection of tenant '", c.holder.tenant,
              "' ended: its token was revoked (its regions go with it)");
          end_connection(i);
        }
      }
      continue;  // The polled indices no longer match the connections.
    }
    // Connections first (their indices shift as ones end), newest last.
    for (size_t p = polled.size(); p-- > 2;) {
      if (polled[p].revents == 0) continue;
      const size_t i = p - 2;
      if (connections[i].token_bytes != 0) {
        if (!Authenticate(connections[i])) end_connection(i);
        continue;
      }
      rp::Request request;
      int fd = -1;
      absl::Status received = rp::Receive(connections[i].fd, &request, sizeof(request), &fd);
      if (!received.ok() && received.code() == absl::StatusCode::kUnavailable) {
        end_connection(i);  // Closed: its regions go.
        continue;
      }
      if (received.ok() && request.magic == rp::kMagic &&
          request.op == static_cast<uint32_t>(rp::Op::kAuthenticate) && request.region >= 1 &&
          request.region <= rp::kMaxTokenBytes) {
        if (fd >= 0) close(fd);
        connections[i].token_bytes = request.region;  // Answered once the token comes.
        continue;
      }
      rp::Reply reply;
      reply.op = request.op;
      std::memcpy(reply.daemon_id, daemon_id_.data(),
                  std::min(daemon_id_.size(), sizeof(reply.daemon_id)));
      std::memcpy(reply.session_key, connections[i].key.data(), sizeof(reply.session_key));
      absl::Status status = received;
      if (status.ok() && request.magic != rp::kMagic) {
        status = absl::InvalidArgumentError("not a region socket record (bad magic)");
      } else if (status.ok() && request.op == static_cast<uint32_t>(rp::Op::kAuthenticate)) {
        status = absl::InvalidArgumentError(absl::StrCat(
            "kAuthenticate needs the token's length, 1 to ", rp::kMaxTokenBytes, " bytes"));
      } else if (status.ok() && request.op == static_cast<uint32_t>(rp::Op::kRegister) &&
                 !connections[i].authenticated) {
        status = absl::UnauthenticatedError(
            "this daemon has tenants: authenticate the connection with its token (kAuthenticate) "
            "before registering regions");
      } else if (status.ok() && request.op == static_cast<uint32_t>(rp::Op::kRegister)) {
        if (fd < 0) {
          status = absl::InvalidArgumentError("kRegister needs a memfd attached (SCM_RIGHTS)");
        } else {
          absl::StatusOr<std::shared_ptr<const MappedRegion>> region =
              registry_->Register(connections[i].key, fd);
          fd = -1;  // Register closed it.
          status = region.status();
          if (region.ok()) {
            reply.region = (*region)->id();
            reply.bytes = (*region)->bytes();
          }
        }
      } else if (status.ok() && request.op == static_cast<uint32_t>(rp::Op::kUnregister)) {
        status = registry_->Unregister(connections[i].key, request.region);
      } else if (status.ok()) {
        status = absl::InvalidArgumentError(absl::StrCat("unknown region socket op ", request.op));
      }
      if (fd >= 0) close(fd);
      if (!status.ok()) registry_->CountRefusal(status.code());
      rp::SetStatus(status, &reply);
      if (!rp::Send(connections[i].fd, &reply, sizeof(reply)).ok()) end_connection(i);
    }
    if (polled[1].revents != 0) {
      const int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC);
      if (fd < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR) {
        // Out of descriptors (EMFILE, ENFILE) or memory: the listening socket
        // stays readable, so without a pause this loop would spin.
        // Logged at most once a second, with how many were left out.
        const int error = errno;
        if (const std::optional<uint64_t> left_out = accept_failures_logged_.Take()) {
          Log(LogLevel::kWarning, "region socket: accept failed: ", std::strerror(error),
              "; refusing connections for 100 ms",
              *left_out == 0 ? "" : absl::StrCat(" (", *left_out, " more such since the last)"));
        }
        absl::SleepFor(absl::Milliseconds(100));
      } else if (fd >= 0 && connections.size() >= MaxConnections()) {
        // Said, not only closed: the client names the limit instead of
        // guessing at an unreachable socket.
        rp::Reply refusal;
        refusal.op = static_cast<uint32_t>(rp::Op::kHello);
        rp::SetStatus(absl::ResourceExhaustedError(absl::StrCat(
                          "the daemon's region socket holds ", connections.size(),
                          " connections, as many as it takes; step over the wire, or retry once "
                          "other clients have gone")),
                      &refusal);
        registry_->CountRefusal(absl::StatusCode::kResourceExhausted);
        (void)rp::Send(fd, &refusal, sizeof(refusal));
        close(fd);
      } else if (fd >= 0) {
        // Replies are small and clients wait for each; a client that stops
        // reading fills its buffer and is dropped rather than block us.
        const int flags = fcntl(fd, F_GETFL);
        fcntl(fd, F_SETFL, flags | O_NONBLOCK);
        // With tokens, the session belongs to no tenant until authenticated.
        Connection c{fd,
                     registry_->OpenSession(check_token_ ? std::string(1, '\0') : ""),
                     check_token_ == nullptr,
                     0,
                     std::chrono::steady_clock::now(),
                     {}};
        rp::Reply hello;
        hello.op = static_cast<uint32_t>(rp::Op::kHello);
        std::memcpy(hello.daemon_id, daemon_id_.data(),
                    std::min(daemon_id_.size(), sizeof(hello.daemon_id)));
        std::memcpy(hello.session_key, c.key.data(), sizeof(hello.session_key));
        if (rp::Send(fd, &hello, sizeof(hello)).ok()) {
          connections.push_back(std::move(c));
        } else {
          registry_->CloseSession(c.key);
          close(fd);
        }
      }
    }
  }
  for (size_t i = connections.size(); i-- > 0;) end_connection(i);
}

bool RegionSocketServer::Authenticate(Connection& connection) {
  std::string token(connection.token_bytes, '\0');
  connection.token_bytes = 0;
  int fd = -1;
  absl::Status status = rp::Receive(connection.fd, token.data(), token.size(), &fd);
  if (fd >= 0) close(fd);
  if (!status.ok() && status.code() == absl::StatusCode::kUnavailable) return false;
  if (status.ok() && check_token_ != nullptr) {
    absl::StatusOr<TokenHolder> holder = check_token_(token);
    status = holder.status();
    if (holder.ok()) status = registry_->SetSessionTenant(connection.key, holder->tenant);
    if (status.ok()) {
      connection.authenticated = true;
      connection.holder = *std::move(holder);
    }
  }
  std::fill(token.begin(), token.end(), '\0');
  if (!status.ok()) registry_->CountRefusal(status.code());
  rp::Reply reply;
  reply.op = static_cast<uint32_t>(rp::Op::kAuthenticate);
  std::memcpy(reply.daemon_id, daemon_id_.data(), std::min(daemon_id_.size(), sizeof(reply.daemon_id)));
  std::memcpy(reply.session_key, connection.key.data(), sizeof(reply.session_key));
  rp::SetStatus(status, &reply);
  return rp::Send(connection.fd, &reply, sizeof(reply)).ok();
}

}  // namespace optstate

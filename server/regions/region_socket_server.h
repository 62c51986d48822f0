// The daemon's region socket: a SOCK_SEQPACKET Unix socket on which clients
// on this host pass sealed memfds (SCM_RIGHTS) to register them as regions
// (common/region_protocol.h). One thread serves every connection.
#ifndef OPTSTATE_SERVER_REGIONS_REGION_SOCKET_SERVER_H_
#define OPTSTATE_SERVER_REGIONS_REGION_SOCKET_SERVER_H_

#include <atomic>
#include <chrono>
#include <functional>
#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "server/base/log_limiter.h"
#include "server/regions/region_registry.h"

namespace optstate {

class RegionSocketServer {
 public:
  // Who a token names: its tenant, and a credential (opaque here: the
  // token's digest) that CredentialCheck asks about later.
  struct TokenHolder {
    std::string tenant;
    std::string credential;
  };
  // The holder of a token, or why it names none (UNAUTHENTICATED).
  using TokenCheck = std::function<absl::StatusOr<TokenHolder>(const std::string& token)>;
  // Whether a credential TokenCheck gave still names `tenant` (its token was
  // not revoked since).
  using CredentialCheck =
      std::function<bool(const std::string& credential, const std::string& tenant)>;

  // Binds `path` (a stale socket file there, one nothing listens on, is
  // replaced; UNAVAILABLE when a live one is, FAILED_PRECONDITION when the
  // path is something else), sets its permission bits to `mode` (who may
  // register regions), and serves it. `registry` must outlive the server.
  // `check_token` null: connections are sessions of tenant "" (the socket
  // carries no credentials beyond its file permissions; kAuthenticate is
  // answered OK and ignored). Else a connection registers nothing until it
  // has authenticated (kAuthenticate) with a token `check_token` accepts,
  // and its session is that token's tenant's. `still_valid` (with
  // check_token) is asked of every authenticated connection after
  // Revalidate.
  static absl::StatusOr<std::unique_ptr<RegionSocketServer>> Start(
      const std::string& path, unsigned mode, RegionRegistry* registry,
      const std::string& daemon_id, TokenCheck check_token = nullptr,
      CredentialCheck still_valid = nullptr);
  // Stops serving, closes every connection (their sessions end) and removes
  // the socket file.
  ~RegionSocketServer();

  const std::string& path() const { return path_; }

  // Ends, soon after (on the serving thread), every connection whose
  // credential `still_valid` no longer takes: a token revoked from the
  // tokens file (SIGHUP) takes its regions and their room with it, as its
  // gRPC calls are refused from then on. Thread-safe.
  void Revalidate();

 private:
  RegionSocketServer(std::string path, int listen_fd, int wake_fd, RegionRegistry* registry,
                     std::string daemon_id, TokenCheck check_token, CredentialCheck still_valid);
  struct Connection {
    int fd;
    std::string key;
    bool authenticated = false;  // Always true without check_token_.
    uint64_t token_bytes = 0;    // After kAuthenticate: the next record is the token.
    // A connection not authenticated in time is ended (a steady clock: a
    // step of the wall clock ends none early).
    std::chrono::steady_clock::time_point opened;
    TokenHolder holder;  // Once authenticated with a token.
  };
  // Where the daemon has tenants, a connection must authenticate this soon.
  static constexpr std::chrono::seconds kAuthenticateWithin{10};
  void Serve();
  // Reads the token record kAuthenticate announced, sets the session's
  // tenant when check_token_ takes it, and answers; false when the
  // connection has failed (then it is to be ended).
  bool Authenticate(Connection& connection);

  const std::string path_;
  const int listen_fd_;
  const int wake_fd_;  // An eventfd; written to stop Serve.
  RegionRegistry* const registry_;
  const std::string daemon_id_;
  const TokenCheck check_token_;
  const CredentialCheck still_valid_;
  // Set by the destructor (stop) and Revalidate, then wake_fd_ written.
  std::atomic<bool> stopping_{false};
  std::atomic<bool> revalidate_{false};
  LogLimiter accept_failures_logged_;  // Out of descriptors: a line a second.
  std::thread thread_;
};

}  // namespace optstate

#endif  // OPTSTATE_SERVER_REGIONS_REGION_SOCKET_SERVER_H_

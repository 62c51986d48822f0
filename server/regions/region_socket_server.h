// The daemon's region socket: a SOCK_SEQPACKET Unix socket on which clients
// on this host pass sealed memfds (SCM_RIGHTS) to register them as regions
// (common/region_protocol.h). One thread serves every connection.
#ifndef OPTSTATE_SERVER_REGIONS_REGION_SOCKET_SERVER_H_
#define OPTSTATE_SERVER_REGIONS_REGION_SOCKET_SERVER_H_

#include <memory>
#include <string>
#include <thread>

#include "absl/status/statusor.h"
#include "server/regions/region_registry.h"

namespace optstate {

class RegionSocketServer {
 public:
  // Binds `path` (a stale socket file there, one nothing listens on, is
  // replaced; UNAVAILABLE when a live one is, FAILED_PRECONDITION when the
  // path is something else), sets its permission bits to `mode` (who may
  // register regions), and serves it. `registry` must outlive the server.
  // Connections are sessions of tenant "" (the socket carries no
  // credentials beyond its file permissions).
  static absl::StatusOr<std::unique_ptr<RegionSocketServer>> Start(const std::string& path,
                                                                   unsigned mode,
                                                                   RegionRegistry* registry,
                                                                   const std::string& daemon_id);
  // Stops serving, closes every connection (their sessions end) and removes
  // the socket file.
  ~RegionSocketServer();

  const std::string& path() const { return path_; }

 private:
  RegionSocketServer(std::string path, int listen_fd, int wake_fd, RegionRegistry* registry,
                     std::string daemon_id);
  void Serve();

  const std::string path_;
  const int listen_fd_;
  const int wake_fd_;  // An eventfd; written to stop Serve.
  RegionRegistry* const registry_;
  const std::string daemon_id_;
  std::thread thread_;
};

}  // namespace optstate

#endif  // OPTSTATE_SERVER_REGIONS_REGION_SOCKET_SERVER_H_

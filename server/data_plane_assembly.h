// The same-host data plane's parts in the daemon: the region registry, the
// region socket and the DataPlane service that advertises it.
#ifndef OPTSTATE_SERVER_DATA_PLANE_ASSEMBLY_H_
#define OPTSTATE_SERVER_DATA_PLANE_ASSEMBLY_H_

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "grpcpp/impl/codegen/service_type.h"
#include "server/regions/region_registry.h"

namespace optstate {

class Authenticator;
class DataPlaneService;
class RegionSocketServer;

// Permission bits of the daemon's sockets (the region socket, a unix:
// listen socket) unless --socket_mode says otherwise: owner and group.
inline constexpr unsigned kDefaultSocketMode = 0660;

struct DataPlaneOptions {
  // "" (default): a socket next to a loopback or unix: listen address
  // (unix:/p -> /p.regions; 127.0.0.1:PORT -> /tmp/optstated-PORT.regions),
  // none otherwise; "none": no region socket; else the socket's path.
  std::string region_socket;
  unsigned socket_mode = kDefaultSocketMode;  // Of the region socket (who may register).
  RegionLimits limits;
};

// Not thread-safe to set up; the parts it hands out are.
class DataPlaneAssembly {
 public:
  // `authenticator` (may be null; else must outlive the assembly): who may
  // call GetDataPlane and register regions, and for which tenant.
  explicit DataPlaneAssembly(const DataPlaneOptions& options,
                             const Authenticator* authenticator = nullptr);
  ~DataPlaneAssembly();

  // Registered with the gRPC server before it starts.
  grpc::Service* service();
  // The regions Step chunks may name; null with --region_socket=none (with
  // no socket started it holds no region: every lookup is NOT_FOUND).
  RegionRegistry* registry() const { return registry_.get(); }

  // Starts the region socket for a server listening on `listen` at `port`
  // (no-op when none is offered). UNAVAILABLE / FAILED_PRECONDITION as
  // RegionSocketServer::Start.
  absl::Status StartSocket(const std::string& listen, int port);
  // Closes the region socket (every session ends, its regions unmapped once
  // unused). Idempotent.
  void StopSocket();
  // Ends the region socket connections whose token was revoked (after the
  // tokens file was reloaded).
  void RevalidateRegionConnections();

  // The region socket path chosen for `listen` at `port`; empty for none.
  static std::string SocketPathFor(const std::string& option, const std::string& listen, int port);

 private:
  const DataPlaneOptions options_;
  const std::string daemon_id_;
  const Authenticator* const authenticator_;
  std::unique_ptr<RegionRegistry> registry_;
  std::unique_ptr<DataPlaneService> service_;
  std::unique_ptr<RegionSocketServer> socket_;
};

}  // namespace optstate

#endif  // OPTSTATE_SERVER_DATA_PLANE_ASSEMBLY_H_

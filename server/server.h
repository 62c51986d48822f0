// An optstated server assembled from options: worker pool, backend, state
// store, step engine and the gRPC service with reflection and health. Used by
// main() and by tests that want a server in-process.
#ifndef OPTSTATE_SERVER_SERVER_H_
#define OPTSTATE_SERVER_SERVER_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "server/backend_factory.h"
#include "server/data_plane_assembly.h"
#include "server/engine/step_engine.h"

namespace optstate {

struct ServerOptions {
  std::string listen = "127.0.0.1:50051";  // Port 0 picks a free port.
  int threads = 0;                         // 0: one per hardware thread.
  uint64_t max_host_bytes = 0;             // 0: 80% of physical memory.
  int max_message_bytes = 64 << 20;        // Largest request or reply.
  uint64_t page_elements = 256 * 1024;     // Exactly-once granularity.
  BackendOptions backend;
  // The same-host shared-memory data plane (region socket, limits).
  DataPlaneOptions data_plane;
  // Permission bits of a unix: listen socket (who may connect); 0 leaves
  // them as the umask made them.
  unsigned listen_socket_mode = 0660;
};

// Thread-safe.
class Server {
 public:
  // Builds everything and starts serving; INVALID_ARGUMENT for bad options,
  // UNAVAILABLE when the address cannot be bound, FAILED_PRECONDITION when
  // the backend asked for cannot be used.
  static absl::StatusOr<std::unique_ptr<Server>> Start(const ServerOptions& options);
  // Shuts down (waiting up to 5 s for in-flight calls) if still running.
  ~Server();

  // The bound port (useful when listening on port 0).
  int port() const { return port_; }
  const std::string& backend_name() const;
  const StepEngine& engine() const;  // For tests that inspect state.

  // Stops accepting calls, lets in-flight calls finish for up to `grace`,
  // cancels the rest, then drains the worker pool. Idempotent; a concurrent
  // second call returns when the first has finished.
  void Shutdown(absl::Duration grace);
  // Blocks until Shutdown has completed.
  void Wait();

 private:
  struct Parts;
  explicit Server(std::unique_ptr<Parts> parts, int port);

  std::unique_ptr<Parts> parts_;
  int port_;
};

}  // namespace optstate

#endif  // OPTSTATE_SERVER_SERVER_H_

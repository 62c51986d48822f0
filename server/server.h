// An optstated server assembled from options: worker pool, backend, state
// store, step engine and the gRPC service with reflection and health. Used by
// main() and by tests that want a server in-process.
#ifndef OPTSTATE_SERVER_SERVER_H_
#define OPTSTATE_SERVER_SERVER_H_

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "optstate/message_limits.h"
#include "server/auth/authenticator.h"
#include "server/backend_factory.h"
#include "server/data_plane_assembly.h"
#include "server/durability/checkpointer.h"
#include "server/engine/step_engine.h"
#include "server/listen_credentials.h"

namespace optstate {

struct ServerOptions {
  std::string listen = "127.0.0.1:50051";         // Port 0 picks a free port.
  int threads = 0;                                // 0: one per hardware thread.
  uint64_t max_host_bytes = 0;  // 0: 80% of memory, or of the cgroup's limit where lower.
  int max_message_bytes = 64 << 20;               // Largest request or reply.
  // Most memory gRPC may hold for messages on their way in and out (a
  // grpc::ResourceQuota): past it new streams get smaller windows, and when
  // it is used up gRPC cancels streams ("Buffers full"), so a client holding
  // many half-sent messages (before any token is checked) cannot take the
  // daemon's memory. 0: a tenth of the memory this process may use, at
  // least 1 GiB.
  uint64_t grpc_buffer_bytes = 0;
  uint64_t page_elements = kDefaultPageElements;  // Exactly-once granularity.
  // A Step or RegisterGroup stream with nothing read, applied or written for
  // this long is ended with UNAVAILABLE; zero or infinite: never.
  absl::Duration stream_idle_timeout = absl::Minutes(10);
  // The heap is looked at this often and its free memory given back when it
  // grew by more than heap_trim_slack_bytes or its use fell (HeapTrimPolicy),
  // once no stream has been open for half of it (HeapTrimmer), and always
  // soon after a group is deleted; zero or infinite: only then.
  absl::Duration heap_trim_interval = absl::Seconds(10);
  uint64_t heap_trim_slack_bytes = 64ull << 20;
  BackendOptions backend;
  // The CPU AdamW kernel's path: "auto" (the widest this CPU runs), or
  // "avx512", "avx2" or "scalar", which this CPU must run. Every path gives
  // the same bits. Process-wide: the last server started sets it.
  std::string cpu_kernel = "auto";
  // Durability (docs/durability.md). Empty state_dir: no checkpoints. The
  // rest default to the Checkpointer's own.
  std::string state_dir;
  absl::Duration checkpoint_interval = CheckpointerOptions{}.interval;  // Zero: no timer.
  int checkpoints_to_keep = CheckpointerOptions{}.keep;
  bool require_state = false;  // Refuse to start without a usable checkpoint.
  // The writer's memory bound (at least a page).
  uint64_t checkpoint_buffer_bytes = CheckpointerOptions{}.buffer_bytes;
  // The same-host shared-memory data plane (region socket, limits).
  DataPlaneOptions data_plane;
  // Permission bits of a unix: listen socket (who may connect; 0000: only
  // root).
  unsigned listen_socket_mode = kDefaultSocketMode;
  // Prometheus metrics on /metrics over HTTP at IP:PORT (port 0 picks one);
  // empty: none, and nothing is measured (docs/operations.md, "Metrics").
  std::string metrics_listen;
  // gRPC server reflection (grpcurl list/describe), which needs no token.
  bool reflection = true;
  // Security (docs/security.md): TLS on `listen`, the tokens file and the
  // tenants' default quotas; none set: plaintext, one tenant "".
  TlsOptions tls;
  AuthOptions auth;
  int tenant_max_streams = 0;  // Step streams one tenant may hold open; 0: no limit.
  // Jobs (docs/jobs.md): a group's lease lasts this long after its holder's
  // last call; positive.
  absl::Duration lease_term = absl::Seconds(60);
  // Called once, right before the server starts to accept calls (after the
  // restore): the moment from which a shutdown has state to save.
  std::function<void()> before_serving;
  // Called once, from a gRPC thread, if gRPC's listener stops accepting for
  // good (gRPC 1.51 gives up on it when accept fails with EMFILE, the
  // descriptor limit reached): from then on only the connections already
  // made are served. `reason` is gRPC's message.
  std::function<void(const std::string& reason)> on_listener_failed;
};

// Thread-safe.
class Server {
 public:
  // Builds everything, restores the newest complete checkpoint of state_dir
  // (if any), and starts serving; INVALID_ARGUMENT for bad options,
  // UNAVAILABLE when the address cannot be bound, FAILED_PRECONDITION when
  // the backend asked for cannot be used or require_state finds no usable
  // checkpoint; UNAVAILABLE naming metrics_listen when that cannot be bound.
  static absl::StatusOr<std::unique_ptr<Server>> Start(const ServerOptions& options);
  // Shuts down (waiting up to 5 s for in-flight calls) if still running.
  ~Server();

  // The bound port (useful when listening on port 0).
  int port() const { return port_; }
  // The metrics endpoint's port; 0 without metrics_listen.
  int metrics_port() const;
  const StepEngine& engine() const;  // For tests that inspect state.

  // Reads the tokens file again (SIGHUP): Authenticator::Reload. A bad file
  // keeps the previous one and returns why.
  absl::Status ReloadTokens();

  // Stops accepting calls and new steps at once, and ends every open stream
  // with UNAVAILABLE ("shutting down") as soon as the messages already being
  // applied are answered (idle streams end at once); waits up to `grace` for
  // that and for unary calls, cancels what is left, drains the worker pool,
  // then (with state_dir) writes a final checkpoint. Idempotent; a concurrent
  // second call returns when the first has finished. The final checkpoint's
  // failure (the state since the last checkpoint is not saved), else OK.
  absl::Status Shutdown(absl::Duration grace);
  // Blocks until Shutdown has completed.
  void Wait();

 private:
  struct Parts;
  explicit Server(std::unique_ptr<Parts> parts, int port);
  // Makes the call and Step-stream measurements and serves them, with the
  // daemon's other metrics, on `listen`.
  static absl::Status StartMetrics(const std::string& listen, Parts& parts);

  std::unique_ptr<Parts> parts_;
  int port_;
};

}  // namespace optstate

#endif  // OPTSTATE_SERVER_SERVER_H_

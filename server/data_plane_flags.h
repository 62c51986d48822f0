// optstated's flags for the same-host data plane and unix: sockets, kept
// apart from optstated_main.cc so the daemon's other flags stay readable.
#ifndef OPTSTATE_SERVER_DATA_PLANE_FLAGS_H_
#define OPTSTATE_SERVER_DATA_PLANE_FLAGS_H_

#include "absl/status/status.h"
#include "server/server.h"

namespace optstate {

// Sets options->data_plane and options->listen_socket_mode from the flags;
// INVALID_ARGUMENT for a --socket_mode that is not octal permission bits.
absl::Status DataPlaneOptionsFromFlags(ServerOptions* options);

}  // namespace optstate

#endif  // OPTSTATE_SERVER_DATA_PLANE_FLAGS_H_

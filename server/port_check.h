// Whether a listen address's port is free, asked before the restore (which
// can take minutes) rather than found when the server binds after it.
#ifndef OPTSTATE_SERVER_PORT_CHECK_H_
#define OPTSTATE_SERVER_PORT_CHECK_H_

#include <string>

#include "absl/status/status.h"

namespace optstate {

// Binds a socket to the addresses `listen` (HOST:PORT, as --listen and
// --metrics_listen take it) resolves to, as the server will, and closes it.
// UNAVAILABLE naming `flag` when none binds because its port is in use or
// it is not this host's (the server serves when any binds); OK for unix:
// paths, port 0 and anything this cannot tell (the server's own bind
// decides those).
absl::Status CheckPortFree(const std::string& flag, const std::string& listen);

}  // namespace optstate

#endif  // OPTSTATE_SERVER_PORT_CHECK_H_

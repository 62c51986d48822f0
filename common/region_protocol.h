// The region socket's messages (same-host data plane): fixed-size records
// over a SOCK_SEQPACKET Unix socket, a memfd riding along with SCM_RIGHTS.
// Shared by the daemon (server/regions/) and the client; no gRPC.
#ifndef OPTSTATE_COMMON_REGION_PROTOCOL_H_
#define OPTSTATE_COMMON_REGION_PROTOCOL_H_

#include <cstddef>
#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"

namespace optstate::region_protocol {

// The protocol, one record each way at a time:
// 1. The client connects; the daemon sends a Reply with op kHello, its
//    daemon_id (the bytes DataPlane.GetDataPlane reports) and the session
//    key of this connection.
// 2. kRegister with one memfd attached: the daemon checks its seals
//    (F_SEAL_SHRINK required), maps it once, and answers the region's id and
//    size. The fd is the client's to close; the daemon keeps the mapping.
// 3. kUnregister names a region id: the daemon forgets it; the mapping goes
//    once no step in flight uses it.
// 4. The connection closing unregisters every region of its session.
// 5. kAuthenticate (a daemon with tenants needs it before kRegister): the
//    Request's `region` holds the token's length (1 to kMaxTokenBytes) and
//    the next record is the token itself, those bytes exactly; the daemon
//    answers once, after the token: OK (the session is the token's
//    tenant's from now on; only before any region is registered) or
//    UNAUTHENTICATED. A daemon without tenants answers OK and ignores it.
inline constexpr uint32_t kMagic = 0x4f535247;  // "OSRG"
inline constexpr size_t kKeyBytes = 16;
inline constexpr size_t kMessageBytes = 240;
inline constexpr size_t kMaxTokenBytes = 4096;

enum class Op : uint32_t { kHello = 1, kRegister = 2, kUnregister = 3, kAuthenticate = 4 };

struct Request {
  uint32_t magic = kMagic;
  uint32_t op = 0;      // Op.
  uint64_t region = 0;  // kUnregister: the region's id.
};

struct Reply {
  uint32_t magic = kMagic;
  uint32_t op = 0;
  uint32_t code = 0;  // absl::StatusCode; 0 is OK.
  uint32_t reserved = 0;
  uint64_t region = 0;  // kRegister: the new region's id.
  uint64_t bytes = 0;   // kRegister: its size, as mapped.
  unsigned char daemon_id[kKeyBytes] = {};
  unsigned char session_key[kKeyBytes] = {};
  char message[kMessageBytes] = {};  // NUL-terminated; what to fix when code != 0.
};

// Sends one record, with `fd` attached when it is >= 0. UNAVAILABLE with
// errno's text when the socket fails.
absl::Status Send(int socket, const void* record, size_t bytes, int fd = -1);

// Receives one record of exactly `bytes` into `record`; `fd` (may be null:
// then any fd received is closed) gets an attached fd or -1. An attached fd
// beyond the first, or a truncated control message, closes what came and
// fails with INVALID_ARGUMENT; a record of another size also. UNAVAILABLE
// when the peer has closed (message "closed") or the socket fails.
absl::Status Receive(int socket, void* record, size_t bytes, int* fd);

// `status` as a Reply's code and message.
void SetStatus(const absl::Status& status, Reply* reply);
// A Reply's code and message as a status.
absl::Status StatusOf(const Reply& reply);

// A client's side: connects to the region socket at `path` and reads the
// daemon's greeting into `hello`. UNAVAILABLE when nothing serves there; the
// greeting's refusal (RESOURCE_EXHAUSTED: the daemon holds as many
// connections as it takes) when it carries one.
absl::StatusOr<int> Connect(const std::string& path, Reply* hello);
// Sends `request` (with `fd` attached when >= 0) and waits for the reply;
// UNAVAILABLE when the connection fails, else the reply (its code may say
// the request was refused: StatusOf).
absl::StatusOr<Reply> Call(int socket, const Request& request, int fd = -1);

// Authenticates the connection with `token` (step 5): the daemon's answer;
// UNAVAILABLE when the connection fails, INVALID_ARGUMENT for a token of
// more than kMaxTokenBytes or none.
absl::Status Authenticate(int socket, const std::string& token);

// Creates a memfd of `bytes` named `name`, sealed against shrinking,
// growing and further seals: what a client registers. The caller owns the
// fd.
absl::StatusOr<int> CreateSealedMemfd(const std::string& name, uint64_t bytes);

}  // namespace optstate::region_protocol

#endif  // OPTSTATE_COMMON_REGION_PROTOCOL_H_

// A call's caller, from its authorization metadata and its TLS peer, and the
// reactors that answer a refused stream at once. Checked once per call or
// stream, in the handlers (gRPC's AuthMetadataProcessor does nothing on
// plaintext listeners and cannot see the method).
#ifndef OPTSTATE_SERVER_RPC_CALL_AUTH_H_
#define OPTSTATE_SERVER_RPC_CALL_AUTH_H_

#include "absl/status/statusor.h"
#include "grpcpp/grpcpp.h"
#include "server/auth/authenticator.h"

namespace optstate {

// `authenticator` null: Caller() (tenant "", no admin). Else its answer for
// the call's `authorization` metadata and the URI SANs of its peer's
// certificate (gRPC's "peer_uri": the leaf's only); UNAUTHENTICATED when the
// call carries more than one `authorization` value.
absl::StatusOr<Caller> AuthenticateCall(const Authenticator* authenticator,
                                        const grpc::CallbackServerContext* context);

// Streams refused before they start: each finishes with the status it was
// made with and deletes itself.
template <typename Request>
class RefusedReadReactor : public grpc::ServerReadReactor<Request> {
 public:
  explicit RefusedReadReactor(const grpc::Status& status) { this->Finish(status); }
  void OnDone() override { delete this; }
};

template <typename Response>
class RefusedWriteReactor : public grpc::ServerWriteReactor<Response> {
 public:
  explicit RefusedWriteReactor(const grpc::Status& status) { this->Finish(status); }
  void OnDone() override { delete this; }
};

template <typename Request, typename Response>
class RefusedBidiReactor : public grpc::ServerBidiReactor<Request, Response> {
 public:
  explicit RefusedBidiReactor(const grpc::Status& status) { this->Finish(status); }
  void OnDone() override { delete this; }
};

}  // namespace optstate

#endif  // OPTSTATE_SERVER_RPC_CALL_AUTH_H_

// Metadata and peer properties to the Authenticator's inputs.
#include "server/rpc/call_auth.h"

#include <grpc/grpc_security_constants.h>

#include <string>
#include <vector>

#include "absl/strings/str_cat.h"

namespace optstate {

absl::StatusOr<Caller> AuthenticateCall(const Authenticator* authenticator,
                                        const grpc::CallbackServerContext* context) {
  if (authenticator == nullptr || !authenticator->required()) return Caller();
  std::optional<absl::string_view> authorization;
  const auto& metadata = context->client_metadata();
  if (const size_t n = metadata.count("authorization"); n > 1) {
    // Which one would be meant is the caller's to say, not the daemon's to guess.
    return absl::UnauthenticatedError(absl::StrCat(
        "the call carries ", n, " 'authorization' metadata values; send exactly one, "
        "'authorization: Bearer TOKEN'"));
  }
  if (auto it = metadata.find("authorization"); it != metadata.end()) {
    authorization = absl::string_view(it->second.data(), it->second.size());
  }
  std::vector<std::string> uris;
  if (std::shared_ptr<const grpc::AuthContext> auth = context->auth_context()) {
    for (const grpc::string_ref& uri : auth->FindPropertyValues(GRPC_PEER_URI_PROPERTY_NAME)) {
      uris.emplace_back(uri.data(), uri.size());
    }
  }
  return authenticator->Authenticate(authorization, uris);
}

}  // namespace optstate

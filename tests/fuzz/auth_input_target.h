// The fuzz target of the daemon's credential input: the tokens file's text,
// the authorization metadata of a call, and a client certificate's URI SAN.
// Run returns "" when every invariant holds, else what broke.
#ifndef OPTSTATE_TESTS_FUZZ_AUTH_INPUT_TARGET_H_
#define OPTSTATE_TESTS_FUZZ_AUTH_INPUT_TARGET_H_

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace optstate {
class Authenticator;
}

namespace optstate::fuzz {

// The input's first byte picks what the rest is:
// 0: a tokens file. Parsed or refused; a refusal names a line that exists
//    ("line N: ..."), quotes no field of 24 characters or more; a parse has
//    valid tenants, every entry's tenant in its table, no digest twice.
// 1: an authorization value. BearerToken's token is a suffix of it; the
//    Authenticator (one tenant, token kToken) accepts it exactly when it is
//    "Bearer" (any case), spaces, kToken; a refusal is UNAUTHENTICATED and
//    the same for every wrong token (so it cannot hold the one sent).
// 2: a URI SAN. TenantOfSpiffeId names a tenant only for exactly
//    spiffe://fuzz.example/tenant/NAME.
// Anything else: the same as byte % 3.
class AuthInputTarget {
 public:
  static constexpr const char* kToken = "fuzz-token-0123456789";
  AuthInputTarget();
  ~AuthInputTarget();
  std::string Run(const uint8_t* data, size_t size);

 private:
  std::string dir_;
  std::unique_ptr<Authenticator> authenticator_;
};

// Inputs that reach each branch, for the corpus and the smoke run.
std::vector<std::string> AuthInputSeeds();

}  // namespace optstate::fuzz

#endif  // OPTSTATE_TESTS_FUZZ_AUTH_INPUT_TARGET_H_

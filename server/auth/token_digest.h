// A bearer token's SHA-256 digest, the only form in which the daemon keeps
// or compares tokens; compared in constant time.
#ifndef OPTSTATE_SERVER_AUTH_TOKEN_DIGEST_H_
#define OPTSTATE_SERVER_AUTH_TOKEN_DIGEST_H_

#include <array>
#include <optional>

#include "absl/strings/string_view.h"

namespace optstate {

using TokenDigest = std::array<unsigned char, 32>;

// SHA-256 of the token's bytes (what `printf %s TOKEN | sha256sum` prints).
TokenDigest DigestOfToken(absl::string_view token);

// The digest written as 64 lowercase hex digits; nullopt for anything else
// (uppercase included: the tokens file's format says lowercase).
std::optional<TokenDigest> ParseDigestHex(absl::string_view hex);

// Whether two digests are equal, taking the same time whatever they hold.
bool SameDigest(const TokenDigest& a, const TokenDigest& b);

}  // namespace optstate

#endif  // OPTSTATE_SERVER_AUTH_TOKEN_DIGEST_H_

// SHA-256 from OpenSSL's libcrypto (which gRPC links already); the compare
// is CRYPTO_memcmp, whose time does not depend on where bytes differ.
#include "server/auth/token_digest.h"

#include <openssl/crypto.h>
#include <openssl/evp.h>

namespace optstate {

TokenDigest DigestOfToken(absl::string_view token) {
  TokenDigest digest{};
  unsigned int size = 0;
  // EVP_Digest fails only when out of memory; a zero digest then matches no
  // line of the tokens file (none can be all zeros by chance).
  if (EVP_Digest(token.data(), token.size(), digest.data(), &size, EVP_sha256(), nullptr) != 1 ||
      size != digest.size()) {
    digest.fill(0);
  }
  return digest;
}

std::optional<TokenDigest> ParseDigestHex(absl::string_view hex) {
  if (hex.size() != 64) return std::nullopt;
  TokenDigest digest{};
  for (size_t i = 0; i < hex.size(); ++i) {
    const char c = hex[i];
    int value;
    if (c >= '0' && c <= '9') {
      value = c - '0';
    } else if (c >= 'a' && c <= 'f') {
      value = c - 'a' + 10;
    } else {
      return std::nullopt;
    }
    digest[i / 2] = static_cast<unsigned char>(digest[i / 2] << 4 | value);
  }
  return digest;
}

bool SameDigest(const TokenDigest& a, const TokenDigest& b) {
  return CRYPTO_memcmp(a.data(), b.data(), a.size()) == 0;
}

}  // namespace optstate

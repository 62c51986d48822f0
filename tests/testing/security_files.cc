// The digest is computed with the daemon's own DigestOfToken, and checked
// against openssl's in security_test (an independent reference).
#include "tests/testing/security_files.h"

#include <stdlib.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "server/auth/token_digest.h"

namespace optstate::testing {

std::string DigestHex(const std::string& token) {
  const TokenDigest digest = DigestOfToken(token);
  return absl::BytesToHexString(
      absl::string_view(reinterpret_cast<const char*>(digest.data()), digest.size()));
}

std::string MakeTempDir(const std::string& tag) {
  static std::vector<std::string>* const made = [] {
    static std::vector<std::string> dirs;
    std::atexit([] {
      for (const std::string& dir : dirs) {
        std::error_code ignored;
        std::filesystem::remove_all(dir, ignored);
      }
    });
    return &dirs;
  }();
  const char* tmp = getenv("TMPDIR");
  std::string pattern = std::string(tmp != nullptr ? tmp : "/tmp") + "/optstate-" + tag + "-XXXXXX";
  if (mkdtemp(pattern.data()) == nullptr) return std::string();
  made->push_back(pattern);
  return pattern;
}

void WriteFile(const std::string& path, const std::string& text) {
  const std::string temp = path + ".new";
  {
    std::ofstream out(temp, std::ios::binary | std::ios::trunc);
    out << text;
  }
  std::rename(temp.c_str(), path.c_str());  // Readers see the old file or the new one.
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

std::vector<std::string> SecretsIn(const std::string& text,
                                   const std::vector<std::string>& tokens) {
  std::vector<std::string> found;
  for (const std::string& token : tokens) {
    if (absl::StrContains(text, token)) found.push_back("token " + token);
    if (absl::StrContains(text, DigestHex(token))) found.push_back("digest of " + token);
  }
  return found;
}

}  // namespace optstate::testing

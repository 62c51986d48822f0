// Files the security tests write: a tokens file (tokens and their SHA-256
// digests), and the daemons' logs, checked for any token or digest.
#ifndef OPTSTATE_TESTS_TESTING_SECURITY_FILES_H_
#define OPTSTATE_TESTS_TESTING_SECURITY_FILES_H_

#include <string>
#include <vector>

namespace optstate::testing {

// The lowercase hex SHA-256 of `token` (what the tokens file holds).
std::string DigestHex(const std::string& token);

// A fresh directory under $TMPDIR (or /tmp) for one test, removed with what
// it holds when the test process exits (daemons' logs are kept apart: see
// DaemonProcess::Start).
std::string MakeTempDir(const std::string& tag);

void WriteFile(const std::string& path, const std::string& text);
std::string ReadFile(const std::string& path);

// The secrets (each token and its digest) that occur in `text`; empty when
// none does.
std::vector<std::string> SecretsIn(const std::string& text, const std::vector<std::string>& tokens);

}  // namespace optstate::testing

#endif  // OPTSTATE_TESTS_TESTING_SECURITY_FILES_H_

// One bash script of openssl commands (EC P-256 keys, two days' validity; the
// expired server certificate's validity ended a day before it was made).
#include "tests/testing/test_certificates.h"

#include <cstdlib>

#include "absl/strings/str_cat.h"
#include "tests/testing/security_files.h"

namespace optstate::testing {

TestCertificates MakeTestCertificates() {
  TestCertificates c;
  const std::string dir = MakeTempDir("certs");
  if (dir.empty()) return c;
  const std::string script = absl::StrCat(R"(set -e
cd ')", dir, R"('
key() { openssl genpkey -algorithm EC -pkeyopt ec_paramgen_curve:P-256 -out "$1" 2>/dev/null; }
ca() { key "$1.key"; openssl req -x509 -new -key "$1.key" -out "$1.pem" -days 2 -subj "/CN=$1" \
  -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign; }
leaf() {  # name ca san [days]
  key "$1.key"
  openssl req -new -key "$1.key" -out "$1.csr" -subj "/CN=optstate-$1"
  printf 'subjectAltName=%s\nbasicConstraints=CA:FALSE\n' "$3" > "$1.ext"
  openssl x509 -req -in "$1.csr" -CA "$2.pem" -CAkey "$2.key" -CAcreateserial -days "${4:-2}" \
    -out "$1.pem" -extfile "$1.ext" 2>/dev/null
}
ca ca-one; ca ca-two
leaf server-one ca-one DNS:localhost,IP:127.0.0.1
leaf server-two ca-one DNS:localhost,IP:127.0.0.1
leaf client ca-one URI:spiffe://test.example/tenant/alice
leaf other-client ca-two URI:spiffe://test.example/tenant/alice
leaf expired-server ca-one DNS:localhost,IP:127.0.0.1 -1
)");
  const std::string path = dir + "/make.sh";
  WriteFile(path, script);
  if (std::system(absl::StrCat("bash '", path, "'").c_str()) != 0) return c;
  c.dir = dir;
  c.ca = dir + "/ca-one.pem";
  c.other_ca = dir + "/ca-two.pem";
  c.server_one_cert = dir + "/server-one.pem";
  c.server_one_key = dir + "/server-one.key";
  c.server_two_cert = dir + "/server-two.pem";
  c.server_two_key = dir + "/server-two.key";
  c.expired_server_cert = dir + "/expired-server.pem";
  c.expired_server_key = dir + "/expired-server.key";
  c.client_cert = dir + "/client.pem";
  c.client_key = dir + "/client.key";
  c.other_client_cert = dir + "/other-client.pem";
  c.other_client_key = dir + "/other-client.key";
  return c;
}

}  // namespace optstate::testing

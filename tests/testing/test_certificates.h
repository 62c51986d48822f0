// Certificates made at test time with the openssl command: two CAs, server
// certificates for localhost and 127.0.0.1 (one of them expired), client
// certificates (with a SPIFFE URI SAN) from either CA.
#ifndef OPTSTATE_TESTS_TESTING_TEST_CERTIFICATES_H_
#define OPTSTATE_TESTS_TESTING_TEST_CERTIFICATES_H_

#include <string>

namespace optstate::testing {

struct TestCertificates {
  std::string dir;
  // CA one signs server_one, server_two and client (URI SAN
  // spiffe://test.example/tenant/alice); CA two signs other_client.
  std::string ca, other_ca;
  std::string server_one_cert, server_one_key;  // CN optstate-server-one
  std::string server_two_cert, server_two_key;  // CN optstate-server-two
  std::string expired_server_cert, expired_server_key;  // Not valid after yesterday.
  std::string client_cert, client_key;
  std::string other_client_cert, other_client_key;
};

// Makes them all under a fresh directory; empty `dir` when openssl failed
// (the reason is on stderr).
TestCertificates MakeTestCertificates();

}  // namespace optstate::testing

#endif  // OPTSTATE_TESTS_TESTING_TEST_CERTIFICATES_H_

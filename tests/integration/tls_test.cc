// TLS and mTLS against a real daemon, with certificates made at test time by
// openssl: good clients work; clients that trust another CA, expect another
// name, send no certificate or one from another CA, or speak plaintext are
// refused with a message that says what to check; a replaced certificate
// reaches new connections while an open stream goes on; a client
// certificate's SPIFFE ID names its tenant.
#include <arpa/inet.h>
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/time/clock.h"
#include "grpcpp/grpcpp.h"
#include "optstate/client.h"
#include "optstate/v1/optstate.grpc.pb.h"
#include "tests/testing/daemon_logs.h"
#include "tests/testing/daemon_process.h"
#include "tests/testing/security_files.h"
#include "tests/testing/test_certificates.h"

namespace optstate::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

const std::string kToken = "tls-test-token-41c9";

class TlsTest : public ::testing::Test {
 protected:
  static void SetUpTestSuite() { certs_ = new TestCertificates(MakeTestCertificates()); }

  void SetUp() override {
    ASSERT_FALSE(certs_->dir.empty()) << "openssl could not make the test certificates";
    dir_ = MakeTempDir("tls");
    log_ = dir_ + "/daemon.log";
    // The daemon serves copies, so a test may replace them.
    std::filesystem::copy_file(certs_->server_one_cert, dir_ + "/cert.pem");
    std::filesystem::copy_file(certs_->server_one_key, dir_ + "/key.pem");
    WriteFile(dir_ + "/tokens", "alice " + DigestHex(kToken) + "\n");
    RecordTestSecrets({kToken});
  }
  void TearDown() override {
    if (daemon_ != nullptr) {
      absl::StatusOr<int> exit = daemon_->Stop();
      EXPECT_TRUE(exit.ok() && *exit == 0);
    }
    EXPECT_THAT(SecretsIn(ReadFile(log_), {kToken}), ::testing::IsEmpty());
  }

  void StartDaemon(std::vector<std::string> extra = {}) {
    std::vector<std::string> flags = {"--threads=2", "--tls_cert=" + dir_ + "/cert.pem",
                                      "--tls_key=" + dir_ + "/key.pem", "--tls_reload_interval=1s",
                                      "--auth_tokens_file=" + dir_ + "/tokens"};
    flags.insert(flags.end(), extra.begin(), extra.end());
    absl::StatusOr<std::unique_ptr<DaemonProcess>> daemon = DaemonProcess::Start(flags, log_);
    ASSERT_TRUE(daemon.ok()) << daemon.status() << "\n" << ReadFile(log_);
    daemon_ = std::move(*daemon);
  }

  ClientOptions TlsOptions() {
    ClientOptions options;
    options.token = kToken;
    options.tls_root_ca_file = certs_->ca;
    options.max_attempts = 1;
    options.attempt_timeout = absl::Seconds(10);
    options.data_plane = DataPlane::kWire;
    return options;
  }

  absl::Status ListWith(const ClientOptions& options) {
    absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(daemon_->target(), options);
    if (!client.ok()) return client.status();
    return (*client)->ListGroups().status();
  }

  // The CN of the certificate the daemon serves a new connection.
  std::string ServedCommonName() {
    grpc::SslCredentialsOptions ssl;
    ssl.pem_root_certs = ReadFile(certs_->ca);
    auto stub = v1::OptimizerState::NewStub(
        grpc::CreateChannel(daemon_->target(), grpc::SslCredentials(ssl)));
    grpc::ClientContext context;
    context.AddMetadata("authorization", "Bearer " + kToken);
    v1::ListGroupsResponse reply;
    if (!stub->ListGroups(&context, v1::ListGroupsRequest(), &reply).ok()) return "";
    auto names = context.auth_context()->FindPropertyValues("x509_common_name");
    return names.empty() ? "" : std::string(names[0].data(), names[0].size());
  }

  static TestCertificates* certs_;
  std::string dir_, log_;
  std::unique_ptr<DaemonProcess> daemon_;
};

TestCertificates* TlsTest::certs_ = nullptr;

// Any peer can fail a handshake: gRPC wrote a line of its own format for
// each (E1207 ... ssl_transport_security.cc ... Handshake failed), whatever
// --log_level said, so a loop of connections flooded the log.
TEST_F(TlsTest, FailedHandshakesAreLoggedInTheDaemonsFormatAtMostOneASecond) {
  StartDaemon({"--log_level=warning"});
  const absl::Time start = absl::Now();
  for (int i = 0; i < 200; ++i) {
    const int fd = socket(AF_INET, SOCK_STREAM, 0);
    ASSERT_GE(fd, 0);
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_port = htons(static_cast<uint16_t>(daemon_->port()));
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof(address)), 0);
    const char garbage[] = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
    ASSERT_GT(write(fd, garbage, sizeof(garbage) - 1), 0);
    char reply[256];
    while (read(fd, reply, sizeof(reply)) > 0) {
    }
    close(fd);
  }
  absl::SleepFor(absl::Milliseconds(200));
  // Whole Unix seconds the loop touched, and the one after it.
  const int64_t seconds = absl::ToInt64Seconds(absl::Now() - start) + 3;
  int handshake_lines = 0;
  for (absl::string_view line : absl::StrSplit(ReadFile(log_), '\n')) {
    if (!absl::StrContains(line, "andshake")) continue;
    ++handshake_lines;
    EXPECT_TRUE(absl::StartsWith(line, "WARNING ")) << line;
    EXPECT_THAT(line, HasSubstr("optstated: gRPC ("));
  }
  EXPECT_GE(handshake_lines, 1);
  EXPECT_LE(handshake_lines, seconds);
  // And --log_level=error leaves them out.
  ASSERT_TRUE(daemon_->Stop().ok());
  daemon_.reset();
  log_ = dir_ + "/quiet.log";
  StartDaemon({"--log_level=error"});
  ClientOptions plaintext;
  plaintext.max_attempts = 1;
  plaintext.data_plane = DataPlane::kWire;
  EXPECT_FALSE(ListWith(plaintext).ok());
  absl::SleepFor(absl::Milliseconds(200));
  EXPECT_THAT(ReadFile(log_), Not(HasSubstr("andshake")));
}

TEST_F(TlsTest, AnExpiredDaemonCertificateIsRefusedSayingItHasExpired) {
  std::filesystem::copy_file(certs_->expired_server_cert, dir_ + "/cert.pem",
                             std::filesystem::copy_options::overwrite_existing);
  std::filesystem::copy_file(certs_->expired_server_key, dir_ + "/key.pem",
                             std::filesystem::copy_options::overwrite_existing);
  StartDaemon();
  // Served (a renewal may replace it while the daemon runs), with a warning: it
  // started with an INFO line alone.
  EXPECT_THAT(ReadFile(log_), HasSubstr("WARNING"));
  EXPECT_THAT(ReadFile(log_), HasSubstr("its first certificate expired on"));
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(daemon_->target(), TlsOptions());
  ASSERT_TRUE(client.ok());
  for (absl::Status refused :
       {(*client)->ListGroups().status(), (*client)->RegisterGroup("w", 10).status(),
        (*client)->DeleteGroup("w")}) {
    EXPECT_EQ(refused.code(), absl::StatusCode::kUnavailable);
    EXPECT_THAT(refused.message(), HasSubstr("certificate verify failed"));
    EXPECT_THAT(refused.message(), HasSubstr("the daemon's certificate: certificate has expired"));
    EXPECT_THAT(refused.message(), HasSubstr("/CN=optstate-expired-server"));
    EXPECT_THAT(refused.message(), HasSubstr("until "));
  }
}

// A key that is not the certificate's started a daemon that logged
// "listening" and refused every handshake.
TEST_F(TlsTest, AKeyThatIsNotTheCertificatesIsRefusedAtStart) {
  std::filesystem::copy_file(certs_->server_two_key, dir_ + "/key.pem",
                             std::filesystem::copy_options::overwrite_existing);
  EXPECT_FALSE(DaemonProcess::Start(
                   {"--tls_cert=" + dir_ + "/cert.pem", "--tls_key=" + dir_ + "/key.pem"}, log_)
                   .ok());
  EXPECT_THAT(ReadFile(log_), HasSubstr("key.pem is not the key of --tls_cert="));
}

TEST_F(TlsTest, AClientTrustingTheDaemonsCaWorks) {
  StartDaemon();
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(daemon_->target(), TlsOptions());
  ASSERT_TRUE(client.ok());
  ASSERT_TRUE((*client)->RegisterGroup("w", 100).ok());
  std::vector<float> grad(100, 0.5f), params(100);
  EXPECT_TRUE((*client)->Step("w", 1, grad, absl::MakeSpan(params)).ok());
  EXPECT_EQ(ServedCommonName(), "optstate-server-one");
}

TEST_F(TlsTest, AClientTrustingAnotherCaOrExpectingAnotherNameIsRefusedSayingWhy) {
  StartDaemon();
  ClientOptions other_ca = TlsOptions();
  other_ca.tls_root_ca_file = certs_->other_ca;
  absl::Status refused = ListWith(other_ca);
  EXPECT_EQ(refused.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(refused.message(), HasSubstr("certificate verify failed"));
  EXPECT_THAT(refused.message(), HasSubstr("tls_root_ca_file"));
  // OpenSSL's own reason, from the client's diagnosing handshake.
  EXPECT_THAT(refused.message(),
              HasSubstr("the daemon's certificate: unable to get local issuer certificate"));
  EXPECT_THAT(refused.message(), HasSubstr("/CN=optstate-server-one"));
  ClientOptions wrong_name = TlsOptions();
  wrong_name.tls_server_name = "not-the-daemon.example";
  refused = ListWith(wrong_name);
  EXPECT_EQ(refused.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(refused.message(), HasSubstr("tls_server_name"));
  ClientOptions missing = TlsOptions();
  missing.tls_root_ca_file = dir_ + "/no-such.pem";
  refused = ListWith(missing);
  EXPECT_EQ(refused.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(refused.message(), HasSubstr("tls_root_ca_file"));
  EXPECT_TRUE(ListWith(TlsOptions()).ok()) << "the daemon serves on";
}

TEST_F(TlsTest, APlaintextClientAgainstTheTlsPortFailsCleanly) {
  StartDaemon();
  ClientOptions plain = TlsOptions();
  plain.tls_root_ca_file = "";
  plain.attempt_timeout = absl::Seconds(3);
  absl::Status refused = ListWith(plain);
  EXPECT_EQ(refused.code(), absl::StatusCode::kUnavailable) << refused;
  EXPECT_TRUE(ListWith(TlsOptions()).ok()) << "the daemon serves on";
}

TEST_F(TlsTest, UnderMtlsOnlyClientsWithACertificateOfTheClientCaAreServed) {
  StartDaemon({"--tls_client_ca=" + certs_->ca});
  // Refused without a TLS error on the client's side ("Socket closed"): the
  // message says which options to check.
  ClientOptions none = TlsOptions();
  absl::Status refused = ListWith(none);
  EXPECT_EQ(refused.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(refused.message(), HasSubstr("tls_cert_file and tls_key_file, signed by its"));
  ClientOptions other = TlsOptions();
  other.tls_cert_file = certs_->other_client_cert;
  other.tls_key_file = certs_->other_client_key;
  EXPECT_EQ(ListWith(other).code(), absl::StatusCode::kUnavailable);
  ClientOptions plaintext = TlsOptions();
  plaintext.tls_root_ca_file = "";
  refused = ListWith(plaintext);
  EXPECT_EQ(refused.code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(refused.message(), HasSubstr("set ClientOptions.tls_root_ca_file"));
  ClientOptions good = TlsOptions();
  good.tls_cert_file = certs_->client_cert;
  good.tls_key_file = certs_->client_key;
  EXPECT_TRUE(ListWith(good).ok());
  // Without --tls_trust_domain a certificate names no tenant: a token is needed.
  good.token = "";
  EXPECT_EQ(ListWith(good).code(), absl::StatusCode::kUnauthenticated);
}

TEST_F(TlsTest, AClientCertificatesSpiffeIdNamesItsTenant) {
  StartDaemon({"--tls_client_ca=" + certs_->ca, "--tls_trust_domain=test.example"});
  ClientOptions by_cert = TlsOptions();
  by_cert.token = "";
  by_cert.tls_cert_file = certs_->client_cert;
  by_cert.tls_key_file = certs_->client_key;
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(daemon_->target(), by_cert);
  ASSERT_TRUE(client.ok());
  ASSERT_TRUE((*client)->RegisterGroup("from-cert", 10).ok());
  // The token's tenant, alice, is the same tenant.
  ClientOptions by_token = by_cert;
  by_token.token = kToken;
  absl::StatusOr<std::unique_ptr<Client>> alice = Client::Connect(daemon_->target(), by_token);
  ASSERT_TRUE(alice.ok());
  absl::StatusOr<std::vector<GroupInfo>> groups = (*alice)->ListGroups();
  ASSERT_TRUE(groups.ok());
  ASSERT_EQ(groups->size(), 1u);
  EXPECT_EQ((*groups)[0].name, "from-cert");
}

// A certificate of another trust domain was told "this daemon needs a
// token", as if no certificate had come: it names what it sent, and both
// ways in.
TEST_F(TlsTest, ACertificateOfAnotherTrustDomainIsToldWhatItSentAndBothWaysIn) {
  StartDaemon({"--tls_client_ca=" + certs_->ca, "--tls_trust_domain=other.example"});
  ClientOptions by_cert = TlsOptions();
  by_cert.token = "";
  by_cert.tls_cert_file = certs_->client_cert;
  by_cert.tls_key_file = certs_->client_key;
  const absl::Status refused = ListWith(by_cert);
  EXPECT_EQ(refused.code(), absl::StatusCode::kUnauthenticated) << refused;
  EXPECT_THAT(refused.message(), HasSubstr("URI SAN 'spiffe://test.example/tenant/"));
  EXPECT_THAT(refused.message(), HasSubstr("names no tenant of this daemon"));
  EXPECT_THAT(refused.message(), HasSubstr("authorization: Bearer"));
  EXPECT_THAT(refused.message(), HasSubstr("spiffe://other.example/tenant/NAME"));
}

TEST_F(TlsTest, ACallerNamedByItsCertificateStepsOverTheWireAndSharedMemoryAsksForAToken) {
  StartDaemon({"--tls_client_ca=" + certs_->ca, "--tls_trust_domain=test.example"});
  ClientOptions by_cert = TlsOptions();
  by_cert.token = "";
  by_cert.tls_cert_file = certs_->client_cert;
  by_cert.tls_key_file = certs_->client_key;
  std::vector<float> grad(64, 0.25f), params(64);
  // kAuto: the region socket cannot authenticate it, so the step takes the wire.
  by_cert.data_plane = DataPlane::kAuto;
  absl::StatusOr<std::unique_ptr<Client>> automatic = Client::Connect(daemon_->target(), by_cert);
  ASSERT_TRUE(automatic.ok());
  ASSERT_TRUE((*automatic)->RegisterGroup("w", 64).ok());
  ASSERT_TRUE((*automatic)->Step("w", 1, grad, absl::MakeSpan(params)).ok());
  ASSERT_TRUE((*automatic)->Step("w", 2, grad, absl::MakeSpan(params)).ok());
  // kSharedMemory: refused, saying what to send.
  by_cert.data_plane = DataPlane::kSharedMemory;
  absl::StatusOr<std::unique_ptr<Client>> shared = Client::Connect(daemon_->target(), by_cert);
  ASSERT_TRUE(shared.ok());
  absl::Status refused = (*shared)->Step("w", 3, grad, absl::MakeSpan(params));
  EXPECT_EQ(refused.code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(refused.message(), HasSubstr("needs a token"));
  EXPECT_THAT(refused.message(), HasSubstr("authorization: Bearer"));
  // With the tenant's token the same certificate gets shared memory.
  by_cert.token = kToken;
  absl::StatusOr<std::unique_ptr<Client>> with_token = Client::Connect(daemon_->target(), by_cert);
  ASSERT_TRUE(with_token.ok());
  EXPECT_TRUE((*with_token)->Step("w", 3, grad, absl::MakeSpan(params)).ok());
  absl::StatusOr<GroupInfo> info = (*with_token)->DescribeGroup("w");
  ASSERT_TRUE(info.ok());
  EXPECT_EQ(info->min_step, 3u) << "steps 1-2 by certificate, 3 by token: one tenant";
}

TEST_F(TlsTest, AReplacedCertificateReachesNewConnectionsWhileAnOpenStreamGoesOn) {
  StartDaemon();
  absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(daemon_->target(), TlsOptions());
  ASSERT_TRUE(client.ok());
  ASSERT_TRUE((*client)->RegisterGroup("w", 64).ok());
  ASSERT_EQ(ServedCommonName(), "optstate-server-one");

  grpc::SslCredentialsOptions ssl;
  ssl.pem_root_certs = ReadFile(certs_->ca);
  auto stub = v1::OptimizerState::NewStub(
      grpc::CreateChannel(daemon_->target(), grpc::SslCredentials(ssl)));
  grpc::ClientContext context;
  context.AddMetadata("authorization", "Bearer " + kToken);
  auto stream = stub->Step(&context);
  std::vector<float> grad(64, 0.25f);
  auto step = [&](uint64_t t) {
    v1::StepRequest request;
    request.set_group("w");
    request.set_step(t);
    request.set_gradient_dtype(v1::DTYPE_FLOAT32);
    request.set_gradient(grad.data(), grad.size() * sizeof(float));
    v1::StepResponse reply;
    return stream->Write(request) && stream->Read(&reply) && reply.step() == t;
  };
  ASSERT_TRUE(step(1));

  // Replaced as a deployment's cert manager does: new files moved in.
  std::filesystem::copy_file(certs_->server_two_cert, dir_ + "/cert.new");
  std::filesystem::copy_file(certs_->server_two_key, dir_ + "/key.new");
  std::filesystem::rename(dir_ + "/key.new", dir_ + "/key.pem");
  std::filesystem::rename(dir_ + "/cert.new", dir_ + "/cert.pem");
  std::string served;
  for (int i = 0; i < 50 && served != "optstate-server-two"; ++i) {
    absl::SleepFor(absl::Milliseconds(200));
    served = ServedCommonName();
  }
  EXPECT_EQ(served, "optstate-server-two");
  EXPECT_TRUE(step(2)) << "the stream opened before the reload goes on";
  stream->WritesDone();
  EXPECT_TRUE(stream->Finish().ok());
}

// Files replaced with ones gRPC cannot serve (a certificate that does not
// parse, a key that is not the certificate's, a missing key, an expired
// certificate) leave the previous certificate served to new connections,
// and the log says what is wrong; a good pair is then served.
TEST_F(TlsTest, ABadReplacementLeavesThePreviousCertificateServedAndSaysWhy) {
  StartDaemon({"--log_level=info"});
  ASSERT_EQ(ServedCommonName(), "optstate-server-one");
  auto replace = [&](const std::string& name, const std::string& text) {
    WriteFile(dir_ + "/" + name + ".new", text);
    std::filesystem::rename(dir_ + "/" + name + ".new", dir_ + "/" + name);
  };
  // Three looks at 1 s: the same bad set seen twice is logged.
  auto still_served_after_three_looks = [&](const std::string& logged) {
    for (int i = 0; i < 12; ++i) {
      absl::SleepFor(absl::Milliseconds(300));
      if (ServedCommonName() != "optstate-server-one") return false;
    }
    const std::string log = ReadFile(log_);
    EXPECT_THAT(log, HasSubstr("TLS: the files are not served, new connections keep the previous "
                               "ones until they are fixed"));
    EXPECT_THAT(log, HasSubstr(logged));
    return true;
  };
  replace("cert.pem",
          "-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydGlmaWNhdGU=\n"
          "-----END CERTIFICATE-----\n");
  EXPECT_TRUE(still_served_after_three_looks("cert.pem: a certificate in it does not parse"));
  replace("cert.pem", ReadFile(certs_->server_two_cert));
  EXPECT_TRUE(still_served_after_three_looks("key.pem is not the key of --tls_cert="));
  std::filesystem::remove(dir_ + "/key.pem");
  EXPECT_TRUE(still_served_after_three_looks("key.pem: cannot be read"));
  replace("cert.pem", ReadFile(certs_->expired_server_cert));
  replace("key.pem", ReadFile(certs_->expired_server_key));
  EXPECT_TRUE(still_served_after_three_looks("cert.pem: its first certificate expired on "));

  replace("key.pem", ReadFile(certs_->server_two_key));
  replace("cert.pem", ReadFile(certs_->server_two_cert));
  std::string served;
  for (int i = 0; i < 50 && served != "optstate-server-two"; ++i) {
    absl::SleepFor(absl::Milliseconds(200));
    served = ServedCommonName();
  }
  EXPECT_EQ(served, "optstate-server-two");
  // The files that changed, named (a client CA change was logged as --tls_cert's).
  EXPECT_THAT(ReadFile(log_), HasSubstr("TLS: --tls_cert=" + dir_ + "/cert.pem, --tls_key=" + dir_ +
                                        "/key.pem changed; new connections get the new "
                                        "files"));
}

// The served files put back after a refused replacement: the ERROR stayed
// the last TLS line (the metric went back to 0), as if still refused.
TEST_F(TlsTest, TheServedFilesPutBackEndTheRefusalInTheLog) {
  StartDaemon({"--log_level=info"});
  const std::string cert = ReadFile(dir_ + "/cert.pem");
  auto replace = [&](const std::string& text) {
    WriteFile(dir_ + "/cert.pem.new", text);
    std::filesystem::rename(dir_ + "/cert.pem.new", dir_ + "/cert.pem");
  };
  auto logged = [&](const std::string& line) {
    for (int i = 0; i < 50; ++i) {
      if (ReadFile(log_).find(line) != std::string::npos) return true;
      absl::SleepFor(absl::Milliseconds(200));
    }
    return false;
  };
  replace("-----BEGIN CERTIFICATE-----\nbm90IGEgY2VydGlmaWNhdGU=\n-----END CERTIFICATE-----\n");
  ASSERT_TRUE(logged("TLS: the files are not served")) << ReadFile(log_);
  replace(cert);
  EXPECT_TRUE(
      logged("TLS: the files are those served again; the refusal of the changed ones "
             "is over"))
      << ReadFile(log_);
  EXPECT_EQ(ServedCommonName(), "optstate-server-one");
}

// Client roots replaced with a file that does not parse leave the previous
// roots verifying client certificates.
TEST_F(TlsTest, ClientRootsThatDoNotParseLeaveThePreviousRootsInForce) {
  std::filesystem::copy_file(certs_->ca, dir_ + "/client_ca.pem");
  StartDaemon({"--tls_client_ca=" + dir_ + "/client_ca.pem"});
  ClientOptions with_certificate = TlsOptions();
  with_certificate.tls_cert_file = certs_->client_cert;
  with_certificate.tls_key_file = certs_->client_key;
  ClientOptions other_ca = TlsOptions();
  other_ca.tls_cert_file = certs_->other_client_cert;
  other_ca.tls_key_file = certs_->other_client_key;
  ASSERT_TRUE(ListWith(with_certificate).ok());
  WriteFile(dir_ + "/client_ca.new",
            "-----BEGIN CERTIFICATE-----\nZ2FyYmFnZQ==\n"
            "-----END CERTIFICATE-----\n");
  std::filesystem::rename(dir_ + "/client_ca.new", dir_ + "/client_ca.pem");
  for (int i = 0; i < 12; ++i) {
    absl::SleepFor(absl::Milliseconds(300));
    EXPECT_TRUE(ListWith(with_certificate).ok()) << "look " << i;
  }
  EXPECT_EQ(ListWith(other_ca).code(), absl::StatusCode::kUnavailable);
  EXPECT_THAT(ReadFile(log_), HasSubstr("client_ca.pem: a certificate in it does not parse"));
}

}  // namespace
}  // namespace optstate::testing

namespace optstate::testing {
namespace {

TEST(PlaintextListenTest, IsRefusedOnARemoteAddressUnlessAllowedWithAWarning) {
  const std::string dir = MakeTempDir("plaintext");
  const std::string log = dir + "/daemon.log";
  EXPECT_FALSE(DaemonProcess::Start({"--listen=0.0.0.0:0"}, log).ok());
  EXPECT_THAT(ReadFile(log), HasSubstr("--allow_insecure_remote"));
  absl::StatusOr<std::unique_ptr<DaemonProcess>> allowed =
      DaemonProcess::Start({"--listen=0.0.0.0:0", "--allow_insecure_remote"}, log);
  ASSERT_TRUE(allowed.ok()) << allowed.status();
  EXPECT_THAT(ReadFile(log), HasSubstr("WARNING"));
  EXPECT_THAT(ReadFile(log), HasSubstr("serving plaintext on 0.0.0.0:0"));
  absl::StatusOr<int> exit = (*allowed)->Stop();
  EXPECT_TRUE(exit.ok() && *exit == 0);
  EXPECT_FALSE(DaemonProcess::Start({"--tls_cert=" + dir + "/none.pem"}, log).ok());
  EXPECT_THAT(ReadFile(log), HasSubstr("--tls_cert and --tls_key go together"));
  // A name that starts as a loopback address does can resolve to any address: it was
  // served plaintext, without a warning.
  const std::string named_log = dir + "/named.log";
  EXPECT_FALSE(DaemonProcess::Start({"--listen=127.0.0.1.example.invalid:0"}, named_log).ok());
  EXPECT_THAT(ReadFile(named_log),
              HasSubstr("--listen=127.0.0.1.example.invalid:0 is reachable from other hosts"));
}

}  // namespace
}  // namespace optstate::testing

namespace optstate::testing {
namespace {

// optstate-probe checks health over TLS with the CA alone (health needs no
// token), and fails without it.
TEST_F(TlsTest, TheProbeChecksHealthOverTlsWithTheCa) {
  StartDaemon({"--tls_client_ca=" + certs_->ca});
  const std::string probe = absl::StrCat(OPTSTATE_PROBE_PATH, " --addr=", daemon_->target(),
                                         " --timeout=5s --tls_ca=", certs_->ca);
  const std::string mtls =
      absl::StrCat(" --tls_cert=", certs_->client_cert, " --tls_key=", certs_->client_key);
  EXPECT_EQ(std::system((probe + mtls + " >/dev/null 2>&1").c_str()), 0);
  EXPECT_NE(std::system((probe + " >/dev/null 2>&1").c_str()), 0) << "no client certificate";
  const std::string output = ::testing::TempDir() + "/plaintext_probe.txt";
  EXPECT_NE(std::system(absl::StrCat(OPTSTATE_PROBE_PATH, " --addr=", daemon_->target(),
                                     " --timeout=2s >", output, " 2>&1")
                            .c_str()),
            0)
      << "plaintext";
  // What to do, not "Deadline Exceeded" (what it printed before).
  std::ifstream printed(output);
  const std::string text((std::istreambuf_iterator<char>(printed)),
                         std::istreambuf_iterator<char>());
  EXPECT_NE(text.find("give --tls_ca"), std::string::npos) << text;
}

}  // namespace
}  // namespace optstate::testing

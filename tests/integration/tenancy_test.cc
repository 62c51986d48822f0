// Tokens, tenants and quotas against a real daemon started with a tokens
// file: who is refused with which code, what tenant B can do to tenant A's
// group (nothing: A's state stays byte-identical), each quota at its
// boundary, a reload by SIGHUP, and no token or digest in the daemon's log.
#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <optional>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "common/region_protocol.h"
#include "grpcpp/grpcpp.h"
#include "optstate/client.h"
#include "optstate/v1/optstate.grpc.pb.h"
#include "tests/testing/daemon_logs.h"
#include "tests/testing/daemon_process.h"
#include "tests/testing/security_files.h"

namespace optstate::testing {
namespace {

using ::testing::HasSubstr;
using ::testing::Not;

const std::string kAlice1 = "alice-token-one-5f1c2a";
const std::string kAlice2 = "alice-token-two-9b77e0";
const std::string kBob = "bob-token-3e4d1c";
const std::string kRoot = "root-token-a8c0de";
const std::string kCarol = "carol-token-77aa01";
const std::vector<std::string> kAllTokens = {kAlice1, kAlice2, kBob, kRoot, kCarol};

constexpr uint64_t kPage = 1024;
constexpr uint64_t kBytesPerElement = 12;

std::string TokensFile(bool with_alice1 = true) {
  std::string text = "# tenants of the test\n\n";
  if (with_alice1) absl::StrAppend(&text, "alice ", DigestHex(kAlice1), " max_groups=2\n");
  absl::StrAppend(&text, "alice ", DigestHex(kAlice2), "   # rotated in\n");
  absl::StrAppend(&text, "bob\t", DigestHex(kBob), "\n");
  absl::StrAppend(&text, "carol ", DigestHex(kCarol), " max_host_bytes=",
                  2 * kPage * kBytesPerElement, "\n");
  absl::StrAppend(&text, "root ", DigestHex(kRoot), " admin\n");
  return text;
}

class TenancyTest : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = MakeTempDir("tenancy");
    ASSERT_FALSE(dir_.empty());
    tokens_ = dir_ + "/tokens";
    log_ = dir_ + "/daemon.log";
    WriteFile(tokens_, TokensFile());
    RecordTestSecrets(kAllTokens);
  }
  void TearDown() override {
    if (daemon_ != nullptr) {
      absl::StatusOr<int> exit = daemon_->Stop();
      EXPECT_TRUE(exit.ok() && *exit == 0) << "the daemon must exit cleanly";
    }
    const std::string log = ReadFile(log_);
    EXPECT_THAT(SecretsIn(log, kAllTokens), ::testing::IsEmpty()) << "in the daemon's log";
  }

  void StartDaemon(std::vector<std::string> extra = {}) {
    std::vector<std::string> flags = {"--threads=2", "--page_elements=1024", "--log_level=debug",
                                      "--auth_tokens_file=" + tokens_};
    flags.insert(flags.end(), extra.begin(), extra.end());
    absl::StatusOr<std::unique_ptr<DaemonProcess>> daemon = DaemonProcess::Start(flags, log_);
    ASSERT_TRUE(daemon.ok()) << daemon.status() << "\n" << ReadFile(log_);
    daemon_ = std::move(*daemon);
  }

  std::unique_ptr<Client> Connect(const std::string& token) {
    ClientOptions options;
    options.token = token;
    options.max_attempts = 1;
    options.data_plane = DataPlane::kWire;
    absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect(daemon_->target(), options);
    EXPECT_TRUE(client.ok()) << client.status();
    return std::move(*client);
  }

  std::unique_ptr<v1::OptimizerState::Stub> Stub() {
    return v1::OptimizerState::NewStub(
        grpc::CreateChannel(daemon_->target(), grpc::InsecureChannelCredentials()));
  }

  static void Authorize(grpc::ClientContext* context, const std::string& token) {
    context->AddMetadata("authorization", "Bearer " + token);
  }

  std::string dir_, tokens_, log_;
  std::unique_ptr<DaemonProcess> daemon_;
};

std::vector<float> Ramp(size_t n) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = 0.001f * static_cast<float>(i % 977) - 0.3f;
  return v;
}

void ExpectSameState(const Client::GroupState& a, const Client::GroupState& b) {
  ASSERT_EQ(a.params.size(), b.params.size());
  EXPECT_EQ(0, std::memcmp(a.params.data(), b.params.data(), a.params.size() * 4));
  EXPECT_EQ(0, std::memcmp(a.exp_avg.data(), b.exp_avg.data(), a.exp_avg.size() * 4));
  EXPECT_EQ(0, std::memcmp(a.exp_avg_sq.data(), b.exp_avg_sq.data(), a.exp_avg_sq.size() * 4));
  EXPECT_EQ(a.page_steps, b.page_steps);
}

TEST_F(TenancyTest, CallsWithoutOrWithAWrongTokenAreUnauthenticated) {
  StartDaemon();
  absl::StatusOr<std::vector<GroupInfo>> none = Connect("")->ListGroups();
  EXPECT_EQ(none.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(none.status().message(), HasSubstr("authorization: Bearer"));
  absl::StatusOr<std::vector<GroupInfo>> wrong = Connect("not-a-token")->ListGroups();
  EXPECT_EQ(wrong.status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(wrong.status().message(), Not(HasSubstr("not-a-token")));
  // Every method, streams included.
  EXPECT_EQ(Connect("")->RegisterGroup("w", 10).status().code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(Connect("")->GetStats().status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(Connect("")->ExportState("w").status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(Connect("")->DeleteGroup("w").code(), absl::StatusCode::kUnauthenticated);
  {
    grpc::ClientContext context;
    Authorize(&context, "wrong");
    auto stream = Stub()->Step(&context);
    v1::StepResponse reply;
    EXPECT_FALSE(stream->Read(&reply));
    EXPECT_EQ(stream->Finish().error_code(), grpc::StatusCode::UNAUTHENTICATED);
  }
  {
    // Two tokens, even both valid and of one tenant: which is meant is not
    // the daemon's to guess.
    grpc::ClientContext context;
    Authorize(&context, kAlice1);
    Authorize(&context, kAlice2);
    v1::ListGroupsResponse reply;
    grpc::Status status = Stub()->ListGroups(&context, v1::ListGroupsRequest(), &reply);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED);
    EXPECT_THAT(status.error_message(), HasSubstr("2 'authorization' metadata values"));
  }
  {
    grpc::ClientContext context;
    context.AddMetadata("authorization", "Basic " + kBob);
    v1::ListGroupsResponse reply;
    grpc::Status status = Stub()->ListGroups(&context, v1::ListGroupsRequest(), &reply);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::UNAUTHENTICATED);
    EXPECT_THAT(status.error_message(), HasSubstr("Bearer TOKEN"));
  }
}

TEST_F(TenancyTest, BothTokensOfARotatedTenantReachTheSameGroups) {
  StartDaemon();
  ASSERT_TRUE(Connect(kAlice1)->RegisterGroup("w", 100).ok());
  absl::StatusOr<std::vector<GroupInfo>> seen = Connect(kAlice2)->ListGroups();
  ASSERT_TRUE(seen.ok()) << seen.status();
  ASSERT_EQ(seen->size(), 1u);
  EXPECT_EQ((*seen)[0].name, "w");
  EXPECT_EQ((*seen)[0].tenant, "") << "only an admin is told the owner";
}

TEST_F(TenancyTest, ATokenRemovedAndReloadedBySighupIsRefusedOnItsNextCall) {
  StartDaemon();
  std::unique_ptr<Client> alice1 = Connect(kAlice1);
  ASSERT_TRUE(alice1->ListGroups().ok());
  WriteFile(tokens_, TokensFile(/*with_alice1=*/false));
  ASSERT_EQ(kill(daemon_->pid(), SIGHUP), 0);
  absl::Status status;
  for (int i = 0; i < 100; ++i) {  // The reload runs on the daemon's signal thread.
    status = alice1->ListGroups().status();
    if (!status.ok()) break;
    absl::SleepFor(absl::Milliseconds(20));
  }
  EXPECT_EQ(status.code(), absl::StatusCode::kUnauthenticated);
  EXPECT_TRUE(Connect(kAlice2)->ListGroups().ok()) << "the other line of the tenant stays";

  // A malformed file on reload keeps the previous one.
  WriteFile(tokens_, "bob " + DigestHex(kBob) + "\nthis line is bad\n");
  ASSERT_EQ(kill(daemon_->pid(), SIGHUP), 0);
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_TRUE(Connect(kAlice2)->ListGroups().ok());
  EXPECT_EQ(Connect(kAlice1)->ListGroups().status().code(), absl::StatusCode::kUnauthenticated);
  EXPECT_THAT(ReadFile(log_), HasSubstr("line 2"));

  // A directory where the file was read as a file of no tokens: every tenant locked out.
  std::filesystem::remove(tokens_);
  std::filesystem::create_directory(tokens_);
  ASSERT_EQ(kill(daemon_->pid(), SIGHUP), 0);
  absl::SleepFor(absl::Milliseconds(300));
  EXPECT_TRUE(Connect(kAlice2)->ListGroups().ok());
  EXPECT_THAT(ReadFile(log_), HasSubstr("cannot be read (it is a directory)"));
}

// A token revoked by SIGHUP also ends its region socket connections, and
// their regions go (their room and the pages the daemon mapped), while the
// tenant's other tokens step on over shared memory.
TEST_F(TenancyTest, ATokenRevokedBySighupEndsItsRegionConnections) {
  StartDaemon();
  auto regions = [&]() -> int64_t {
    grpc::ClientContext context;
    Authorize(&context, kRoot);
    v1::GetStatsRequest request;
    v1::GetStatsResponse response;
    grpc::Status status = Stub()->GetStats(&context, request, &response);
    return status.ok() ? static_cast<int64_t>(response.regions().regions()) : -1;
  };
  ClientOptions options;
  options.token = kAlice1;
  options.max_attempts = 1;
  options.data_plane = DataPlane::kSharedMemory;
  absl::StatusOr<std::unique_ptr<Client>> revoked = Client::Connect(daemon_->target(), options);
  ASSERT_TRUE(revoked.ok());
  ASSERT_TRUE((*revoked)->RegisterGroup("w", Ramp(kPage)).ok());
  std::vector<float> grad(kPage, 0.25f), params(kPage);
  ASSERT_TRUE((*revoked)->Step("w", 1, grad, absl::MakeSpan(params)).ok());
  ASSERT_GE(regions(), 1);
  WriteFile(tokens_, TokensFile(/*with_alice1=*/false));
  ASSERT_EQ(kill(daemon_->pid(), SIGHUP), 0);
  int64_t left = regions();
  for (int i = 0; i < 100 && left != 0; ++i) {  // The reload runs on the signal thread.
    absl::SleepFor(absl::Milliseconds(50));
    left = regions();
  }
  EXPECT_EQ(left, 0) << "the revoked token's regions are still registered";
  EXPECT_THAT(ReadFile(log_), HasSubstr("ended: its token was revoked"));
  EXPECT_EQ((*revoked)->Step("w", 2, grad, absl::MakeSpan(params)).code(),
            absl::StatusCode::kUnauthenticated);
  options.token = kAlice2;
  absl::StatusOr<std::unique_ptr<Client>> kept = Client::Connect(daemon_->target(), options);
  ASSERT_TRUE(kept.ok());
  EXPECT_TRUE((*kept)->Step("w", 2, grad, absl::MakeSpan(params)).ok());
  EXPECT_GE(regions(), 1);
}

TEST_F(TenancyTest, AMalformedTokensFileRefusesTheStartNamingTheLine) {
  WriteFile(tokens_, "# ok\nalice " + DigestHex(kAlice1) + "\nbob " + kBob + "\n");
  absl::StatusOr<std::unique_ptr<DaemonProcess>> daemon =
      DaemonProcess::Start({"--auth_tokens_file=" + tokens_}, log_);
  EXPECT_FALSE(daemon.ok());
  const std::string log = ReadFile(log_);
  EXPECT_THAT(log, HasSubstr("line 3"));
  EXPECT_THAT(log, HasSubstr("SHA-256"));
  EXPECT_THAT(log, Not(HasSubstr(kBob))) << "the field is not echoed";
}

TEST_F(TenancyTest, TenantBCannotSeeOrTouchTenantAsGroup) {
  const std::string state_dir = dir_ + "/state";
  StartDaemon({"--state_dir=" + state_dir});
  std::unique_ptr<Client> alice = Connect(kAlice2);
  std::unique_ptr<Client> bob = Connect(kBob);
  const size_t n = 3 * kPage + 10;
  ASSERT_TRUE(alice->RegisterGroup("shared", Ramp(n)).ok());
  std::vector<float> grad = Ramp(n), params(n);
  for (float& g : grad) g *= 0.01f;
  for (uint64_t t = 1; t <= 3; ++t) {
    ASSERT_TRUE(alice->Step("shared", t, grad, absl::MakeSpan(params)).ok());
  }
  absl::StatusOr<Client::GroupState> before = alice->ExportState("shared");
  ASSERT_TRUE(before.ok()) << before.status();

  // Every operation of B on A's group.
  EXPECT_EQ(bob->Step("shared", 4, grad, absl::MakeSpan(params)).code(),
            absl::StatusCode::kNotFound);
  EXPECT_EQ(bob->DescribeGroup("shared").status().code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(bob->DeleteGroup("shared").code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(bob->ExportState("shared").status().code(), absl::StatusCode::kNotFound);
  Client::CheckpointRequestOptions checkpoint;
  checkpoint.groups = {"shared"};
  checkpoint.wait_for_step = 3;
  EXPECT_EQ(bob->Checkpoint(checkpoint).status().code(), absl::StatusCode::kNotFound);
  // Naming no group, B waits for its own groups only (it has none), not A's at step 3.
  Client::CheckpointRequestOptions own_groups;
  own_groups.wait_for_step = 9;
  absl::StatusOr<Client::CheckpointResult> written = bob->Checkpoint(own_groups);
  EXPECT_TRUE(written.ok()) << written.status();
  absl::StatusOr<std::vector<GroupInfo>> listed = bob->ListGroups();
  ASSERT_TRUE(listed.ok());
  EXPECT_TRUE(listed->empty());
  absl::StatusOr<Stats> stats = bob->GetStats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->num_groups, 0u);
  EXPECT_EQ(stats->host_bytes, 0u);
  EXPECT_EQ(stats->total_elements, 0u);
  {
    // Naming A's tenant explicitly is no way around it.
    grpc::ClientContext context;
    Authorize(&context, kBob);
    v1::DescribeGroupRequest request;
    request.set_name("shared");
    request.set_tenant("alice");
    v1::DescribeGroupResponse reply;
    EXPECT_EQ(Stub()->DescribeGroup(&context, request, &reply).error_code(),
              grpc::StatusCode::NOT_FOUND);
    grpc::ClientContext delete_context;
    Authorize(&delete_context, kBob);
    v1::DeleteGroupRequest del;
    del.set_name("shared");
    del.set_tenant("alice");
    v1::DeleteGroupResponse deleted;
    EXPECT_EQ(Stub()->DeleteGroup(&delete_context, del, &deleted).error_code(),
              grpc::StatusCode::NOT_FOUND);
  }
  // Names are per tenant: B's register and import with A's name make B's
  // own group, of another size, and leave A's alone.
  absl::StatusOr<GroupInfo> own = bob->RegisterGroup("shared", 64);
  ASSERT_TRUE(own.ok()) << own.status();
  EXPECT_TRUE(own->created);
  EXPECT_EQ(own->num_elements, 64u);
  ASSERT_TRUE(bob->DeleteGroup("shared").ok());
  Client::GroupState forged = *before;
  for (float& p : forged.params) p = 7.0f;
  ASSERT_TRUE(bob->ImportState(forged).ok());
  absl::StatusOr<Client::GroupState> bobs = bob->ExportState("shared");
  ASSERT_TRUE(bobs.ok());
  EXPECT_EQ(bobs->params[0], 7.0f);

  absl::StatusOr<Client::GroupState> after = alice->ExportState("shared");
  ASSERT_TRUE(after.ok()) << after.status();
  ExpectSameState(*before, *after);
  absl::StatusOr<GroupInfo> described = alice->DescribeGroup("shared");
  ASSERT_TRUE(described.ok());
  EXPECT_EQ(described->max_step, 3u);
}

TEST_F(TenancyTest, ARestoredCheckpointGivesEachGroupBackToItsTenant) {
  const std::string state_dir = dir_ + "/state";
  StartDaemon({"--state_dir=" + state_dir});
  std::vector<float> grad(100, 0.5f), params(100);
  ASSERT_TRUE(Connect(kAlice2)->RegisterGroup("w", 100).ok());
  ASSERT_TRUE(Connect(kAlice2)->Step("w", 1, grad, absl::MakeSpan(params)).ok());
  ASSERT_TRUE(Connect(kBob)->RegisterGroup("w", 50).ok());
  ASSERT_TRUE(Connect(kBob)->RegisterGroup("v", 50).ok());
  absl::StatusOr<int> exit = daemon_->Stop();  // Writes the final checkpoint.
  ASSERT_TRUE(exit.ok() && *exit == 0);
  daemon_.reset();
  StartDaemon({"--state_dir=" + state_dir});
  // Each tenant counts its own restored groups (it was the daemon's count,
  // and so was the NOT_FOUND note's: other tenants' groups, counted).
  for (const auto& [token, restored] : std::vector<std::pair<std::string, uint64_t>>{
           {kAlice1, 1}, {kBob, 2}, {kCarol, 0}, {kRoot, 3}}) {
    absl::StatusOr<Stats> stats = Connect(token)->GetStats();
    ASSERT_TRUE(stats.ok()) << stats.status();
    EXPECT_EQ(stats->restored_groups, restored);
  }
  EXPECT_THAT(Connect(kCarol)->DescribeGroup("w").status().message(), Not(HasSubstr("restored 3")));
  absl::StatusOr<GroupInfo> alices = Connect(kAlice1)->DescribeGroup("w");
  ASSERT_TRUE(alices.ok()) << alices.status();
  EXPECT_EQ(alices->num_elements, 100u);
  EXPECT_EQ(alices->max_step, 1u);
  absl::StatusOr<GroupInfo> bobs = Connect(kBob)->DescribeGroup("w");
  ASSERT_TRUE(bobs.ok()) << bobs.status();
  EXPECT_EQ(bobs->num_elements, 50u);
  EXPECT_EQ(Connect(kCarol)->DescribeGroup("w").status().code(), absl::StatusCode::kNotFound);
  absl::StatusOr<std::vector<GroupInfo>> all = Connect(kRoot)->ListGroups();
  ASSERT_TRUE(all.ok());
  ASSERT_EQ(all->size(), 3u);
  EXPECT_EQ((*all)[0].tenant, "alice");
  EXPECT_EQ((*all)[1].tenant, "bob");
}

TEST_F(TenancyTest, AnAdminSeesEveryGroupWithItsOwnerAndMayDeleteAny) {
  StartDaemon();
  ASSERT_TRUE(Connect(kAlice2)->RegisterGroup("a", 10).ok());
  ASSERT_TRUE(Connect(kBob)->RegisterGroup("a", 20).ok());
  std::unique_ptr<Client> root = Connect(kRoot);
  absl::StatusOr<std::vector<GroupInfo>> all = root->ListGroups();
  ASSERT_TRUE(all.ok()) << all.status();
  ASSERT_EQ(all->size(), 2u);
  EXPECT_EQ((*all)[0].tenant, "alice");
  EXPECT_EQ((*all)[0].num_elements, 10u);
  EXPECT_EQ((*all)[1].tenant, "bob");
  EXPECT_EQ((*all)[1].num_elements, 20u);
  absl::StatusOr<Stats> stats = root->GetStats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->num_groups, 2u);

  grpc::ClientContext context;
  Authorize(&context, kRoot);
  v1::DeleteGroupRequest request;
  request.set_name("a");
  request.set_tenant("bob");
  v1::DeleteGroupResponse reply;
  grpc::Status deleted = Stub()->DeleteGroup(&context, request, &reply);
  ASSERT_TRUE(deleted.ok()) << deleted.error_message();
  EXPECT_EQ(reply.freed_host_bytes(), 20 * kBytesPerElement);
  EXPECT_TRUE(Connect(kBob)->ListGroups()->empty());
  EXPECT_EQ(Connect(kAlice2)->ListGroups()->size(), 1u);
}

// Groups made before the daemon had a tokens file belong to no tenant (""):
// an admin names them with the owner set to "" (an unset owner is its own),
// so it can describe and delete them; a tenant cannot.
TEST_F(TenancyTest, AnAdminReachesTheGroupsOfNoTenantByNamingTheOwnerEmpty) {
  const std::string state_dir = dir_ + "/state";
  {
    absl::StatusOr<std::unique_ptr<DaemonProcess>> before =
        DaemonProcess::Start({"--threads=2", "--page_elements=1024", "--state_dir=" + state_dir});
    ASSERT_TRUE(before.ok()) << before.status();
    ClientOptions options;
    options.data_plane = DataPlane::kWire;
    absl::StatusOr<std::unique_ptr<Client>> client = Client::Connect((*before)->target(), options);
    ASSERT_TRUE(client.ok()) << client.status();
    ASSERT_TRUE((*client)->RegisterGroup("legacy", 1000).ok());
    absl::StatusOr<int> exit = (*before)->Stop();
    ASSERT_TRUE(exit.ok() && *exit == 0);
  }
  StartDaemon({"--state_dir=" + state_dir});
  auto describe = [&](const std::string& token, const std::optional<std::string>& owner) {
    grpc::ClientContext context;
    Authorize(&context, token);
    v1::DescribeGroupRequest request;
    request.set_name("legacy");
    if (owner) request.set_tenant(*owner);
    v1::DescribeGroupResponse response;
    return Stub()->DescribeGroup(&context, request, &response).error_code();
  };
  EXPECT_EQ(describe(kRoot, std::nullopt), grpc::StatusCode::NOT_FOUND);  // root's own
  EXPECT_EQ(describe(kRoot, ""), grpc::StatusCode::OK);
  EXPECT_EQ(describe(kAlice2, ""), grpc::StatusCode::NOT_FOUND);
  EXPECT_EQ(describe(kAlice2, std::nullopt), grpc::StatusCode::NOT_FOUND);
  grpc::ClientContext context;
  Authorize(&context, kRoot);
  v1::DeleteGroupRequest request;
  request.set_name("legacy");
  request.set_tenant("");
  v1::DeleteGroupResponse deleted;
  grpc::Status status = Stub()->DeleteGroup(&context, request, &deleted);
  ASSERT_TRUE(status.ok()) << status.error_message();
  EXPECT_EQ(deleted.freed_host_bytes(), 1000u * kBytesPerElement);
  EXPECT_EQ(describe(kRoot, ""), grpc::StatusCode::NOT_FOUND);
}

TEST_F(TenancyTest, MaxGroupsIsHitExactlyAtItsBoundary) {
  StartDaemon({"--tenant_max_groups=3"});
  std::unique_ptr<Client> alice = Connect(kAlice1);  // max_groups=2 in the file.
  ASSERT_TRUE(alice->RegisterGroup("g1", 10).ok());
  ASSERT_TRUE(alice->RegisterGroup("g2", 10).ok());
  absl::StatusOr<GroupInfo> third = alice->RegisterGroup("g3", 10);
  EXPECT_EQ(third.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(third.status().message(), HasSubstr("max_groups=2"));
  EXPECT_THAT(third.status().message(), HasSubstr("holds 2 groups"));
  EXPECT_TRUE(alice->RegisterGroup("g1", 10).ok()) << "an equal re-registration is no new group";
  EXPECT_EQ(alice->ListGroups()->size(), 2u);
  // An import over the quota creates nothing either.
  Client::GroupState state;
  state.name = "g4";
  state.params.assign(10, 1.0f);
  state.exp_avg.assign(10, 0.0f);
  state.exp_avg_sq.assign(10, 0.0f);
  state.page_steps = {0};
  EXPECT_EQ(alice->ImportState(state).code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(alice->ListGroups()->size(), 2u);
  // bob has no max_groups line: the daemon's default, 3; alice's use does not count.
  std::unique_ptr<Client> bob = Connect(kBob);
  for (int i = 0; i < 3; ++i) ASSERT_TRUE(bob->RegisterGroup(absl::StrCat("b", i), 10).ok());
  EXPECT_EQ(bob->RegisterGroup("b3", 10).status().code(), absl::StatusCode::kResourceExhausted);
  // Deleting makes room again.
  ASSERT_TRUE(alice->DeleteGroup("g2").ok());
  EXPECT_TRUE(alice->RegisterGroup("g3", 10).ok());
}

TEST_F(TenancyTest, MaxHostBytesIsHitExactlyAtItsBoundary) {
  StartDaemon();
  std::unique_ptr<Client> carol = Connect(kCarol);  // max_host_bytes = 2 pages of state.
  ASSERT_TRUE(carol->RegisterGroup("half", kPage).ok());
  absl::StatusOr<GroupInfo> over = carol->RegisterGroup("over", kPage + 1);
  EXPECT_EQ(over.status().code(), absl::StatusCode::kResourceExhausted);
  EXPECT_THAT(over.status().message(),
              HasSubstr(absl::StrCat("uses ", kPage * kBytesPerElement,
                                     " of its quota max_host_bytes=", 2 * kPage * kBytesPerElement)));
  ASSERT_TRUE(carol->RegisterGroup("exact", kPage).ok()) << "exactly at the quota";
  EXPECT_EQ(carol->RegisterGroup("one", 1).status().code(), absl::StatusCode::kResourceExhausted);
  absl::StatusOr<Stats> stats = carol->GetStats();
  ASSERT_TRUE(stats.ok());
  EXPECT_EQ(stats->num_groups, 2u);
  EXPECT_EQ(stats->host_bytes, 2 * kPage * kBytesPerElement);
  EXPECT_EQ(stats->max_host_bytes, 2 * kPage * kBytesPerElement);
  // Another tenant is unaffected.
  EXPECT_TRUE(Connect(kBob)->RegisterGroup("big", 4 * kPage).ok());
}

// A tenant refused for the daemon's own limit was told the daemon's free
// and total bytes, which count other tenants' groups (GetStats shows a
// tenant its own use only).
TEST_F(TenancyTest, ATenantRefusedForTheDaemonsLimitIsNotToldTheDaemonsTotals) {
  const uint64_t limit = 4 * kPage * kBytesPerElement;
  StartDaemon({absl::StrCat("--max_host_bytes=", limit)});
  std::unique_ptr<Client> bob = Connect(kBob);
  ASSERT_TRUE(bob->RegisterGroup("big", 3 * kPage).ok());
  std::unique_ptr<Client> alice = Connect(kAlice2);
  absl::StatusOr<GroupInfo> refused = alice->RegisterGroup("g", 2 * kPage);
  ASSERT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted) << refused.status();
  const std::string message(refused.status().message());
  EXPECT_THAT(message, HasSubstr("other tenants' groups count there too"));
  EXPECT_THAT(message, Not(HasSubstr(absl::StrCat(limit))));
  EXPECT_THAT(message, Not(HasSubstr(absl::StrCat(kPage * kBytesPerElement))));  // free bytes
}

// Daemon-wide figures and texts that may name another tenant's groups are
// an admin's: a tenant's GetStats has no heap, device budget or last
// checkpoint size and step, and refusals of a restore (which name the groups
// they could not set up) reach it only as a pointer to an admin.
// A checkpoint that fails to write names its files: a tenant is told them by
// checkpoint, not by the daemon's --state_dir path; an admin sees the path.
TEST_F(TenancyTest, AFailedCheckpointNamesNoStateDirPathToATenant) {
  const std::string state_dir = dir_ + "/state";
  StartDaemon({"--state_dir=" + state_dir, "--checkpoint_interval=0"});
  ASSERT_TRUE(Connect(kAlice2)->RegisterGroup("a", 16).ok());
  auto checkpoint = [&](const std::string& token) {
    grpc::ClientContext context;
    Authorize(&context, token);
    v1::CheckpointResponse response;
    return Stub()->Checkpoint(&context, v1::CheckpointRequest(), &response);
  };
  ASSERT_TRUE(checkpoint(kRoot).ok());
  // A directory, not empty, where the next checkpoints go: their renames fail.
  for (const char* next : {"ckpt-0000000000000002", "ckpt-0000000000000003"}) {
    std::filesystem::create_directories(state_dir + "/" + next + "/in-the-way");
  }
  grpc::Status alices = checkpoint(kAlice2);
  EXPECT_FALSE(alices.ok());
  EXPECT_THAT(alices.error_message(), HasSubstr("ckpt-000000000000000"));
  EXPECT_THAT(alices.error_message(), Not(HasSubstr(state_dir)));
  grpc::Status roots = checkpoint(kRoot);
  EXPECT_FALSE(roots.ok());
  EXPECT_THAT(roots.error_message(), HasSubstr(state_dir));
  for (const char* next : {"ckpt-0000000000000002", "ckpt-0000000000000003"}) {
    std::filesystem::remove_all(state_dir + "/" + next);
  }
}

TEST_F(TenancyTest, ATenantIsNotToldOtherTenantsCheckpointsOrRefusals) {
  const std::string state_dir = dir_ + "/state";
  StartDaemon({"--state_dir=" + state_dir});
  std::vector<float> grad(3 * kPage, 0.5f), params(3 * kPage);
  std::unique_ptr<Client> bob = Connect(kBob);
  ASSERT_TRUE(bob->RegisterGroup("bobs-secret-model", 3 * kPage).ok());
  for (uint64_t step = 1; step <= 3; ++step) {
    ASSERT_TRUE(bob->Step("bobs-secret-model", step, grad, absl::MakeSpan(params)).ok());
  }
  ASSERT_TRUE(Connect(kAlice2)->RegisterGroup("a", 16).ok());
  auto stats_of = [&](const std::string& token) {
    grpc::ClientContext context;
    Authorize(&context, token);
    v1::GetStatsResponse stats;
    grpc::Status status = Stub()->GetStats(&context, v1::GetStatsRequest(), &stats);
    EXPECT_TRUE(status.ok()) << status.error_message();
    return stats;
  };
  auto checkpoint = [&](const std::string& token, v1::CheckpointResponse* response) {
    grpc::ClientContext context;
    Authorize(&context, token);
    return Stub()->Checkpoint(&context, v1::CheckpointRequest(), response);
  };
  v1::CheckpointResponse alices;
  ASSERT_TRUE(checkpoint(kAlice2, &alices).ok());
  EXPECT_EQ(alices.bytes(), 0u) << "the checkpoint's size counts bob's groups";
  v1::CheckpointResponse roots;
  ASSERT_TRUE(checkpoint(kRoot, &roots).ok());
  EXPECT_GT(roots.bytes(), 3 * kPage * kBytesPerElement);
  Client::CheckpointRequestOptions bobs_step;
  bobs_step.groups = {"bobs-secret-model"};
  bobs_step.wait_for_step = 3;
  absl::StatusOr<Client::CheckpointResult> bobs = bob->Checkpoint(bobs_step);
  ASSERT_TRUE(bobs.ok()) << bobs.status();
  const v1::GetStatsResponse alice_sees = stats_of(kAlice2);
  EXPECT_EQ(alice_sees.last_checkpoint().id(), bobs->id);
  EXPECT_EQ(alice_sees.last_checkpoint().step(), 0u) << "bob's step";
  EXPECT_EQ(alice_sees.last_checkpoint().bytes(), 0u);
  EXPECT_EQ(alice_sees.heap_resident_bytes(), 0u);
  EXPECT_EQ(alice_sees.heap_in_use_bytes(), 0u);
  const v1::GetStatsResponse root_sees = stats_of(kRoot);
  EXPECT_EQ(root_sees.last_checkpoint().step(), 3u);
  EXPECT_EQ(root_sees.last_checkpoint().bytes(), roots.bytes());
#ifndef __SANITIZE_ADDRESS__  // ASan's allocator leaves glibc's heap empty for everyone.
  EXPECT_GT(root_sees.heap_resident_bytes(), 0u);
#endif

  auto rewind_as = [&](const std::string& token, const std::string& prefix,
                       std::optional<uint64_t> step, bool validate_only,
                       v1::RewindJobResponse* rewound) {
    grpc::ClientContext context;
    Authorize(&context, token);
    v1::RewindJobRequest rewind;
    rewind.set_prefix(prefix);
    if (step.has_value()) rewind.set_step(*step);
    rewind.set_validate_only(validate_only);
    return Stub()->RewindJob(&context, rewind, rewound);
  };
  {
    // A rewind that wrote its checkpoint says nothing was left unwritten.
    v1::RewindJobResponse rewound;
    grpc::Status status = rewind_as(kBob, "bobs-", 3, false, &rewound);
    ASSERT_TRUE(status.ok()) << status.error_message();
    EXPECT_FALSE(rewound.written_checkpoint_id().empty());
    EXPECT_EQ(rewound.not_written(), "");
  }
  {
    // A rewind that finds nothing names the checkpoints it passed over, not
    // where the daemon keeps them.
    v1::RewindJobResponse rewound;
    grpc::Status status = rewind_as(kBob, "bobs-", 77, false, &rewound);
    EXPECT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND);
    EXPECT_THAT(status.error_message(), HasSubstr("ckpt-"));
    EXPECT_THAT(status.error_message(), Not(HasSubstr(state_dir)));
  }
  {
    // A checkpoint whose manifest (every tenant's groups) is damaged: a
    // tenant's rewind is told it could not be read, an admin's why.
    std::vector<std::string> checkpoints;
    for (const auto& entry : std::filesystem::directory_iterator(state_dir)) {
      if (absl::StartsWith(entry.path().filename().string(), "ckpt-")) {
        checkpoints.push_back(entry.path().string());
      }
    }
    ASSERT_FALSE(checkpoints.empty());
    std::sort(checkpoints.begin(), checkpoints.end());
    const std::string manifest = checkpoints.back() + "/MANIFEST";
    const std::string intact = ReadFile(manifest);
    std::string damaged = intact;
    const size_t at = damaged.find("bobs-secret-model");
    ASSERT_NE(at, std::string::npos);
    damaged[at] = 'B';
    WriteFile(manifest, damaged);
    auto rewind_message = [&](const std::string& token) {
      v1::RewindJobResponse rewound;
      grpc::Status status = rewind_as(token, "a", std::nullopt, true, &rewound);
      std::string told = status.error_message();
      for (const std::string& p : rewound.passed_over()) absl::StrAppend(&told, "\n", p);
      return told;
    };
    const std::string alice_told = rewind_message(kAlice2);
    EXPECT_THAT(alice_told, HasSubstr("could not be read (the reason may name other tenants'"));
    EXPECT_THAT(alice_told, Not(HasSubstr("checksum")));
    EXPECT_THAT(rewind_message(kRoot), HasSubstr("manifest checksum mismatch"));
    WriteFile(manifest, intact);
  }

  // Restarted with room for alice's group and not bob's: the restore is
  // refused naming bob's group, and no checkpoint is written after it.
  absl::StatusOr<int> exit = daemon_->Stop();
  ASSERT_TRUE(exit.ok() && *exit == 0);
  daemon_.reset();
  StartDaemon({"--state_dir=" + state_dir,
               absl::StrCat("--max_host_bytes=", 2 * kPage * kBytesPerElement)});
  const v1::GetStatsResponse refused_root = stats_of(kRoot);
  ASSERT_FALSE(refused_root.restore_refusals().empty());
  EXPECT_THAT(refused_root.restore_refusals(0), HasSubstr("bobs-secret-model"));
  const v1::GetStatsResponse refused_alice = stats_of(kAlice2);
  ASSERT_EQ(refused_alice.restore_refusals_size(), refused_root.restore_refusals_size());
  for (const std::string& refusal : refused_alice.restore_refusals()) {
    EXPECT_THAT(refusal, Not(HasSubstr("bobs-secret-model")));
    EXPECT_THAT(refusal, HasSubstr("admin"));
  }
  v1::CheckpointResponse none;
  grpc::Status refused = checkpoint(kAlice2, &none);
  EXPECT_EQ(refused.error_code(), grpc::StatusCode::FAILED_PRECONDITION);
  EXPECT_THAT(refused.error_message(), Not(HasSubstr("bobs-secret-model")));
  EXPECT_THAT(refused.error_message(), HasSubstr("admin's GetStats"));
  EXPECT_THAT(stats_of(kAlice2).last_checkpoint_error(), Not(HasSubstr("bobs-secret-model")));
  EXPECT_THAT(checkpoint(kRoot, &none).error_message(), HasSubstr("bobs-secret-model"));
  absl::StatusOr<int> refused_exit = daemon_->Stop();  // Its final checkpoint refused too.
  ASSERT_TRUE(refused_exit.ok()) << refused_exit.status();
  EXPECT_EQ(*refused_exit, 3);
  daemon_.reset();
}

TEST_F(TenancyTest, ConcurrentStepStreamsAreLimitedPerTenant) {
  StartDaemon({"--tenant_max_streams=1"});
  auto stub = Stub();
  grpc::ClientContext first_context;
  Authorize(&first_context, kBob);
  auto first = stub->Step(&first_context);  // Held open, idle.
  absl::SleepFor(absl::Milliseconds(300));
  {
    grpc::ClientContext context;
    Authorize(&context, kBob);
    auto second = stub->Step(&context);
    v1::StepResponse reply;
    EXPECT_FALSE(second->Read(&reply));
    grpc::Status status = second->Finish();
    EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
    EXPECT_THAT(status.error_message(), HasSubstr("--tenant_max_streams=1"));
  }
  // Another tenant steps meanwhile.
  std::unique_ptr<Client> alice = Connect(kAlice2);
  ASSERT_TRUE(alice->RegisterGroup("w", 100).ok());
  std::vector<float> grad(100, 0.5f), params(100);
  EXPECT_TRUE(alice->Step("w", 1, grad, absl::MakeSpan(params)).ok());
  // Once the first has its status, bob may open another at once: the slot
  // is given back before the status is sent.
  first->WritesDone();
  EXPECT_TRUE(first->Finish().ok());
  std::unique_ptr<Client> bob = Connect(kBob);
  ASSERT_TRUE(bob->RegisterGroup("w", 100).ok());
  EXPECT_TRUE(bob->Step("w", 1, grad, absl::MakeSpan(params)).ok());
  // Streams one after another, each refused: the next never finds the place
  // still taken by the one before.
  for (int i = 0; i < 500; ++i) {
    grpc::ClientContext context;
    Authorize(&context, kBob);
    auto stream = stub->Step(&context);
    v1::StepRequest request;
    request.set_group("no-such-group");
    request.set_step(1);
    request.set_gradient(std::string(4 * sizeof(float), '\0'));
    stream->Write(request);
    stream->WritesDone();
    v1::StepResponse reply;
    while (stream->Read(&reply)) {
    }
    grpc::Status status = stream->Finish();
    ASSERT_EQ(status.error_code(), grpc::StatusCode::NOT_FOUND)
        << "stream " << i << ": " << status.error_message();
  }
}

// An ExportState stream its client does not read holds its next message in
// the daemon: such streams are limited per tenant as Step streams are (and
// counted apart from them).
TEST_F(TenancyTest, ConcurrentExportStreamsAreLimitedPerTenant) {
  StartDaemon({"--tenant_max_streams=1"});
  std::unique_ptr<Client> bob = Connect(kBob);
  constexpr size_t kElements = 4 << 20;  // 64 MB exported: more than gRPC's windows.
  ASSERT_TRUE(bob->RegisterGroup("w", Ramp(kElements)).ok());
  auto stub = Stub();
  grpc::ClientContext first_context;
  Authorize(&first_context, kBob);
  first_context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(60));
  v1::ExportStateRequest request;
  request.set_name("w");
  auto first = stub->ExportState(&first_context, request);  // Never read.
  absl::SleepFor(absl::Milliseconds(300));
  {
    grpc::ClientContext context;
    Authorize(&context, kBob);
    context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(10));
    auto second = stub->ExportState(&context, request);
    v1::ExportStateResponse reply;
    EXPECT_FALSE(second->Read(&reply));
    grpc::Status status = second->Finish();
    EXPECT_EQ(status.error_code(), grpc::StatusCode::RESOURCE_EXHAUSTED);
    EXPECT_THAT(status.error_message(), HasSubstr("--tenant_max_streams=1"));
  }
  // A Step stream of the same tenant, and another tenant's export, go on.
  std::vector<float> grad(kElements, 0.5f), params(kElements);
  EXPECT_TRUE(bob->Step("w", 1, grad, absl::MakeSpan(params)).ok());
  std::unique_ptr<Client> alice = Connect(kAlice2);
  ASSERT_TRUE(alice->RegisterGroup("a", Ramp(100)).ok());
  EXPECT_TRUE(alice->ExportState("a").ok());
  first_context.TryCancel();
  first->Finish();
  // The daemon sees the cancellation a moment later; until then the place is
  // held.
  absl::StatusOr<Client::GroupState> after_cancel = bob->ExportState("w");
  for (int i = 0; i < 100 && !after_cancel.ok(); ++i) {
    EXPECT_THAT(after_cancel.status().message(), HasSubstr("1 ExportState streams open"));
    absl::SleepFor(absl::Milliseconds(50));
    after_cancel = bob->ExportState("w");
  }
  ASSERT_TRUE(after_cancel.ok()) << after_cancel.status();
  // Exports one after another: each finds the place the one before gave back
  // with its status.
  for (int i = 0; i < 50; ++i) {
    absl::StatusOr<Client::GroupState> state = bob->ExportState("w");
    ASSERT_TRUE(state.ok()) << "export " << i << ": " << state.status();
  }
}

TEST_F(TenancyTest, SharedMemoryStepsWithATokenAndTheRegionSocketRefusesNone) {
  StartDaemon();
  ClientOptions options;
  options.token = kAlice2;
  options.data_plane = DataPlane::kSharedMemory;
  absl::StatusOr<std::unique_ptr<Client>> alice = Client::Connect(daemon_->target(), options);
  ASSERT_TRUE(alice.ok());
  ASSERT_TRUE((*alice)->RegisterGroup("w", Ramp(kPage)).ok());
  std::vector<float> grad(kPage, 0.25f), over_shm(kPage), over_wire(kPage);
  ASSERT_TRUE((*alice)->Step("w", 1, grad, absl::MakeSpan(over_shm)).ok());
  // The same step on the wire for another tenant's copy gives the same bits.
  std::unique_ptr<Client> bob = Connect(kBob);
  ASSERT_TRUE(bob->RegisterGroup("w", Ramp(kPage)).ok());
  ASSERT_TRUE(bob->Step("w", 1, grad, absl::MakeSpan(over_wire)).ok());
  EXPECT_EQ(over_shm, over_wire);
  // Without a token the region socket registers nothing (the client's
  // shared memory plane fails; GetDataPlane itself needs the token).
  options.token = "";
  absl::StatusOr<std::unique_ptr<Client>> anonymous = Client::Connect(daemon_->target(), options);
  ASSERT_TRUE(anonymous.ok());
  EXPECT_EQ((*anonymous)->Step("w", 2, grad, absl::MakeSpan(over_shm)).code(),
            absl::StatusCode::kUnauthenticated);
}

namespace rp = region_protocol;

std::string RegionSocketOf(const std::string& target, const std::string& token) {
  auto stub =
      v1::DataPlane::NewStub(grpc::CreateChannel(target, grpc::InsecureChannelCredentials()));
  grpc::ClientContext context;
  context.AddMetadata("authorization", "Bearer " + token);
  v1::GetDataPlaneResponse response;
  EXPECT_TRUE(stub->GetDataPlane(&context, v1::GetDataPlaneRequest(), &response).ok());
  return response.region_socket();
}

absl::Status RegisterMemfd(int socket, int memfd) {
  rp::Request request;
  request.op = static_cast<uint32_t>(rp::Op::kRegister);
  absl::StatusOr<rp::Reply> reply = rp::Call(socket, request, memfd);
  return reply.ok() ? rp::StatusOf(*reply) : reply.status();
}

// A region socket connection that never authenticates is ended after 10 s
// (ones that never did held the connection slots of every tenant's
// trainers); an authenticated one stays.
TEST_F(TenancyTest, ARegionSocketConnectionThatNeverAuthenticatesIsEnded) {
  StartDaemon();
  const std::string path = RegionSocketOf(daemon_->target(), kAlice2);
  ASSERT_FALSE(path.empty());
  rp::Reply hello;
  absl::StatusOr<int> anonymous = rp::Connect(path, &hello);
  ASSERT_TRUE(anonymous.ok()) << anonymous.status();
  absl::StatusOr<int> alices = rp::Connect(path, &hello);
  ASSERT_TRUE(alices.ok()) << alices.status();
  ASSERT_TRUE(rp::Authenticate(*alices, kAlice2).ok());
  absl::SleepFor(absl::Seconds(11));
  char byte;
  EXPECT_EQ(recv(*anonymous, &byte, 1, MSG_DONTWAIT), 0) << "still open";
  const uint64_t bytes = kPage * sizeof(float);
  absl::StatusOr<int> memfd = rp::CreateSealedMemfd("tenancy", bytes);
  ASSERT_TRUE(memfd.ok());
  EXPECT_TRUE(RegisterMemfd(*alices, *memfd).ok());
  close(*memfd);
  close(*anonymous);
  close(*alices);
}

TEST_F(TenancyTest, TheRegionSocketNeedsATokenAndARegionIsNamedOnlyByItsTenant) {
  StartDaemon();
  const std::string path = RegionSocketOf(daemon_->target(), kAlice2);
  ASSERT_FALSE(path.empty());
  const uint64_t bytes = 2 * kPage * sizeof(float);
  absl::StatusOr<int> memfd = rp::CreateSealedMemfd("tenancy", bytes);
  ASSERT_TRUE(memfd.ok());
  rp::Reply hello;
  absl::StatusOr<int> anonymous = rp::Connect(path, &hello);
  ASSERT_TRUE(anonymous.ok());
  EXPECT_EQ(RegisterMemfd(*anonymous, *memfd).code(), absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(rp::Authenticate(*anonymous, "wrong-token").code(),
            absl::StatusCode::kUnauthenticated);
  EXPECT_EQ(RegisterMemfd(*anonymous, *memfd).code(), absl::StatusCode::kUnauthenticated);
  close(*anonymous);

  // alice's region, authenticated with her token.
  absl::StatusOr<int> socket = rp::Connect(path, &hello);
  ASSERT_TRUE(socket.ok());
  const std::string key(reinterpret_cast<char*>(hello.session_key), rp::kKeyBytes);
  ASSERT_TRUE(rp::Authenticate(*socket, kAlice2).ok());
  rp::Request request;
  request.op = static_cast<uint32_t>(rp::Op::kRegister);
  absl::StatusOr<rp::Reply> registered = rp::Call(*socket, request, *memfd);
  ASSERT_TRUE(registered.ok() && rp::StatusOf(*registered).ok());
  float* base = static_cast<float*>(
      mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_SHARED, *memfd, 0));
  ASSERT_NE(base, MAP_FAILED);
  for (uint64_t i = 0; i < 2 * kPage; ++i) base[i] = 0.125f;
  const std::vector<float> region_before(base, base + 2 * kPage);

  // bob names alice's session and region in a step of his own group.
  ASSERT_TRUE(Connect(kBob)->RegisterGroup("w", kPage).ok());
  grpc::ClientContext context;
  Authorize(&context, kBob);
  auto stream = Stub()->Step(&context);
  v1::StepRequest chunk;
  chunk.set_group("w");
  chunk.set_step(1);
  chunk.set_region_session(key);
  chunk.mutable_gradient_region()->set_region(registered->region);
  chunk.mutable_gradient_region()->set_bytes(kPage * 4);
  chunk.mutable_params_region()->set_region(registered->region);
  chunk.mutable_params_region()->set_offset(kPage * 4);
  chunk.mutable_params_region()->set_bytes(kPage * 4);
  ASSERT_TRUE(stream->Write(chunk));
  v1::StepResponse reply;
  EXPECT_FALSE(stream->Read(&reply));
  EXPECT_EQ(stream->Finish().error_code(), grpc::StatusCode::NOT_FOUND);
  EXPECT_TRUE(std::equal(region_before.begin(), region_before.end(), base))
      << "nothing was written into alice's region";
  absl::StatusOr<GroupInfo> bobs = Connect(kBob)->DescribeGroup("w");
  ASSERT_TRUE(bobs.ok());
  EXPECT_EQ(bobs->max_step, 0u) << "bob's group was not stepped";

  // alice's step of her group, kept as step plan 1 of her session; bob
  // naming that plan with her session key finds nothing, and steps nothing.
  ASSERT_TRUE(Connect(kAlice2)->RegisterGroup("a", kPage).ok());
  {
    grpc::ClientContext alices;
    Authorize(&alices, kAlice2);
    auto defining = Stub()->Step(&alices);
    v1::StepRequest definition = chunk;
    definition.set_group("a");
    definition.set_plan(1);
    ASSERT_TRUE(defining->Write(definition));
    defining->WritesDone();
    EXPECT_TRUE(defining->Read(&reply));
    EXPECT_TRUE(defining->Finish().ok());
  }
  const std::vector<float> after_alices(base, base + 2 * kPage);
  {
    grpc::ClientContext bobs_use;
    Authorize(&bobs_use, kBob);
    auto using_plan = Stub()->Step(&bobs_use);
    v1::StepRequest use;
    use.set_plan(1);
    use.set_step(2);
    use.set_region_session(key);
    ASSERT_TRUE(using_plan->Write(use));
    using_plan->WritesDone();
    EXPECT_FALSE(using_plan->Read(&reply));
    EXPECT_EQ(using_plan->Finish().error_code(), grpc::StatusCode::NOT_FOUND);
  }
  EXPECT_TRUE(std::equal(after_alices.begin(), after_alices.end(), base))
      << "nothing was written into alice's region by bob's use of her plan";
  absl::StatusOr<GroupInfo> alices_group = Connect(kAlice2)->DescribeGroup("a");
  ASSERT_TRUE(alices_group.ok());
  EXPECT_EQ(alices_group->max_step, 1u) << "alice's group was stepped by her step alone";
  munmap(base, bytes);
  close(*memfd);
  close(*socket);
}

}  // namespace
}  // namespace optstate::testing

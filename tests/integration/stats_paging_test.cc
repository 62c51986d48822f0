// GetStats and ListGroups page through many groups (page_size, page_token as
// the Google API design guide's List methods) where one message could not
// hold them all, with totals on every page; bad page requests are
// INVALID_ARGUMENT.
#include <gtest/gtest.h>

#include <set>

#include "absl/strings/str_cat.h"
#include "grpcpp/grpcpp.h"
#include "optstate/client.h"
#include "optstate/v1/optstate.grpc.pb.h"
#include "tests/testing/daemon_process.h"
#include "tests/testing/raw_rpc.h"

namespace optstate::testing {
namespace {

constexpr int kGroups = 2500;
constexpr uint64_t kElements = 10;

// 400 characters: 2,500 groups' stats come to about 1.4 MB, past the 1 MiB limit.
std::string NameOf(int i) {
  std::string name = absl::StrCat("group.", 10000 + i, ".");
  name.resize(400, 'n');
  return name;
}

class StatsPagingTest : public ::testing::Test {
 public:
  static void SetUpTestSuite() {
    auto daemon = DaemonProcess::Start({"--threads=2", "--max_message_bytes=1052672"});
    ASSERT_TRUE(daemon.ok()) << daemon.status();
    daemon_ = daemon->release();
    stub_ = v1::OptimizerState::NewStub(OwnChannel(daemon_->target())).release();
    for (int i = 0; i < kGroups; ++i) {
      grpc::ClientContext context;
      v1::RegisterGroupResponse response;
      auto writer = stub_->RegisterGroup(&context, &response);
      v1::RegisterGroupRequest request;
      request.mutable_spec()->set_name(NameOf(i));
      request.mutable_spec()->set_num_elements(kElements);
      ASSERT_TRUE(writer->Write(request));
      writer->WritesDone();
      ASSERT_TRUE(writer->Finish().ok()) << i;
    }
  }
  static void TearDownTestSuite() {
    delete stub_;
    delete daemon_;
  }

  static grpc::Status Stats(int32_t page_size, const std::string& token,
                            v1::GetStatsResponse* out) {
    grpc::ClientContext context;
    v1::GetStatsRequest request;
    request.set_page_size(page_size);
    request.set_page_token(token);
    return stub_->GetStats(&context, request, out);
  }
  static grpc::Status List(int32_t page_size, const std::string& token,
                           v1::ListGroupsResponse* out) {
    grpc::ClientContext context;
    v1::ListGroupsRequest request;
    request.set_page_size(page_size);
    request.set_page_token(token);
    return stub_->ListGroups(&context, request, out);
  }

  static DaemonProcess* daemon_;
  static v1::OptimizerState::Stub* stub_;
};

DaemonProcess* StatsPagingTest::daemon_ = nullptr;
v1::OptimizerState::Stub* StatsPagingTest::stub_ = nullptr;

TEST_F(StatsPagingTest, ADefaultRequestAnswersTheFirstPageAndAllTotals) {
  v1::GetStatsResponse stats;
  grpc::Status status = Stats(0, "", &stats);
  ASSERT_TRUE(status.ok()) << status.error_code() << " " << status.error_message();
  EXPECT_EQ(stats.num_groups(), static_cast<uint64_t>(kGroups));
  EXPECT_EQ(stats.total_elements(), kGroups * kElements);
  EXPECT_EQ(stats.host_bytes(), kGroups * kElements * 12);
  EXPECT_GT(stats.groups_size(), 0);
  EXPECT_LE(stats.groups_size(), 1000);
  EXPECT_FALSE(stats.next_page_token().empty());
  EXPECT_EQ(stats.groups(0).info().name(), NameOf(0));  // By name.
}

TEST_F(StatsPagingTest, PagesCoverEveryGroupOnceInOrder) {
  std::vector<std::string> names;
  std::string token;
  int pages = 0;
  do {
    v1::GetStatsResponse stats;
    ASSERT_TRUE(Stats(300, token, &stats).ok());
    EXPECT_LE(stats.groups_size(), 300);
    EXPECT_EQ(stats.num_groups(), static_cast<uint64_t>(kGroups)) << "page " << pages;
    for (const auto& g : stats.groups()) names.push_back(g.info().name());
    token = stats.next_page_token();
    ASSERT_LT(++pages, 100);
  } while (!token.empty());
  ASSERT_EQ(names.size(), static_cast<size_t>(kGroups));
  for (int i = 0; i < kGroups; ++i) EXPECT_EQ(names[i], NameOf(i));
  EXPECT_EQ(pages, (kGroups + 299) / 300);
}

TEST_F(StatsPagingTest, ListGroupsPagesTooAndTheClientReadsThemAll) {
  v1::ListGroupsResponse first;
  ASSERT_TRUE(List(1000, "", &first).ok());
  EXPECT_EQ(first.groups_size(), 1000);
  EXPECT_EQ(first.num_groups(), static_cast<uint64_t>(kGroups));
  EXPECT_FALSE(first.next_page_token().empty());
  v1::ListGroupsResponse capped;  // Past the maximum: read as 1000.
  ASSERT_TRUE(List(1 << 30, "", &capped).ok());
  EXPECT_LE(capped.groups_size(), 1000);
  auto client = Client::Connect(daemon_->target(), ClientOptions{});
  ASSERT_TRUE(client.ok());
  absl::StatusOr<std::vector<GroupInfo>> all = (*client)->ListGroups();
  ASSERT_TRUE(all.ok()) << all.status();
  ASSERT_EQ(all->size(), static_cast<size_t>(kGroups));
  for (int i = 0; i < kGroups; ++i) EXPECT_EQ((*all)[i].name, NameOf(i));
}

TEST_F(StatsPagingTest, BadPageRequestsAreInvalidArgument) {
  v1::GetStatsResponse stats;
  grpc::Status status = Stats(0, "not-a-token", &stats);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(status.error_message().find("page_token"), std::string::npos) << status.error_message();
  status = Stats(-1, "", &stats);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
  EXPECT_NE(status.error_message().find("page_size"), std::string::npos) << status.error_message();
  v1::ListGroupsResponse list;
  status = List(0, "not-a-token", &list);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT);
}

// A token names the last group answered, so groups deleted or registered
// between pages neither make the next page skip nor repeat any other group.
TEST(StatsPagingChurnTest, GroupsComingAndGoingBetweenPagesSkipAndRepeatNoOther) {
  auto daemon = DaemonProcess::Start({"--threads=2"});
  ASSERT_TRUE(daemon.ok()) << daemon.status();
  auto client = Client::Connect((*daemon)->target());
  ASSERT_TRUE(client.ok());
  auto name = [](int i) { return absl::StrCat("m", 100 + i); };
  for (int i = 0; i < 30; ++i) ASSERT_TRUE((*client)->RegisterGroup(name(i), 4).ok());
  auto stub = v1::OptimizerState::NewStub(OwnChannel((*daemon)->target()));
  auto page = [&](const std::string& token, v1::ListGroupsResponse* out) {
    grpc::ClientContext context;
    v1::ListGroupsRequest request;
    request.set_page_size(10);
    request.set_page_token(token);
    return stub->ListGroups(&context, request, out);
  };
  v1::ListGroupsResponse first;
  ASSERT_TRUE(page("", &first).ok());
  ASSERT_EQ(first.groups_size(), 10);
  EXPECT_EQ(first.groups(9).name(), name(9));
  // The page's last group and the next one go; one sorting before the token comes.
  ASSERT_TRUE((*client)->DeleteGroup(name(9)).ok());
  ASSERT_TRUE((*client)->DeleteGroup(name(10)).ok());
  ASSERT_TRUE((*client)->RegisterGroup("m000", 4).ok());
  v1::ListGroupsResponse second;
  ASSERT_TRUE(page(first.next_page_token(), &second).ok());
  EXPECT_EQ(second.num_groups(), 29u);
  ASSERT_EQ(second.groups_size(), 10);
  for (int i = 0; i < 10; ++i) EXPECT_EQ(second.groups(i).name(), name(11 + i));
  v1::ListGroupsResponse third;
  ASSERT_TRUE(page(second.next_page_token(), &third).ok());
  ASSERT_EQ(third.groups_size(), 9);
  EXPECT_EQ(third.groups(8).name(), name(29));
  EXPECT_TRUE(third.next_page_token().empty());
}

}  // namespace
}  // namespace optstate::testing

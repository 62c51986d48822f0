// Bad server options: refused at start, with a message that says what to fix.
#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "server/server.h"

namespace optstate::testing {
namespace {

// Two daemons on one port would split the clients between two states.
TEST(ServerOptionsTest, ASecondServerOnATakenPortDoesNotStart) {
  ServerOptions options;
  options.listen = "127.0.0.1:0";
  options.backend.kind = "cpu";
  absl::StatusOr<std::unique_ptr<Server>> first = Server::Start(options);
  ASSERT_TRUE(first.ok()) << first.status();
  options.listen = "127.0.0.1:" + std::to_string((*first)->port());
  absl::StatusOr<std::unique_ptr<Server>> second = Server::Start(options);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable) << second.status();
  EXPECT_NE(second.status().message().find("address in use"), std::string::npos) << second.status();
}

TEST(ServerOptionsTest, AMessageLimitThatCannotHoldOnePageIsRefused) {
  ServerOptions options;
  options.listen = "127.0.0.1:0";
  options.backend.kind = "cpu";
  options.page_elements = 1 << 20;  // 4 MiB of float32.
  options.max_message_bytes = 4 << 20;
  absl::StatusOr<std::unique_ptr<Server>> server = Server::Start(options);
  EXPECT_EQ(server.status().code(), absl::StatusCode::kInvalidArgument) << server.status();
  EXPECT_NE(server.status().message().find("--max_message_bytes must be at least 4198400"),
            std::string::npos)
      << server.status();
}

}  // namespace
}  // namespace optstate::testing

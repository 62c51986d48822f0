// Bad server options: refused at start, with a message that says what to fix.
#include <gtest/gtest.h>

#include <functional>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "server/kernels/adamw_kernel.h"
#include "server/server.h"

namespace optstate::testing {
namespace {

// A CPU server on a free loopback port.
ServerOptions LocalCpuServer() {
  ServerOptions options;
  options.listen = "127.0.0.1:0";
  options.backend.kind = "cpu";
  return options;
}

// Two daemons on one port would split the clients between two states.
TEST(ServerOptionsTest, ASecondServerOnATakenPortDoesNotStart) {
  ServerOptions options = LocalCpuServer();
  absl::StatusOr<std::unique_ptr<Server>> first = Server::Start(options);
  ASSERT_TRUE(first.ok()) << first.status();
  options.listen = "127.0.0.1:" + std::to_string((*first)->port());
  absl::StatusOr<std::unique_ptr<Server>> second = Server::Start(options);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable) << second.status();
  // Found before anything is restored (server/port_check.h).
  EXPECT_NE(second.status().message().find("the port is in use by another process"),
            std::string::npos)
      << second.status();
}

TEST(ServerOptionsTest, AMessageLimitThatCannotHoldOnePageIsRefused) {
  ServerOptions options = LocalCpuServer();
  options.page_elements = 1 << 20;  // 4 MiB of float32.
  options.max_message_bytes = 4 << 20;
  absl::StatusOr<std::unique_ptr<Server>> server = Server::Start(options);
  EXPECT_EQ(server.status().code(), absl::StatusCode::kInvalidArgument) << server.status();
  EXPECT_NE(server.status().message().find("--max_message_bytes must be at least 4198400"),
            std::string::npos)
      << server.status();
}

// Values that started a daemon that could not work: gRPC took a port past
// 65535 modulo 65536 (70000 served on 4464) and an empty one as 443; a huge
// thread count aborted the process; a huge page size wrapped 4 x page past
// the message check; an interval without a state_dir was silently ignored.
TEST(ServerOptionsTest, OutOfRangeListenThreadsPageSizeAndIntervalAreRefused) {
  struct Case {
    std::function<void(ServerOptions*)> set;
    std::string says;
  };
  const Case cases[] = {
      {[](ServerOptions* o) { o->listen = "127.0.0.1:70000"; }, "port of 0 to 65535"},
      {[](ServerOptions* o) { o->listen = "127.0.0.1:"; }, "got '127.0.0.1:'"},
      {[](ServerOptions* o) { o->listen = "127.0.0.1"; }, "--listen must be HOST:PORT"},
      {[](ServerOptions* o) { o->listen = "unix:"; }, "unix: needs a path"},
      {[](ServerOptions* o) { o->threads = 100000; }, "--threads must be 0 (one per core) to 1024"},
      {[](ServerOptions* o) { o->page_elements = uint64_t{1} << 62; },
       "--page_elements must be a positive multiple of 64, at most 268435456"},
      {[](ServerOptions* o) { o->checkpoint_interval = absl::Minutes(10); },
       "--checkpoint_interval needs --state_dir"},
      // Taken on a CPU host, refused only where the CUDA backend ran.
      {[](ServerOptions* o) { o->backend.cuda.paging = "bogus"; },
       "--paging must be none, adaptive or fully_paged, got 'bogus'"},
  };
  for (const Case& c : cases) {
    ServerOptions options = LocalCpuServer();
    c.set(&options);
    absl::StatusOr<std::unique_ptr<Server>> server = Server::Start(options);
    EXPECT_EQ(server.status().code(), absl::StatusCode::kInvalidArgument) << c.says;
    EXPECT_NE(server.status().message().find(c.says), std::string::npos) << server.status();
  }
}

// A path the CPU lacks would fault on the first step, and an unknown name
// says nothing; both are refused before anything starts.
TEST(ServerOptionsTest, ACpuKernelThatIsUnknownOrWiderThanTheCpusIsRefused) {
  ServerOptions options = LocalCpuServer();
  options.cpu_kernel = "avx";
  absl::StatusOr<std::unique_ptr<Server>> server = Server::Start(options);
  EXPECT_EQ(server.status().code(), absl::StatusCode::kInvalidArgument) << server.status();
  EXPECT_NE(server.status().message().find("--cpu_kernel must be auto, avx512, avx2 or scalar"),
            std::string::npos)
      << server.status();
  for (KernelIsa wider : {KernelIsa::kAvx2, KernelIsa::kAvx512}) {
    if (wider <= CpuKernelIsa()) continue;
    options.cpu_kernel = KernelIsaName(wider);
    server = Server::Start(options);
    EXPECT_EQ(server.status().code(), absl::StatusCode::kInvalidArgument) << server.status();
    EXPECT_NE(server.status().message().find("this CPU runs at most"), std::string::npos)
        << server.status();
  }
  EXPECT_EQ(AdamWKernelIsa(), CpuKernelIsa()) << "a refused start changed the path";
}

// A start refused for another reason, after the path was checked, leaves the
// process on the path it had.
TEST(ServerOptionsTest, AStartRefusedLateLeavesTheCpuKernelAsItWas) {
  ServerOptions options = LocalCpuServer();
  absl::StatusOr<std::unique_ptr<Server>> first = Server::Start(options);
  ASSERT_TRUE(first.ok()) << first.status();
  ASSERT_EQ(AdamWKernelIsa(), CpuKernelIsa());
  options.listen = "127.0.0.1:" + std::to_string((*first)->port());  // Taken.
  options.cpu_kernel = "scalar";
  absl::StatusOr<std::unique_ptr<Server>> second = Server::Start(options);
  EXPECT_EQ(second.status().code(), absl::StatusCode::kUnavailable) << second.status();
  EXPECT_EQ(AdamWKernelIsa(), CpuKernelIsa()) << "the refused start took the scalar path";
}

}  // namespace
}  // namespace optstate::testing

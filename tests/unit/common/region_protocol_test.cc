// The client's side of the region socket's greeting: a daemon that takes no
// more connections says so in the greeting (RESOURCE_EXHAUSTED with its
// message), and Connect gives that status, not "unreachable".
#include "common/region_protocol.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <string>
#include <thread>

namespace optstate::region_protocol {
namespace {

TEST(RegionProtocolTest, AGreetingThatRefusesGivesItsStatus) {
  const std::string path = ::testing::TempDir() + "/region-protocol-" + std::to_string(getpid());
  unlink(path.c_str());
  const int listener = socket(AF_UNIX, SOCK_SEQPACKET | SOCK_CLOEXEC, 0);
  ASSERT_GE(listener, 0);
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::strncpy(address.sun_path, path.c_str(), sizeof(address.sun_path) - 1);
  ASSERT_EQ(bind(listener, reinterpret_cast<const sockaddr*>(&address), sizeof(address)), 0);
  ASSERT_EQ(listen(listener, 4), 0);
  std::thread daemon([&] {
    for (int refuse = 1; refuse >= 0; --refuse) {
      const int fd = accept(listener, nullptr, nullptr);
      Reply hello;
      hello.op = static_cast<uint32_t>(Op::kHello);
      if (refuse) SetStatus(absl::ResourceExhaustedError("4096 connections already"), &hello);
      (void)Send(fd, &hello, sizeof(hello));
      close(fd);
    }
  });
  Reply hello;
  absl::StatusOr<int> refused = Connect(path, &hello);
  EXPECT_EQ(refused.status().code(), absl::StatusCode::kResourceExhausted) << refused.status();
  EXPECT_THAT(refused.status().message(), ::testing::HasSubstr("4096 connections already"));
  absl::StatusOr<int> taken = Connect(path, &hello);
  EXPECT_TRUE(taken.ok()) << taken.status();
  if (taken.ok()) close(*taken);
  daemon.join();
  close(listener);
  unlink(path.c_str());
}

}  // namespace
}  // namespace optstate::region_protocol

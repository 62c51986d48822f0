// optstate-probe, the health check of the images and the Kubernetes exec
// probes, run as a program against a real optstated: exit 0 only when the
// daemon answers SERVING.
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <string>
#include <vector>

#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "tests/testing/daemon_process.h"

namespace optstate::testing {
namespace {

// Runs optstate-probe with `flags`; its exit code (128+signal if killed).
// With `output`, what it printed (stdout and stderr) goes there.
int RunProbe(const std::vector<std::string>& flags, std::string* output = nullptr) {
  std::vector<std::string> args = {OPTSTATE_PROBE_PATH};
  args.insert(args.end(), flags.begin(), flags.end());
  int out[2] = {-1, -1};
  if (output != nullptr && pipe(out) != 0) return -1;
  pid_t pid = fork();
  if (pid == 0) {
    if (output != nullptr) {
      dup2(out[1], 1);
      dup2(out[1], 2);
      close(out[0]);
      close(out[1]);
    }
    std::vector<char*> argv;
    for (std::string& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    execv(argv[0], argv.data());
    _exit(127);
  }
  if (output != nullptr) {
    close(out[1]);
    char buffer[4096];
    ssize_t n;
    while ((n = read(out[0], buffer, sizeof(buffer))) > 0) output->append(buffer, n);
    close(out[0]);
  }
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// A loopback port on which nothing listens (bound, then closed).
int UnusedPort() {
  int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  socklen_t len = sizeof(addr);
  getsockname(fd, reinterpret_cast<sockaddr*>(&addr), &len);
  close(fd);
  return ntohs(addr.sin_port);
}

class ProbeTest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto daemon = DaemonProcess::Start({"--threads=1"});
    ASSERT_TRUE(daemon.ok()) << daemon.status();
    daemon_ = std::move(*daemon);
  }
  std::unique_ptr<DaemonProcess> daemon_;
};

TEST_F(ProbeTest, ServingDaemonExitsZero) {
  EXPECT_EQ(RunProbe({"--addr=" + daemon_->target()}), 0);
}

TEST_F(ProbeTest, ServingOptimizerStateServiceExitsZero) {
  EXPECT_EQ(RunProbe({"--addr=" + daemon_->target(), "--service=optstate.v1.OptimizerState"}), 0);
}

TEST_F(ProbeTest, ServingDataPlaneServiceExitsZero) {
  EXPECT_EQ(RunProbe({"--addr=" + daemon_->target(), "--service=optstate.v1.DataPlane"}), 0);
}

TEST_F(ProbeTest, UnknownServiceExitsOne) {
  EXPECT_EQ(RunProbe({"--addr=" + daemon_->target(), "--service=no.such.Service"}), 1);
}

TEST_F(ProbeTest, StoppedDaemonExitsOne) {
  const std::string target = daemon_->target();
  absl::StatusOr<int> code = daemon_->Stop();
  ASSERT_TRUE(code.ok()) << code.status();
  EXPECT_EQ(RunProbe({"--addr=" + target, "--timeout=1s"}), 1);
}

TEST(ProbeWithoutDaemonTest, NothingListeningExitsOneWithinItsTimeout) {
  const absl::Time start = absl::Now();
  std::string output;
  EXPECT_EQ(RunProbe({"--addr=127.0.0.1:" + std::to_string(UnusedPort()), "--timeout=1s"}, &output),
            1);
  EXPECT_LT(absl::Now() - start, absl::Seconds(5));
  // gRPC's reason, not "Deadline Exceeded" (what it printed before).
  EXPECT_NE(output.find("no answer within 1s"), std::string::npos) << output;
  EXPECT_NE(output.find("Connection refused"), std::string::npos) << output;
}

// --help listed no flag (absl's default looks for a file named after the
// binary, optstate-probe, and the file is optstate_probe_main.cc).
TEST(ProbeWithoutDaemonTest, HelpListsItsFlags) {
  std::string output;
  RunProbe({"--help"}, &output);
  EXPECT_NE(output.find("--addr"), std::string::npos) << output;
  EXPECT_NE(output.find("--tls_ca"), std::string::npos) << output;
}

TEST(ProbeWithoutDaemonTest, BadUsageExitsTwo) {
  EXPECT_EQ(RunProbe({"--timeout=0s"}), 2);
  EXPECT_EQ(RunProbe({"--addr=127.0.0.1:1", "stray-argument"}), 2);
}

}  // namespace
}  // namespace optstate::testing

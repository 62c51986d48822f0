// A loopback TCP proxy that can cut a connection after a given number of
// bytes, to break a gRPC stream part-way the way a network failure would.
#ifndef OPTSTATE_TESTS_TESTING_CUTTING_PROXY_H_
#define OPTSTATE_TESTS_TESTING_CUTTING_PROXY_H_

#include <atomic>
#include <cstdint>
#include <memory>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace optstate::testing {

// Forwards 127.0.0.1:port() to 127.0.0.1:upstream_port. Thread-safe.
class CuttingProxy {
 public:
  explicit CuttingProxy(int upstream_port);
  ~CuttingProxy();

  int port() const { return port_; }
  // The next `cut_after_bytes` bytes sent client-to-server pass; then that
  // connection is closed both ways. Only one cut per Arm.
  void ArmCut(uint64_t cut_after_bytes) { cut_after_.store(cut_after_bytes); }
  int cuts() const { return cuts_.load(); }

 private:
  void AcceptLoop() ABSL_LOCKS_EXCLUDED(mu_);
  void Pump(int client_fd, int server_fd);

  const int upstream_port_;
  int listen_fd_ = -1;
  int port_ = 0;
  std::atomic<bool> stopping_{false};
  std::atomic<uint64_t> cut_after_{UINT64_MAX};
  std::atomic<int> cuts_{0};
  absl::Mutex mu_;
  std::vector<int> fds_ ABSL_GUARDED_BY(mu_);  // Every open socket, closed on exit.
  std::vector<std::thread> threads_ ABSL_GUARDED_BY(mu_);
  std::thread acceptor_;
};

}  // namespace optstate::testing

#endif  // OPTSTATE_TESTS_TESTING_CUTTING_PROXY_H_

// One thread accepts; one thread per connection pumps both directions.
#include "tests/testing/cutting_proxy.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>

namespace optstate::testing {

CuttingProxy::CuttingProxy(int upstream_port) : upstream_port_(upstream_port) {
  listen_fd_ = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  bind(listen_fd_, reinterpret_cast<sockaddr*>(&addr), sizeof(addr));
  listen(listen_fd_, 16);
  socklen_t len = sizeof(addr);
  getsockname(listen_fd_, reinterpret_cast<sockaddr*>(&addr), &len);
  port_ = ntohs(addr.sin_port);
  acceptor_ = std::thread([this] { AcceptLoop(); });
}

CuttingProxy::~CuttingProxy() {
  stopping_ = true;
  shutdown(listen_fd_, SHUT_RDWR);
  acceptor_.join();
  close(listen_fd_);
  std::vector<std::thread> threads;
  {
    absl::MutexLock lock(&mu_);
    for (int fd : fds_) shutdown(fd, SHUT_RDWR);
    threads.swap(threads_);
  }
  for (auto& t : threads) t.join();
}

void CuttingProxy::AcceptLoop() {
  while (!stopping_) {
    int client_fd = accept(listen_fd_, nullptr, nullptr);
    if (client_fd < 0) return;
    int server_fd = socket(AF_INET, SOCK_STREAM, 0);
    sockaddr_in addr{};
    addr.sin_family = AF_INET;
    addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    addr.sin_port = htons(upstream_port_);
    if (connect(server_fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) {
      close(client_fd);
      close(server_fd);
      continue;
    }
    absl::MutexLock lock(&mu_);
    fds_.push_back(client_fd);
    fds_.push_back(server_fd);
    threads_.emplace_back([this, client_fd, server_fd] { Pump(client_fd, server_fd); });
  }
}

void CuttingProxy::Pump(int client_fd, int server_fd) {
  char buffer[1 << 16];
  uint64_t forwarded = 0;
  for (;;) {
    pollfd fds[2] = {{client_fd, POLLIN, 0}, {server_fd, POLLIN, 0}};
    if (poll(fds, 2, 200) < 0) break;
    if (stopping_) break;
    bool closed = false;
    for (int i = 0; i < 2 && !closed; ++i) {
      if (!(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      const int from = fds[i].fd, to = i == 0 ? server_fd : client_fd;
      size_t want = sizeof(buffer);
      if (i == 0) {
        const uint64_t limit = cut_after_.load();
        if (limit != UINT64_MAX)
          want =
              std::min<uint64_t>(want, std::max<uint64_t>(limit - std::min(limit, forwarded), 1));
      }
      ssize_t n = read(from, buffer, want);
      if (n <= 0) {
        closed = true;
        break;
      }
      for (ssize_t sent = 0; sent < n;) {
        ssize_t w = write(to, buffer + sent, n - sent);
        if (w <= 0) {
          closed = true;
          break;
        }
        sent += w;
      }
      if (i == 0) {
        forwarded += n;
        uint64_t limit = cut_after_.load();
        if (limit != UINT64_MAX && forwarded >= limit &&
            cut_after_.compare_exchange_strong(limit, UINT64_MAX)) {
          ++cuts_;
          closed = true;  // The network fails here.
        }
      }
    }
    if (closed) break;
  }
  shutdown(client_fd, SHUT_RDWR);
  shutdown(server_fd, SHUT_RDWR);
}

}  // namespace optstate::testing

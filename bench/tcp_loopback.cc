// Socket pair over 127.0.0.1 with blocking send/recv in plain threads.
#include "bench/tcp_loopback.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <thread>
#include <vector>

namespace optstate::bench {
namespace {

struct SocketPair {
  int client = -1;
  int server = -1;
  ~SocketPair() {
    if (client >= 0) close(client);
    if (server >= 0) close(server);
  }
};

void Die(const char* what) {
  std::perror(what);
  std::abort();
}

void Connect(SocketPair* pair) {
  const int listener = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = 0;
  socklen_t len = sizeof(addr);
  if (bind(listener, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) Die("bind");
  if (listen(listener, 1) != 0) Die("listen");
  getsockname(listener, reinterpret_cast<sockaddr*>(&addr), &len);
  pair->client = socket(AF_INET, SOCK_STREAM, 0);
  if (connect(pair->client, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)) != 0) Die("connect");
  pair->server = accept(listener, nullptr, nullptr);
  if (pair->server < 0) Die("accept");
  close(listener);
  const int one = 1;
  setsockopt(pair->client, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
  setsockopt(pair->server, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

// Sends all of [data, data+n); false once the peer is gone.
bool SendAll(int fd, const char* data, size_t n) {
  while (n > 0) {
    const ssize_t sent = send(fd, data, n, MSG_NOSIGNAL);
    if (sent <= 0) return false;
    data += sent;
    n -= static_cast<size_t>(sent);
  }
  return true;
}

bool RecvAll(int fd, char* data, size_t n) {
  while (n > 0) {
    const ssize_t got = recv(fd, data, n, 0);
    if (got <= 0) return false;
    data += got;
    n -= static_cast<size_t>(got);
  }
  return true;
}

double Seconds(std::chrono::steady_clock::time_point since) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - since).count();
}

}  // namespace

TcpResult MeasureTcpOneWay(size_t chunk_bytes, absl::Duration duration) {
  SocketPair pair;
  Connect(&pair);
  std::atomic<bool> stop{false};
  std::vector<char> out(chunk_bytes, 1), in(chunk_bytes);
  size_t received = 0;
  const auto start = std::chrono::steady_clock::now();
  std::thread receiver([&] {
    while (RecvAll(pair.server, in.data(), chunk_bytes)) received += chunk_bytes;
  });
  const double limit = absl::ToDoubleSeconds(duration);
  while (Seconds(start) < limit) SendAll(pair.client, out.data(), chunk_bytes);
  shutdown(pair.client, SHUT_WR);
  receiver.join();
  return {static_cast<double>(received) / Seconds(start)};
}

TcpResult MeasureTcpEcho(size_t chunk_bytes, absl::Duration duration) {
  SocketPair pair;
  Connect(&pair);
  std::vector<char> out(chunk_bytes, 1), echo(chunk_bytes), back(chunk_bytes);
  size_t replies = 0;
  const auto start = std::chrono::steady_clock::now();
  std::thread echo_thread([&] {
    while (RecvAll(pair.server, echo.data(), chunk_bytes) &&
           SendAll(pair.server, echo.data(), chunk_bytes)) {
    }
    shutdown(pair.server, SHUT_WR);
  });
  std::thread reader([&] {
    while (RecvAll(pair.client, back.data(), chunk_bytes)) ++replies;
  });
  const double limit = absl::ToDoubleSeconds(duration);
  while (Seconds(start) < limit) SendAll(pair.client, out.data(), chunk_bytes);
  shutdown(pair.client, SHUT_WR);
  echo_thread.join();
  reader.join();
  return {2.0 * static_cast<double>(replies) * static_cast<double>(chunk_bytes) / Seconds(start)};
}

}  // namespace optstate::bench

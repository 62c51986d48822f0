// InProcessDaemon over optstate::Server.
#include "tests/testing/in_process_daemon.h"

#include <cstring>

#include "absl/strings/str_cat.h"
#include "server/server.h"

namespace optstate::testing {

struct InProcessDaemon::Parts {
  std::unique_ptr<Server> server;
};

absl::StatusOr<std::unique_ptr<InProcessDaemon>> InProcessDaemon::Start(int threads,
                                                                        uint64_t page_elements) {
  ServerOptions options;
  options.listen = "127.0.0.1:0";
  options.threads = threads;
  options.page_elements = page_elements;
  auto server = Server::Start(options);
  if (!server.ok()) return server.status();
  auto parts = std::make_unique<Parts>();
  parts->server = std::move(*server);
  return std::unique_ptr<InProcessDaemon>(new InProcessDaemon(std::move(parts)));
}

InProcessDaemon::InProcessDaemon(std::unique_ptr<Parts> parts) : parts_(std::move(parts)) {}
InProcessDaemon::~InProcessDaemon() = default;

std::string InProcessDaemon::target() const {
  return absl::StrCat("127.0.0.1:", parts_->server->port());
}

std::vector<uint32_t> InProcessDaemon::StateBits(const std::string& name) const {
  auto group = parts_->server->engine().store()->Find(GroupKey{"", name});
  if (!group.ok()) return {};
  const uint64_t n = (*group)->num_elements();
  std::vector<uint32_t> bits(3 * n);
  std::memcpy(bits.data(), (*group)->params(), n * 4);
  std::memcpy(bits.data() + n, (*group)->exp_avg(), n * 4);
  std::memcpy(bits.data() + 2 * n, (*group)->exp_avg_sq(), n * 4);
  return bits;
}

}  // namespace optstate::testing

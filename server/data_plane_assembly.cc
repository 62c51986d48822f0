// Which region socket a daemon offers, and its start and stop.
#include "server/data_plane_assembly.h"

#include <sys/random.h>

#include <cstring>
#include <optional>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/region_protocol.h"
#include "server/auth/authenticator.h"
#include "server/auth/token_digest.h"
#include "server/base/log.h"
#include "server/regions/region_socket_server.h"
#include "server/rpc/data_plane_service.h"

namespace optstate {
namespace {

std::string RandomId() {
  std::string id(region_protocol::kKeyBytes, '\0');
  size_t got = 0;
  while (got < id.size()) {
    const ssize_t n = getrandom(id.data() + got, id.size() - got, 0);
    if (n > 0) got += static_cast<size_t>(n);
  }
  return id;
}

bool IsLoopback(const std::string& listen) {
  return absl::StartsWith(listen, "127.") || absl::StartsWith(listen, "localhost:") ||
         absl::StartsWith(listen, "[::1]:");
}

}  // namespace

std::string DataPlaneAssembly::SocketPathFor(const std::string& option, const std::string& listen,
                                             int port) {
  if (option == "none") return "";
  if (!option.empty()) return option;
  if (absl::StartsWith(listen, "unix:")) {
    std::string path = listen.substr(5);
    if (absl::StartsWith(path, "//")) path = path.substr(2);  // unix:///abs form.
    return path + ".regions";
  }
  if (IsLoopback(listen)) return absl::StrCat("/tmp/optstated-", port, ".regions");
  return "";
}

DataPlaneAssembly::DataPlaneAssembly(const DataPlaneOptions& options,
                                     const Authenticator* authenticator)
    : options_(options), daemon_id_(RandomId()), authenticator_(authenticator) {
  service_ = std::make_unique<DataPlaneService>(daemon_id_, options.limits, authenticator);
  if (options.region_socket != "none") registry_ = std::make_unique<RegionRegistry>(options.limits);
}

DataPlaneAssembly::~DataPlaneAssembly() { StopSocket(); }

grpc::Service* DataPlaneAssembly::service() { return service_.get(); }

absl::Status DataPlaneAssembly::StartSocket(const std::string& listen, int port) {
  const std::string path = SocketPathFor(options_.region_socket, listen, port);
  if (path.empty() || registry_ == nullptr) return absl::OkStatus();
  RegionSocketServer::TokenCheck check_token;
  RegionSocketServer::CredentialCheck still_valid;
  if (authenticator_ != nullptr && authenticator_->required()) {
    // The credential is the token's digest: the token itself is not kept.
    check_token = [auth = authenticator_](
                      const std::string& token) -> absl::StatusOr<RegionSocketServer::TokenHolder> {
      absl::StatusOr<Caller> caller = auth->AuthenticateToken(token);
      if (!caller.ok()) return caller.status();
      const TokenDigest digest = DigestOfToken(token);
      return RegionSocketServer::TokenHolder{
          caller->tenant, std::string(reinterpret_cast<const char*>(digest.data()), digest.size())};
    };
    still_valid = [auth = authenticator_](const std::string& credential,
                                          const std::string& tenant) {
      TokenDigest digest{};
      if (credential.size() != digest.size()) return false;
      std::memcpy(digest.data(), credential.data(), digest.size());
      const std::optional<std::string> now = auth->TenantOfDigest(digest);
      return now.has_value() && *now == tenant;
    };
  }
  absl::StatusOr<std::unique_ptr<RegionSocketServer>> socket =
      RegionSocketServer::Start(path, options_.socket_mode, registry_.get(), daemon_id_,
                                std::move(check_token), std::move(still_valid));
  if (!socket.ok()) return socket.status();
  socket_ = std::move(*socket);
  service_->SetRegionSocket(path);
  Log(LogLevel::kInfo, "region socket ", path, " (same-host shared-memory data plane)");
  return absl::OkStatus();
}

void DataPlaneAssembly::RevalidateRegionConnections() {
  if (socket_ != nullptr) socket_->Revalidate();
}

void DataPlaneAssembly::StopSocket() {
  if (socket_ != nullptr) service_->SetRegionSocket("");
  socket_.reset();
}

}  // namespace optstate

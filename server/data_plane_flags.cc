// The flags, and their translation into ServerOptions.
#include "server/data_plane_flags.h"

#include <cstdlib>
#include <string>
#include <utility>

#include "absl/flags/flag.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"

namespace {

// The data plane's options as they are when no flag is given: each default
// is written once, in the option structs.
const optstate::DataPlaneOptions& Default() {
  static const optstate::DataPlaneOptions* const defaults = new optstate::DataPlaneOptions();
  return *defaults;
}

}  // namespace

ABSL_FLAG(std::string, region_socket, Default().region_socket,
          "Unix socket on which trainers on this host register shared-memory regions (sealed "
          "memfds) so Step moves no gradient or param bytes through gRPC. Empty: on next to a "
          "loopback or unix: --listen (unix:/p gives /p.regions, 127.0.0.1:PORT gives "
          "/tmp/optstated-PORT.regions), off otherwise; 'none': off.");
ABSL_FLAG(std::string, socket_mode, absl::StrFormat("%04o", Default().socket_mode),
          "Permission bits (octal) of the region socket and of a unix: --listen socket: who "
          "may connect.");
ABSL_FLAG(uint32_t, max_regions_per_client, Default().limits.max_regions_per_client,
          "Regions one region-socket connection may have registered at once; more get "
          "RESOURCE_EXHAUSTED.");
ABSL_FLAG(uint32_t, max_regions, Default().limits.max_regions,
          "Regions all clients together may have registered (each is one mapping in the "
          "daemon); more get RESOURCE_EXHAUSTED.");
ABSL_FLAG(uint64_t, max_region_bytes, Default().limits.max_region_bytes,
          "Bytes of shared-memory regions the daemon maps, all clients together; a "
          "registration past it gets RESOURCE_EXHAUSTED.");
ABSL_FLAG(uint32_t, tenant_max_regions, Default().limits.max_regions_per_tenant,
          "Regions one tenant may have registered at once, over all its connections; more get "
          "RESOURCE_EXHAUSTED; 0: no limit but --max_regions.");
ABSL_FLAG(uint64_t, tenant_max_region_bytes, Default().limits.max_region_bytes_per_tenant,
          "Bytes of regions one tenant may have registered at once, over all its connections "
          "(pages the daemon writes first count as its memory); more get RESOURCE_EXHAUSTED; "
          "0: no limit but --max_region_bytes.");

namespace optstate {

absl::Status DataPlaneOptionsFromFlags(ServerOptions* options) {
  const std::string mode = absl::GetFlag(FLAGS_socket_mode);
  char* end = nullptr;
  const unsigned long bits = std::strtoul(mode.c_str(), &end, 8);
  if (mode.empty() || *end != '\0' || bits > 0777) {
    return absl::InvalidArgumentError(
        absl::StrCat("--socket_mode must be octal permission bits such as 0660, got '", mode, "'"));
  }
  for (const auto& [flag, value] :
       {std::pair<const char*, uint64_t>{"max_regions_per_client",
                                         absl::GetFlag(FLAGS_max_regions_per_client)},
        {"max_regions", absl::GetFlag(FLAGS_max_regions)},
        {"max_region_bytes", absl::GetFlag(FLAGS_max_region_bytes)}}) {
    if (value == 0) {
      return absl::InvalidArgumentError(
          absl::StrCat("--", flag,
                       "=0 would refuse every shared-memory region; give at least 1 "
                       "(--region_socket=none turns the shared-memory data plane off)"));
    }
  }
  options->data_plane.region_socket = absl::GetFlag(FLAGS_region_socket);
  options->data_plane.socket_mode = static_cast<unsigned>(bits);
  options->listen_socket_mode = static_cast<unsigned>(bits);
  options->data_plane.limits.max_regions_per_client = absl::GetFlag(FLAGS_max_regions_per_client);
  options->data_plane.limits.max_region_bytes = absl::GetFlag(FLAGS_max_region_bytes);
  options->data_plane.limits.max_regions = absl::GetFlag(FLAGS_max_regions);
  options->data_plane.limits.max_regions_per_tenant = absl::GetFlag(FLAGS_tenant_max_regions);
  options->data_plane.limits.max_region_bytes_per_tenant =
      absl::GetFlag(FLAGS_tenant_max_region_bytes);
  return absl::OkStatus();
}

}  // namespace optstate

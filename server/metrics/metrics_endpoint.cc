#include "server/metrics/metrics_endpoint.h"

#include <arpa/inet.h>

#include <civetweb.h>

#include <exception>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/string_view.h"

namespace optstate {

namespace {

// civetweb's feature bit for IPv6 (mg_check_feature).
constexpr unsigned kCivetwebIpv6 = 8;

// IP:PORT with a numeric port of at most 65535 and a host that is a dotted
// IPv4 address or a bracketed IPv6 one (what civetweb binds; the latter
// only where civetweb was built with IPv6, which Debian's is not).
absl::Status CheckListenAddress(absl::string_view listen) {
  const size_t colon = listen.rfind(':');
  auto bad = [&] {
    return absl::InvalidArgumentError(absl::StrCat(
        "--metrics_listen must be IP:PORT (127.0.0.1:9464 or 0.0.0.0:9464), got '", listen, "'"));
  };
  if (colon == absl::string_view::npos || colon == 0) return bad();
  const absl::string_view host = listen.substr(0, colon);
  const absl::string_view port = listen.substr(colon + 1);
  uint32_t number = 0;
  if (port.empty() || !absl::SimpleAtoi(port, &number) || number > 65535 ||
      !absl::ascii_isdigit(port.front())) {
    return bad();
  }
  if (host.front() == '[') {
    if (host.back() != ']' || host.size() < 3) return bad();
    if (mg_check_feature(kCivetwebIpv6) == 0) {
      return absl::InvalidArgumentError(absl::StrCat(
          "--metrics_listen=", listen,
          ": this build's HTTP server (civetweb, as Debian builds it) has no IPv6; give an "
          "IPv4 address: 0.0.0.0:",
          port, " (every interface) or 127.0.0.1:", port, " (this host alone)"));
    }
  } else {
    // Four parts of at most 255 each, as inet_pton reads them: civetweb
    // itself would take 256.0.0.0 as 0.0.0.0 (every part modulo 256) and
    // serve on every interface.
    struct in_addr address;
    const std::string text(host);
    if (inet_pton(AF_INET, text.c_str(), &address) != 1) return bad();
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::unique_ptr<MetricsEndpoint>> MetricsEndpoint::Start(
    const std::string& listen, std::shared_ptr<prometheus::Collectable> metrics) {
  if (absl::Status s = CheckListenAddress(listen); !s.ok()) return s;
  std::unique_ptr<prometheus::Exposer> exposer;
  try {
    // prometheus-cpp's exposer throws when civetweb cannot bind. civetweb
    // gives each connection a thread until it closes or a read waits past
    // request_timeout_ms (30 s by default): with 2 threads, two idle
    // connections starved every scrape for 25-30 s. 32 threads and 3 s: a
    // scrape waits only behind 32 connections that send nothing, and then
    // at most 3 s for each 32.
    exposer = std::make_unique<prometheus::Exposer>(std::vector<std::string>{
        "listening_ports", listen, "num_threads", "32", "request_timeout_ms", "3000"});
  } catch (const std::exception& e) {
    return absl::UnavailableError(absl::StrCat("cannot serve metrics on ", listen,
                                               " (--metrics_listen): the port is taken or the "
                                               "address is not this host's (",
                                               e.what(), ")"));
  }
  const std::vector<int> ports = exposer->GetListeningPorts();
  if (ports.empty()) {
    return absl::UnavailableError(
        absl::StrCat("cannot serve metrics on ", listen, " (--metrics_listen): no port bound"));
  }
  exposer->RegisterCollectable(metrics);
  return std::unique_ptr<MetricsEndpoint>(
      new MetricsEndpoint(std::move(exposer), std::move(metrics), ports.front()));
}

MetricsEndpoint::~MetricsEndpoint() {
  // Stop scrapes before what they read goes.
  exposer_.reset();
}

}  // namespace optstate

#include "server/port_check.h"

#include <netdb.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"

namespace optstate {

absl::Status CheckPortFree(const std::string& flag, const std::string& listen) {
  absl::string_view address = listen;
  if (absl::StartsWith(address, "unix:")) return absl::OkStatus();
  if (!absl::ConsumePrefix(&address, "ipv4:")) absl::ConsumePrefix(&address, "ipv6:");
  const size_t colon = address.rfind(':');
  if (colon == absl::string_view::npos) return absl::OkStatus();
  const std::string port(address.substr(colon + 1));
  absl::string_view host = address.substr(0, colon);
  if (port.empty() || port == "0") return absl::OkStatus();
  if (absl::ConsumePrefix(&host, "[")) absl::ConsumeSuffix(&host, "]");
  addrinfo hints{};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  hints.ai_flags = AI_PASSIVE | AI_NUMERICSERV;
  addrinfo* found = nullptr;
  const std::string host_text(host);
  if (getaddrinfo(host_text.empty() ? nullptr : host_text.c_str(), port.c_str(), &hints, &found) !=
      0) {
    return absl::OkStatus();  // The server's own resolution reports it.
  }
  // gRPC serves when any of the addresses binds (localhost's ::1 may be
  // missing where IPv6 is off): refused only when none does, for a reason
  // that is sure (taken, or not this host's).
  bool bound = false;
  int refusal = 0;
  for (addrinfo* a = found; a != nullptr && !bound; a = a->ai_next) {
    const int fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd < 0) continue;
    const int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));  // As gRPC binds.
    const int error = bind(fd, a->ai_addr, a->ai_addrlen) == 0 ? 0 : errno;
    close(fd);
    if (error == 0) bound = true;
    if (error == EADDRINUSE || (error == EADDRNOTAVAIL && refusal == 0)) refusal = error;
  }
  freeaddrinfo(found);
  if (bound || refusal == 0) return absl::OkStatus();
  return absl::UnavailableError(
      absl::StrCat("cannot listen on ", listen, " (", flag, "): ",
                   refusal == EADDRINUSE ? "the port is in use by another process"
                                         : "the address is not one of this host's",
                   " (checked before the restore, so a crash loop does not restore each time)"));
}

}  // namespace optstate

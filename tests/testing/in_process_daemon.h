// An optstated server in the test's own process, behind a header that
// includes no server type, so a test can hold it beside optstate::Client
// (whose public types share names with the server's) and read its state.
#ifndef OPTSTATE_TESTS_TESTING_IN_PROCESS_DAEMON_H_
#define OPTSTATE_TESTS_TESTING_IN_PROCESS_DAEMON_H_

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"

namespace optstate::testing {

class InProcessDaemon {
 public:
  // A CPU daemon on 127.0.0.1 (a free port) with its default region socket.
  static absl::StatusOr<std::unique_ptr<InProcessDaemon>> Start(int threads,
                                                                uint64_t page_elements);
  ~InProcessDaemon();

  std::string target() const;
  // The bits of group `name`'s params, then m, then v (tenant ""); empty
  // when there is no such group.
  std::vector<uint32_t> StateBits(const std::string& name) const;

 private:
  struct Parts;
  explicit InProcessDaemon(std::unique_ptr<Parts> parts);
  std::unique_ptr<Parts> parts_;
};

}  // namespace optstate::testing

#endif  // OPTSTATE_TESTS_TESTING_IN_PROCESS_DAEMON_H_

// A region registered on a daemon's region socket by hand, as a hostile or
// buggy client (or a test of the raw protocol) would, without
// optstate::Client.
#ifndef OPTSTATE_TESTS_TESTING_RAW_REGION_H_
#define OPTSTATE_TESTS_TESTING_RAW_REGION_H_

#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"

namespace optstate::testing {

// A session on the region socket and one sealed memfd registered in it,
// mapped here. Closing it (the destructor) ends the session.
struct RawRegion {
  int socket = -1;
  std::string key;  // The session key.
  int memfd = -1;
  char* base = nullptr;
  uint64_t bytes = 0;
  uint64_t id = 0;  // The daemon's id of the region.

  ~RawRegion();
  absl::Status Unregister();
};

// The daemon's region socket (DataPlane.GetDataPlane); empty when it has
// none or the call fails (a gtest failure then).
std::string RegionSocketOf(const std::string& target);

// A new session on the socket at `path` with a region of `bytes`; null (and
// a gtest failure) when that fails.
std::unique_ptr<RawRegion> OpenRegion(const std::string& path, uint64_t bytes);

}  // namespace optstate::testing

#endif  // OPTSTATE_TESTS_TESTING_RAW_REGION_H_

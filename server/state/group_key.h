// A group's identity: the one place that says which group is which. Every
// group belongs to a tenant ("" until authentication assigns tenants).
#ifndef OPTSTATE_SERVER_STATE_GROUP_KEY_H_
#define OPTSTATE_SERVER_STATE_GROUP_KEY_H_

#include <string>
#include <utility>

namespace optstate {

struct GroupKey {
  std::string tenant;
  std::string name;

  bool operator==(const GroupKey& other) const {
    return tenant == other.tenant && name == other.name;
  }
  template <typename H>
  friend H AbslHashValue(H h, const GroupKey& key) {
    return H::combine(std::move(h), key.tenant, key.name);
  }
};

}  // namespace optstate

#endif  // OPTSTATE_SERVER_STATE_GROUP_KEY_H_

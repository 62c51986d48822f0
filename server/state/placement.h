// Where a group's state lives while a step runs, and the state a backend
// keeps per group to put it there.
#ifndef OPTSTATE_SERVER_STATE_PLACEMENT_H_
#define OPTSTATE_SERVER_STATE_PLACEMENT_H_

namespace optstate {

enum class Placement { kHost, kDeviceResident, kDevicePaged };

// State a backend keeps per group (device buffers, for instance).
class BackendGroupState {
 public:
  virtual ~BackendGroupState() = default;
};

}  // namespace optstate

#endif  // OPTSTATE_SERVER_STATE_PLACEMENT_H_

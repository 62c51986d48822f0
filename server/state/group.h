// One parameter group: a named flat fp32 tensor with its AdamW state (params,
// exp_avg m, exp_avg_sq v) in host memory, divided into fixed pages that each
// record the step they have reached.
#ifndef OPTSTATE_SERVER_STATE_GROUP_H_
#define OPTSTATE_SERVER_STATE_GROUP_H_

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "server/kernels/adamw_hyperparameters.h"
#include "server/state/group_counters.h"
#include "server/state/host_allocator.h"

namespace optstate {

// A group's identity: the one place that says which group is which. Every
// group belongs to a tenant ("" until authentication assigns tenants).
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

// The shortest decimal text that reads back as exactly `x`: messages that
// name hyperparameters tell 1e-3 from the double nearest 1e-3f.
std::string ExactText(double x);

// INVALID_ARGUMENT naming the first field out of range: lr and weight_decay
// must be finite and >= 0, beta1 and beta2 in [0, 1), eps finite and > 0;
// lr, eps and weight_decay also finite as float32, and eps > 0 there.
absl::Status ValidateHyperparameters(const AdamWHyperparameters& h);

// What a registration fixes for a group's whole life.
struct GroupConfig {
  uint64_t num_elements = 0;
  AdamWHyperparameters hyperparameters;
  bool has_initial_values = false;

  bool operator==(const GroupConfig& o) const {
    return num_elements == o.num_elements && hyperparameters == o.hyperparameters &&
           has_initial_values == o.has_initial_values;
  }
};

enum class Placement { kHost, kDeviceResident, kDevicePaged };

// State a backend keeps per group (device buffers, for instance).
class BackendGroupState {
 public:
  virtual ~BackendGroupState() = default;
};

// Bytes each element of a group's state takes: params, exp_avg (m) and
// exp_avg_sq (v), one fp32 each. The one owner of "12 bytes per element":
// host arrays, a resident group's device arrays and a page's copies all take
// this much.
inline constexpr uint64_t kStateBytesPerElement = 3 * sizeof(float);

// Bytes of host memory a group of `num_elements` takes (params, m and v).
inline uint64_t HostBytesFor(uint64_t num_elements) { return num_elements * kStateBytesPerElement; }

// Thread-safety: configuration and array pointers are immutable. The elements
// of a page, and its step and values flag, may be changed only while holding
// page_mutex(page); page_step() and the counters may be read without it.
class Group {
 public:
  // Allocates zeroed params, m and v from `allocator`; RESOURCE_EXHAUSTED if
  // the memory cannot be had.
  static absl::StatusOr<std::shared_ptr<Group>> Create(GroupKey key, GroupConfig config,
                                                       uint64_t page_elements,
                                                       HostAllocator* allocator);
  ~Group();

  Group(const Group&) = delete;
  Group& operator=(const Group&) = delete;

  const GroupKey& key() const { return key_; }
  const GroupConfig& config() const { return config_; }
  uint64_t num_elements() const { return config_.num_elements; }
  uint64_t page_elements() const { return page_elements_; }
  uint64_t num_pages() const { return num_pages_; }
  uint64_t host_bytes() const { return HostBytesFor(config_.num_elements); }
  uint64_t PageBegin(uint64_t page) const { return page * page_elements_; }
  uint64_t PageEnd(uint64_t page) const;

  float* params() const { return params_; }
  float* exp_avg() const { return exp_avg_; }
  float* exp_avg_sq() const { return exp_avg_sq_; }

  absl::Mutex& page_mutex(uint64_t page) const { return page_mutexes_[page]; }
  uint64_t page_step(uint64_t page) const {
    return page_steps_[page].load(std::memory_order_acquire);
  }
  // Requires page_mutex(page).
  void set_page_step(uint64_t page, uint64_t step) {
    page_steps_[page].store(step, std::memory_order_release);
  }
  bool page_has_values(uint64_t page) const {
    return page_has_values_[page].load(std::memory_order_acquire);
  }
  // Requires page_mutex(page).
  void mark_page_has_values(uint64_t page);

  uint64_t MinStep() const;
  uint64_t MaxStep() const;
  uint64_t PagesAwaitingValues() const {
    return pages_awaiting_values_.load(std::memory_order_acquire);
  }

  // Where the state lives while a step runs: the one record of it, set by
  // the backend (when it attaches the group, and when it moves it), read
  // by anyone (DescribeGroup, the backend's own steps).
  Placement placement() const { return placement_.load(std::memory_order_acquire); }
  void set_placement(Placement p) { placement_.store(p, std::memory_order_release); }

  GroupCounters& counters() const { return counters_; }

  // Set, with every page mutex held, when the group is deleted; a step that
  // finds it set after taking its page mutexes must not touch the state.
  bool deleted() const { return deleted_.load(std::memory_order_acquire); }
  void mark_deleted() { deleted_.store(true, std::memory_order_release); }

  // Set when a backend failed part-way through an update: some pages of the
  // range may hold the new state while their step says otherwise, so a
  // retry could apply them twice. Every later chunk is refused (DATA_LOSS);
  // the group must be deleted and registered again.
  bool broken() const { return broken_.load(std::memory_order_acquire); }
  void mark_broken() { broken_.store(true, std::memory_order_release); }

  // Owned by the backend; set before the group is visible to steps.
  std::unique_ptr<BackendGroupState> backend_state;

 private:
  Group(GroupKey key, GroupConfig config, uint64_t page_elements, HostAllocator* allocator);

  const GroupKey key_;
  const GroupConfig config_;
  const uint64_t page_elements_;
  const uint64_t num_pages_;
  HostAllocator* const allocator_;
  float* params_ = nullptr;
  float* exp_avg_ = nullptr;
  float* exp_avg_sq_ = nullptr;
  std::unique_ptr<absl::Mutex[]> page_mutexes_;
  std::unique_ptr<std::atomic<uint64_t>[]> page_steps_;
  std::unique_ptr<std::atomic<bool>[]> page_has_values_;
  std::atomic<uint64_t> pages_awaiting_values_;
  std::atomic<Placement> placement_{Placement::kHost};
  std::atomic<bool> deleted_{false};
  std::atomic<bool> broken_{false};
  mutable GroupCounters counters_;
};

}  // namespace optstate

#endif  // OPTSTATE_SERVER_STATE_GROUP_H_

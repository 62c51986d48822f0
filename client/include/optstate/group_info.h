// What the client says about a parameter group: its hyperparameters, layout,
// progress and placement, as the daemon reports them. Plain values.
#ifndef OPTSTATE_GROUP_INFO_H_
#define OPTSTATE_GROUP_INFO_H_

#include <cstdint>
#include <optional>
#include <string>

namespace optstate {

// torch.optim.AdamW's hyperparameters and defaults. Doubles, as torch holds
// them: pass the values the torch optimizer was given, and the step's scalars
// come out as torch derives them.
struct Hyperparameters {
  double lr = 1e-3;
  double beta1 = 0.9;
  double beta2 = 0.999;
  double eps = 1e-8;
  double weight_decay = 1e-2;
  bool maximize = false;  // Step along the gradient (torch's maximize=True).
  // torch's amsgrad=True: the daemon keeps max_exp_avg_sq (its CUDA backend
  // refuses it with INVALID_ARGUMENT).
  bool amsgrad = false;
};

// The job that holds a group (docs/jobs.md): only its holder may step,
// import over or delete the group until the lease expires and another takes
// it over.
struct Lease {
  std::string holder;  // The holder's id (ClientOptions::lease_holder).
  std::string job;
  std::string host;
  uint64_t pid = 0;
  int64_t last_call_unix_micros = 0;  // The holder's last call on the group.
  int64_t expires_unix_micros = 0;
  bool expired = false;
};

// The hyperparameters the group's last applied step used (the registered
// ones where the step did not override them).
struct LastStep {
  uint64_t step = 0;
  double lr = 0;
  double beta1 = 0;
  double beta2 = 0;
  double eps = 0;
  double weight_decay = 0;
  bool maximize = false;
};

// Where a group's state lives while it is stepped.
enum class Placement {
  kUnspecified,     // The daemon did not say.
  kHost,            // CPU backend: state in host memory, stepped there.
  kDeviceResident,  // CUDA backend: state lives in VRAM.
  kDevicePaged,     // CUDA backend: state on the host, paged through the staging pool.
};

struct GroupInfo {
  std::string name;
  uint64_t num_elements = 0;
  Hyperparameters hyperparameters;
  uint64_t page_elements = 0;  // Chunks start on multiples of this.
  uint64_t num_pages = 0;
  uint64_t min_step = 0;    // Every page has reached at least this step.
  uint64_t max_step = 0;    // The highest step any page has reached.
  uint64_t host_bytes = 0;  // Host memory the group's state takes on the daemon.
  Placement placement = Placement::kUnspecified;
  uint64_t pages_awaiting_values = 0;  // Pages whose initial values have not arrived.
  bool created = false;                // From RegisterGroup: false when it already existed.
  // The owning tenant, in answers to an admin tenant (docs/security.md);
  // empty otherwise.
  std::string tenant;
  std::optional<Lease> lease;  // Unset: no job holds it.
  // Unset: not stepped since the daemon registered, imported or restored it.
  std::optional<LastStep> last_step;
  // A client of several daemons (docs/scale-out.md): the identity of the
  // one that answered for the group. Empty from a client of one daemon.
  std::string member;
  // Set while the group is sealed for a move to that daemon (a Rebalance
  // under way): its steps are refused here.
  std::string moved_to;
};

}  // namespace optstate

#endif  // OPTSTATE_GROUP_INFO_H_

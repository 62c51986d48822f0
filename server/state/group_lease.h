// A job's lease on a group (proto Lease, docs/jobs.md): the job that steps
// a group holds it, so no other job, a restarted trainer or a second job of
// the same names, steps, imports over or deletes it by accident.
#ifndef OPTSTATE_SERVER_STATE_GROUP_LEASE_H_
#define OPTSTATE_SERVER_STATE_GROUP_LEASE_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/strings/string_view.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"

namespace optstate {

// Who makes a call. `id` empty: the call names no holder (it takes no lease,
// and is refused on a group another holds).
struct LeaseHolder {
  std::string id;
  std::string job;
  std::string host;
  uint64_t pid = 0;
};

// What a call says about breaking another holder's lease.
enum class TakeoverKind {
  kNone,
  kExpired,  // Break `holder`'s lease if it has expired.
  kDead,     // Break `holder`'s lease now: the caller knows its process is gone.
};

// One holder whose lease a call breaks.
struct LeaseTakeover {
  TakeoverKind kind = TakeoverKind::kExpired;
  std::string of;  // The holder id it names.
};

struct LeaseClaim {
  LeaseHolder holder;
  // The holders whose leases it may break, each on its own terms (a job
  // whose groups two gone trainers hold names both).
  std::vector<LeaseTakeover> takeovers;
};

// A lease as it is now.
struct LeaseView {
  LeaseHolder holder;
  absl::Time last_call;
  absl::Time expires;
  bool expired = false;
};

// Thread-safe.
class GroupLease {
 public:
  // Whether `claim` may step, import over or delete the group at `now`, and
  // if so, takes or renews its lease (`term` after `now`; a claim without a
  // holder takes none). OK when no one holds the group, when the claim's
  // holder does, when the lease has expired and the claim names no holder
  // or takes it over naming its holder (kExpired), or when it takes it over
  // naming its holder as dead (kDead). Else FAILED_PRECONDITION naming the group, the
  // holder (job, id, host, pid), its last call and when the lease expires,
  // and the ways on; nothing changes then.
  absl::Status Admit(const LeaseClaim& claim, absl::string_view group, absl::Time now,
                     absl::Duration term) ABSL_LOCKS_EXCLUDED(mu_);
  // Admit's answer without taking or renewing anything.
  absl::Status Check(const LeaseClaim& claim, absl::string_view group, absl::Time now) const
      ABSL_LOCKS_EXCLUDED(mu_);

  // nullopt when no one holds the group.
  std::optional<LeaseView> View(absl::Time now) const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  absl::Status Refusal(const LeaseClaim& claim, absl::string_view group, absl::Time now) const
      ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  mutable absl::Mutex mu_;
  std::optional<LeaseHolder> holder_ ABSL_GUARDED_BY(mu_);
  absl::Time last_call_ ABSL_GUARDED_BY(mu_);
  absl::Time expires_ ABSL_GUARDED_BY(mu_);
};

}  // namespace optstate

#endif  // OPTSTATE_SERVER_STATE_GROUP_LEASE_H_

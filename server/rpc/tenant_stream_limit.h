// Concurrent streams of one kind (Step, ExportState) per tenant
// (--tenant_max_streams): a stream holds a slot from its start to its end.
#ifndef OPTSTATE_SERVER_RPC_TENANT_STREAM_LIMIT_H_
#define OPTSTATE_SERVER_RPC_TENANT_STREAM_LIMIT_H_

#include <string>
#include <utility>

#include "absl/container/flat_hash_map.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"

namespace optstate {

class TenantStreamLimit;

// One open stream's place; given back when destroyed. Movable.
class StreamSlot {
 public:
  StreamSlot() = default;
  StreamSlot(StreamSlot&& other) noexcept : limit_(other.limit_), tenant_(std::move(other.tenant_)) {
    other.limit_ = nullptr;
  }
  StreamSlot& operator=(StreamSlot&&) = delete;
  ~StreamSlot() { GiveBack(); }

  // Gives the place back now (a stream about to send its status: the client
  // may open the next one as soon as it has it); idempotent.
  void GiveBack();

 private:
  friend class TenantStreamLimit;
  StreamSlot(TenantStreamLimit* limit, std::string tenant)
      : limit_(limit), tenant_(std::move(tenant)) {}
  TenantStreamLimit* limit_ = nullptr;
  std::string tenant_;
};

// Thread-safe; must outlive its slots.
class TenantStreamLimit {
 public:
  // `max_per_tenant`: streams one tenant may hold open at once; 0: no limit.
  // `kind` names them in the refusal ("Step"), `advice` ends it.
  TenantStreamLimit(int max_per_tenant, std::string kind, std::string advice)
      : max_(max_per_tenant), kind_(std::move(kind)), advice_(std::move(advice)) {}

  // A slot for a new stream of `tenant`; RESOURCE_EXHAUSTED naming the limit
  // and the tenant's open streams when it holds max_per_tenant already.
  absl::StatusOr<StreamSlot> Acquire(const std::string& tenant) ABSL_LOCKS_EXCLUDED(mu_);
  // Streams `tenant` holds open now.
  int OpenOf(const std::string& tenant) const ABSL_LOCKS_EXCLUDED(mu_);

 private:
  friend class StreamSlot;
  void Release(const std::string& tenant) ABSL_LOCKS_EXCLUDED(mu_);

  const int max_;
  const std::string kind_;
  const std::string advice_;
  mutable absl::Mutex mu_;
  absl::flat_hash_map<std::string, int> open_ ABSL_GUARDED_BY(mu_);
};

}  // namespace optstate

#endif  // OPTSTATE_SERVER_RPC_TENANT_STREAM_LIMIT_H_

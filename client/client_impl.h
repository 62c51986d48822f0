// What the client's translation units share: the channel and stub, the cache
// of group layouts, registration, Step's group checks, status translation and
// the retry schedule. Not API.
#ifndef OPTSTATE_CLIENT_CLIENT_IMPL_H_
#define OPTSTATE_CLIENT_CLIENT_IMPL_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "client/step/plan_chunks.h"
#include "client/call/proto_convert.h"
#include "client/transport/shared_memory/shared_memory_plane.h"
#include "grpcpp/grpcpp.h"
#include "optstate/client.h"
#include "optstate/v1/optstate.grpc.pb.h"

namespace optstate {

// Shared by every thread that calls the Client: the first four members are
// set by Connect and only read after it; the layout cache is under `mu`.
struct Client::Impl {
  ClientOptions options;
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::OptimizerState::Stub> stub;
  // Step as a raw method (client/step_wire.h), registered on `channel`.
  std::unique_ptr<grpc::internal::RpcMethod> raw_step;
  // Wire or shared memory (ClientOptions::data_plane); holds the region.
  client_internal::DataPlaneChoice data_plane;

  // Layouts of groups this client has seen (page size, element count).
  absl::Mutex mu;
  absl::flat_hash_map<std::string, GroupInfo> groups ABSL_GUARDED_BY(mu);

  void Remember(const GroupInfo& info) ABSL_LOCKS_EXCLUDED(mu);
  void Forget(const std::string& name) ABSL_LOCKS_EXCLUDED(mu);
  // The cached layout, or DescribeGroup's answer (then cached).
  absl::StatusOr<GroupInfo> Layout(Client& client, const std::string& name) ABSL_LOCKS_EXCLUDED(mu);
  // Step's look at its groups, in order: each group's buffers checked
  // against the wire types and against its layout (the cached one, asked
  // again once when the gradient's length differs), and its pages against
  // the message limit (PagesPerChunk). The layouts, or the first refusal.
  absl::StatusOr<std::vector<client_internal::ChunkGroup>> StepLayouts(
      Client& client, absl::Span<const GroupStep> groups, const StepOptions& options,
      const client_internal::ChunkLimits& limits);
  // RegisterGroup with retries; `initial_values` empty when the spec has none.
  absl::StatusOr<GroupInfo> Register(const v1::GroupSpec& spec,
                                     absl::Span<const float> initial_values);
};

namespace client_internal {

absl::Status FromGrpcStatus(const grpc::Status& status);
// Transient failures a retry may cure; safe to retry because steps are
// exactly-once and registration is idempotent.
bool IsRetryable(const absl::Status& status);
// Sleep before attempt `attempt` (1 for the first retry).
absl::Duration Backoff(const ClientOptions& options, int attempt);
void SetDeadline(grpc::ClientContext* context, const ClientOptions& options);
// A chunk's StepRequest fields but its gradient (or region slices): group,
// step, offset, size, dtypes, the group's or the call's lr, grad_scale. The
// one place both data planes set them.
void ChunkFields(const GroupStep& group, const ChunkPiece& piece, uint64_t step,
                 const StepOptions& options, v1::StepRequest* fields);

}  // namespace client_internal
}  // namespace optstate

#endif  // OPTSTATE_CLIENT_CLIENT_IMPL_H_

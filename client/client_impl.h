// What the Client's translation units share: the channel and stub, the
// data plane choice, the cache of group layouts and registration. Not API.
#ifndef OPTSTATE_CLIENT_CLIENT_IMPL_H_
#define OPTSTATE_CLIENT_CLIENT_IMPL_H_

#include <memory>
#include <string>
#include <vector>

#include "absl/container/flat_hash_map.h"
#include "absl/synchronization/mutex.h"
#include "client/data_plane_choice.h"
#include "client/step/plan_chunks.h"
#include "client/step/step_input.h"
#include "client/transport/step_transport.h"
#include "grpcpp/grpcpp.h"
#include "optstate/client.h"
#include "optstate/v1/optstate.grpc.pb.h"

namespace optstate {

namespace client_internal {

// One daemon of a client of several.
struct ClientMember {
  MemberTarget target;  // identity filled in (the target when none given).
  // Shared by the member lists before and after a Rebalance that keeps it.
  std::shared_ptr<Client> shared;
};
using MemberList = std::vector<std::shared_ptr<const ClientMember>>;

}  // namespace client_internal

// Shared by every thread that calls the Client: the first five members are
// set by Connect and only read after it; the layout cache is under `mu`.
struct Client::Impl {
  ClientOptions options;
  std::string target;  // As given to Connect.
  std::shared_ptr<grpc::Channel> channel;
  std::unique_ptr<v1::OptimizerState::Stub> stub;
  // Step as a raw method (transport/step_stream.h), registered on `channel`.
  std::unique_ptr<grpc::internal::RpcMethod> raw_step;
  // Wire or shared memory (ClientOptions::data_plane); holds the region.
  client_internal::DataPlaneChoice data_plane;

  // A client of several daemons (client_members.cc): each member's own
  // client of one daemon, in the order given. Empty for a client of one
  // daemon (then channel, stub, raw_step and data_plane serve); channel is
  // null otherwise. Replaced whole by Rebalance: callers take a snapshot.
  bool several = false;  // Set by Connect, never changed.
  mutable absl::Mutex members_mu;
  client_internal::MemberList members ABSL_GUARDED_BY(members_mu);
  client_internal::MemberList MembersNow() const ABSL_LOCKS_EXCLUDED(members_mu);
  // Each member's daemon's GetStatsResponse.instance_id (in parallel, one
  // attempt each, ending by `deadline` at the latest), or its error.
  static std::vector<absl::StatusOr<std::string>> InstanceIdsOf(
      const client_internal::MemberList& members, absl::Time deadline = absl::InfiniteFuture());
  // INVALID_ARGUMENT naming two of `members` that reach one daemon (the same
  // instance id, `ids` from InstanceIdsOf). A member that could not be asked
  // refuses with its error when `unreachable_refuses`, else is passed over.
  static absl::Status CheckOneDaemonEach(const client_internal::MemberList& members,
                                         const std::vector<absl::StatusOr<std::string>>& ids,
                                         bool unreachable_refuses);

  // Layouts of groups this client has seen (page size, element count).
  absl::Mutex mu;
  absl::flat_hash_map<std::string, GroupInfo> groups ABSL_GUARDED_BY(mu);

  // `status`, with why the daemon's certificate failed verification when it
  // says it did (client_internal::ExplainCertificateFailure). Every call
  // that reaches the daemon returns its failure through this.
  absl::Status Explain(absl::Status status) const;

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
  // Sends `input`, prepared as `messages` messages, through `transport`:
  // the retry loop over its streams, each resending only the messages not
  // yet answered.
  absl::Status Send(client_internal::StepTransport& transport, size_t messages,
                    const client_internal::StepInput& input);
  // RegisterGroup with retries; `initial_values` empty when the spec has none.
  absl::StatusOr<GroupInfo> Register(const v1::GroupSpec& spec,
                                     absl::Span<const float> initial_values);
};

}  // namespace optstate

#endif  // OPTSTATE_CLIENT_CLIENT_IMPL_H_

// The gRPC service optstate.v1.OptimizerState. It only translates RPCs into
// calls on the state store and the step engine; it holds no optimizer math.
#ifndef OPTSTATE_SERVER_RPC_SERVICE_H_
#define OPTSTATE_SERVER_RPC_SERVICE_H_

#include "absl/container/flat_hash_map.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "optstate/v1/optstate.grpc.pb.h"
#include "server/auth/authenticator.h"
#include "server/durability/checkpointer.h"
#include "server/engine/step_engine.h"
#include "server/regions/region_registry.h"
#include "server/rpc/call_auth.h"
#include "server/rpc/step_stream_metrics.h"
#include "server/rpc/stream_bytes.h"
#include "server/rpc/stream_registry.h"
#include "server/rpc/tenant_stream_limit.h"
#include "server/rpc/unary_calls.h"

namespace optstate {

// Every method on the callback API, raw (grpc::ByteBuffer in and out): the
// service parses requests itself, so bytes that are not the method's request
// get INVALID_ARGUMENT naming it (gRPC's own parsing answers UNIMPLEMENTED
// with no message, or takes a bad message of a client stream, RegisterGroup's
// or ImportState's, for a half-close, and the stream then ends as if whole);
// Step's reactor also writes replies itself (server/rpc/step_reply_builder.h).
using OptimizerStateCallbackBase = v1::OptimizerState::WithRawCallbackMethod_RegisterGroup<
    v1::OptimizerState::WithRawCallbackMethod_Step<
        v1::OptimizerState::WithRawCallbackMethod_GetStats<
            v1::OptimizerState::WithRawCallbackMethod_ListGroups<
                v1::OptimizerState::WithRawCallbackMethod_DescribeGroup<
                    v1::OptimizerState::WithRawCallbackMethod_DeleteGroup<
                        v1::OptimizerState::WithRawCallbackMethod_ExportState<
                            v1::OptimizerState::WithRawCallbackMethod_ImportState<
                                v1::OptimizerState::WithRawCallbackMethod_Checkpoint<
                                    v1::OptimizerState::WithRawCallbackMethod_RewindJob<
                                        v1::OptimizerState::Service>>>>>>>>>>;

// Thread-safe; `engine` must outlive the service.
class OptimizerStateService : public OptimizerStateCallbackBase {
 public:
  // `max_reply_bytes`: the largest message the server may send (Step
  // refuses, before applying anything, a message whose reply would be larger).
  // `stream_idle_timeout`: a Step or RegisterGroup stream idle this long is
  // ended with UNAVAILABLE; zero or infinite: never. `checkpointer`: null
  // without --state_dir (Checkpoint then answers FAILED_PRECONDITION); else it
  // must outlive the service. `regions`: the same-host data plane's regions,
  // or null when the daemon offers none. `trimmer`: told when the daemon has
  // no stream open, and counted in GetStats (may be null; else must outlive
  // the service). `step_metrics`: where Step streams record their phases and
  // bytes (the metrics endpoint; null: nothing is measured).
  // `authenticator`: who each call is (null: every caller is tenant "");
  // every method checks it once per call or stream (UNAUTHENTICATED) and
  // sees only the caller's tenant's groups. `tenant_max_streams`: Step
  // streams one tenant may hold open at once (0: no limit).
  // `step_stream_bytes`: the bytes of requests read and replies not yet sent
  // that Step streams may hold between them before they read more, each
  // beyond its first message (StreamBytes; 0: no such limit).
  OptimizerStateService(StepEngine* engine, size_t max_reply_bytes,
                        absl::Duration stream_idle_timeout = absl::InfiniteDuration(),
                        Checkpointer* checkpointer = nullptr, RegionRegistry* regions = nullptr,
                        HeapTrimmer* trimmer = nullptr, StepStreamMetrics* step_metrics = nullptr,
                        const Authenticator* authenticator = nullptr, int tenant_max_streams = 0,
                        uint64_t step_stream_bytes = 0)
      : engine_(engine),
        max_reply_bytes_(max_reply_bytes),
        streams_(stream_idle_timeout, trimmer),
        step_stream_bytes_(step_stream_bytes),
        checkpointer_(checkpointer),
        regions_(regions),
        trimmer_(trimmer),
        step_metrics_(step_metrics),
        authenticator_(authenticator),
        stream_limit_(tenant_max_streams, "Step",
                      "end a stream (one Client steps many groups over one stream) or raise the "
                      "limit"),
        export_stream_limit_(tenant_max_streams, "ExportState",
                             "read the exports under way to their end (or cancel them), or raise "
                             "the limit"),
        instance_id_(RandomInstanceId()) {}

  // Refuses new streams and ends the open ones with UNAVAILABLE (the daemon
  // is shutting down), each once the work it has under way is answered.
  // Returns at once; call before grpc::Server::Shutdown so open streams do
  // not hold it for its deadline.
  void EndAllStreams() { streams_.EndAll(); }
  // Waits until every stream has finished, or `deadline`; whether all have.
  bool WaitForStreams(absl::Time deadline) { return streams_.WaitUntilEmpty(deadline); }
  // Refuses new unary calls (UNAVAILABLE: the daemon is shutting down) from
  // now on; the ones under way go on.
  void RefuseNewCalls() { unary_calls_.StopAccepting(); }
  // Waits until every unary call under way is answered, or `deadline`;
  // whether all are.
  bool WaitForCalls(absl::Time deadline) { return unary_calls_.WaitUntilNone(deadline); }

  grpc::ServerReadReactor<grpc::ByteBuffer>* RegisterGroup(grpc::CallbackServerContext* context,
                                                           grpc::ByteBuffer* response) override;
  grpc::ServerBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer>* Step(
      grpc::CallbackServerContext* context) override;
  grpc::ServerUnaryReactor* GetStats(grpc::CallbackServerContext* context,
                                     const grpc::ByteBuffer* request,
                                     grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* ListGroups(grpc::CallbackServerContext* context,
                                       const grpc::ByteBuffer* request,
                                       grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* DescribeGroup(grpc::CallbackServerContext* context,
                                          const grpc::ByteBuffer* request,
                                          grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* DeleteGroup(grpc::CallbackServerContext* context,
                                        const grpc::ByteBuffer* request,
                                        grpc::ByteBuffer* response) override;
  grpc::ServerWriteReactor<grpc::ByteBuffer>* ExportState(grpc::CallbackServerContext* context,
                                                          const grpc::ByteBuffer* request) override;
  grpc::ServerReadReactor<grpc::ByteBuffer>* ImportState(grpc::CallbackServerContext* context,
                                                         grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* Checkpoint(grpc::CallbackServerContext* context,
                                       const grpc::ByteBuffer* request,
                                       grpc::ByteBuffer* response) override;
  grpc::ServerUnaryReactor* RewindJob(grpc::CallbackServerContext* context,
                                      const grpc::ByteBuffer* request,
                                      grpc::ByteBuffer* response) override;

  // How many groups the daemon restored from a checkpoint at start, by
  // tenant (GetStatsResponse.restored_groups: a tenant's own, the sum for an
  // admin or where there are no tenants); call before serving.
  void SetRestoredGroups(absl::flat_hash_map<std::string, uint64_t> by_tenant) {
    restored_groups_ = std::move(by_tenant);
  }

 private:
  // The typed halves of the unary methods: OK fills `response`.
  absl::Status FillStats(const Caller& caller, const v1::GetStatsRequest& request,
                         v1::GetStatsResponse* response);
  absl::Status FillGroupList(const Caller& caller, const v1::ListGroupsRequest& request,
                             v1::ListGroupsResponse* response);

  // The caller of the call (call_auth.h), or UNAUTHENTICATED.
  absl::StatusOr<Caller> CallerOf(const grpc::CallbackServerContext* context) const {
    return AuthenticateCall(authenticator_, context);
  }
  // Whether callers are held to tenants (a tokens file or SPIFFE IDs).
  bool tenancy() const { return authenticator_ != nullptr && authenticator_->required(); }
  // The groups `caller` sees: its tenant's by name, or an admin's: every
  // tenant's by (tenant, name).
  std::vector<std::shared_ptr<Group>> VisibleGroups(const Caller& caller) const;
  // The group a Describe or Delete names: the caller's own tenant's (no
  // `owner_named`, or `owner` the caller's tenant), or (admins only) any
  // tenant's, "" among them: the groups made before the daemon had tenants.
  // Another tenant's name for a caller that is no admin gives a key no group
  // has, so the answer is the same NOT_FOUND as for a name that does not
  // exist.
  static GroupKey KeyFor(const Caller& caller, bool owner_named, const std::string& owner,
                         const std::string& name);

  StepEngine* const engine_;
  const size_t max_reply_bytes_;
  StreamRegistry streams_;
  StreamBytes step_stream_bytes_;
  UnaryCalls unary_calls_;
  Checkpointer* const checkpointer_;
  RegionRegistry* const regions_;
  HeapTrimmer* const trimmer_;
  StepStreamMetrics* const step_metrics_;
  const Authenticator* const authenticator_;
  TenantStreamLimit stream_limit_;          // Step streams.
  TenantStreamLimit export_stream_limit_;   // ExportState streams.
  const absl::Time started_ = absl::Now();  // The daemon's start, near enough.
  const std::string instance_id_;            // GetStatsResponse.instance_id.

  // 32 random hex digits (getrandom).
  static std::string RandomInstanceId();
  absl::flat_hash_map<std::string, uint64_t> restored_groups_;
};

}  // namespace optstate

#endif  // OPTSTATE_SERVER_RPC_SERVICE_H_

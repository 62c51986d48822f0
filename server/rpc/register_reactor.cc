// RegisterGroup: the spec registers (idempotently), values chunks fill pages.
//
// How a group this stream created is undone when the call does not end OK:
// 1. A refused message (parse error, bad values, a second spec, ...) is
//    handled on a worker; there the group is removed (StateStore::Unregister)
//    before Finish, so the client that sees the refusal can no longer find it.
// 2. A call gRPC cut (OnCancel: oversized message, deadline, lost
//    connection) never tells the client our status; OnDone schedules the
//    removal on the pool (it waits for page locks, which a gRPC callback
//    must not), shortly after the client saw the call fail.
// 3. Unregister keeps a group that another stream has stepped meanwhile,
//    one another RegisterGroup call was answered with (it holds it as
//    registered), and one that is no longer the group registered under its
//    name.
#include "server/rpc/register_reactor.h"

#include "absl/strings/str_cat.h"
#include "server/rpc/proto_convert.h"
#include "server/rpc/raw_message.h"

namespace optstate {
namespace {

// Registers the group `spec` describes, for `tenant`.
absl::StatusOr<StateStore::Registration> RegisterSpec(StateStore* store, const std::string& tenant,
                                                      const v1::GroupSpec& spec) {
  absl::StatusOr<AdamWHyperparameters> hyperparameters =
      HyperparametersFromProto(spec.hyperparameters());
  if (!hyperparameters.ok()) return hyperparameters.status();
  GroupConfig config;
  config.num_elements = spec.num_elements();
  config.hyperparameters = *hyperparameters;
  config.has_initial_values = spec.has_initial_values();
  return store->Register(GroupKey{tenant, spec.name()}, config);
}

}  // namespace

RegisterReactor::RegisterReactor(StepEngine* engine, std::string tenant, grpc::ByteBuffer* response,
                                 StreamRegistry* streams, LeaseClaim lease)
    : engine_(engine),
      tenant_(std::move(tenant)),
      lease_(std::move(lease)),
      response_(response),
      streams_(streams) {
  {
    absl::MutexLock lock(&mu_);
    last_activity_ = absl::Now();
  }
  if (!streams_->Add(this)) {
    End(StreamRegistry::ShuttingDownError());
    return;
  }
  in_registry_ = true;
  StartRead(&incoming_);
}

bool RegisterReactor::HoldIfIdleSince(absl::Time idle_since) {
  absl::MutexLock lock(&mu_);
  if (finish_called_ || final_.has_value() || ending_) return false;
  if (idle_since != absl::InfiniteFuture() && (handling_ || last_activity_ > idle_since)) {
    return false;
  }
  ending_ = true;
  ++holds_;
  return true;
}

void RegisterReactor::EndHeld(absl::Status status) {
  bool handling;
  {
    absl::MutexLock lock(&mu_);
    --holds_;
    if (!final_.has_value()) final_ = status;
    handling = handling_;
  }
  // A message on a worker ends the call when it is done (HandleMessage).
  if (!handling) End(std::move(status));
}

void RegisterReactor::OnReadDone(bool ok) {
  if (!ok) {
    // Client half-closed (or the call broke: Finish is then a no-op, and
    // OnCancel has marked it).
    if (!registered_) {
      End(absl::InvalidArgumentError("RegisterGroup needs a first message with a spec"));
      return;
    }
    std::shared_ptr<Group> group = group_.lock();
    if (group == nullptr || group->deleted()) {
      End(GroupDeletedError());
      return;
    }
    v1::RegisterGroupResponse response;
    GroupInfoToProto(*group, response.mutable_group());
    response.set_created(created_);
    absl::Status serialized = SerializeRawMessage(response, response_);
    End(serialized);
    return;
  }
  {
    absl::MutexLock lock(&mu_);
    last_activity_ = absl::Now();
    if (final_.has_value() || ending_) return;  // Ending; the message is dropped.
    handling_ = true;
  }
  engine_->pool()->Schedule([this] { HandleMessage(); });
}

void RegisterReactor::HandleMessage() {
  ++messages_;
  v1::RegisterGroupRequest request;
  absl::Status status = ParseRawMessage(
      incoming_, &request, absl::StrCat("message ", messages_, " of the RegisterGroup stream"));
  incoming_.Clear();
  if (status.ok()) status = HandleRequest(request);
  bool read_on, held;
  {
    absl::MutexLock lock(&mu_);
    handling_ = false;
    last_activity_ = absl::Now();
    read_on = status.ok() && !final_.has_value() && !ending_;
    // Held by the registry, which has not set the status yet: EndHeld ends
    // the call (it sees handling_ cleared). Ending it OK here would finish
    // with no response message.
    held = status.ok() && !final_.has_value() && ending_;
  }
  if (read_on) {
    StartRead(&incoming_);
  } else if (!held) {
    End(status);  // A refusal, or OK when the registry's status is set.
  }
}

absl::Status RegisterReactor::HandleRequest(const v1::RegisterGroupRequest& request) {
  if (!registered_) {
    if (!request.has_spec()) {
      return absl::InvalidArgumentError(
          "the first RegisterGroup message must carry a spec (name, num_elements, "
          "hyperparameters)");
    }
    const v1::GroupSpec& spec = request.spec();
    absl::StatusOr<StateStore::Registration> registered =
        RegisterSpec(engine_->store(), tenant_, spec);
    if (!registered.ok()) return registered.status();
    group_ = registered->group;
    registered_ = true;
    name_ = spec.name();
    created_ = registered->created;
    return absl::OkStatus();
  }
  if (!request.has_values()) {
    return absl::InvalidArgumentError(
        request.has_spec()
            ? "only the first RegisterGroup message may carry a spec; later ones carry values"
            : "a RegisterGroup message after the first must carry values (this one carries "
              "neither spec nor values)");
  }
  const v1::ValuesChunk& values = request.values();
  absl::StatusOr<WireType> type = WireTypeFromProto(values.dtype(), "values.dtype");
  if (!type.ok()) return type.status();
  std::shared_ptr<Group> group = group_.lock();
  if (group == nullptr) return GroupDeletedError();
  return engine_->WriteInitialValues(*group, values.offset(), *type, values.data(), &lease_);
}

void RegisterReactor::End(absl::Status status) {
  bool ok;
  {
    absl::MutexLock lock(&mu_);
    if (!final_.has_value()) final_ = std::move(status);
    ok = final_->ok();
  }
  // A refusal undoes the registration before the client can see the status.
  if (!ok) RemoveCreatedGroup();
  FinishIfDue();
}

void RegisterReactor::FinishIfDue() {
  absl::Status status;
  {
    absl::MutexLock lock(&mu_);
    if (finish_called_ || !final_.has_value() || handling_ || holds_ > 0) return;
    finish_called_ = true;
    status = *final_;
  }
  Finish(ToGrpcStatus(status));  // OnDone may delete `this` from here on.
}

void RegisterReactor::RemoveCreatedGroup() {
  {
    absl::MutexLock lock(&mu_);
    if (removed_) return;
    removed_ = true;
  }
  if (!created_) return;
  std::shared_ptr<Group> group = group_.lock();
  if (group != nullptr) engine_->store()->Unregister(group);
}

absl::Status RegisterReactor::GroupDeletedError() const {
  return absl::NotFoundError(absl::StrCat("group '", name_,
                                          "' was deleted while this RegisterGroup call was open; "
                                          "register it again"));
}

void RegisterReactor::OnDone() {
  if (in_registry_) streams_->Remove(this);
  bool undo;
  {
    absl::MutexLock lock(&mu_);
    undo = cancelled_.load(std::memory_order_acquire) && created_ && !removed_;
  }
  if (undo) {
    // The call broke: undo off the gRPC thread (Unregister takes page locks).
    StateStore* store = engine_->store();
    engine_->pool()->Schedule([store, group = group_] {
      if (std::shared_ptr<Group> held = group.lock()) store->Unregister(held);
    });
  }
  delete this;
}

}  // namespace optstate

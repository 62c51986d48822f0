// RegisterGroup: the spec registers (idempotently), values chunks fill pages.
#include "server/rpc/register_reactor.h"

#include "absl/strings/str_cat.h"
#include "server/rpc/proto_convert.h"

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

RegisterReactor::RegisterReactor(StepEngine* engine, std::string tenant,
                                 v1::RegisterGroupResponse* response)
    : engine_(engine), tenant_(std::move(tenant)), response_(response) {
  StartRead(&request_);
}

void RegisterReactor::OnReadDone(bool ok) {
  if (!ok) {
    // Client half-closed (or the call broke: Finish is then a no-op).
    if (!registered_) {
      Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          "RegisterGroup needs a first message with a spec"));
      return;
    }
    FinishWithGroup();
    return;
  }
  engine_->pool()->Schedule([this] { HandleMessage(); });
}

void RegisterReactor::HandleMessage() {
  absl::Status status;
  if (!registered_) {
    if (!request_.has_spec()) {
      status = absl::InvalidArgumentError(
          "the first RegisterGroup message must carry a spec (name, num_elements, "
          "hyperparameters)");
    } else {
      const v1::GroupSpec& spec = request_.spec();
      absl::StatusOr<StateStore::Registration> registered =
          RegisterSpec(engine_->store(), tenant_, spec);
      if (registered.ok()) {
        group_ = registered->group;
        registered_ = true;
        name_ = spec.name();
        created_ = registered->created;
      } else {
        status = registered.status();
      }
    }
  } else if (!request_.has_values()) {
    status = absl::InvalidArgumentError(
        "only the first RegisterGroup message may carry a spec; later ones carry values");
  } else {
    const v1::ValuesChunk& values = request_.values();
    absl::StatusOr<WireType> type = WireTypeFromProto(values.dtype(), "values.dtype");
    std::shared_ptr<Group> group = group_.lock();
    if (!type.ok()) {
      status = type.status();
    } else if (group == nullptr) {
      status = GroupDeletedError();
    } else {
      status = engine_->WriteInitialValues(*group, values.offset(), *type, values.data());
    }
  }
  if (!status.ok()) {
    Finish(ToGrpcStatus(status));
    return;
  }
  request_.Clear();
  StartRead(&request_);
}

absl::Status RegisterReactor::GroupDeletedError() const {
  return absl::NotFoundError(absl::StrCat("group '", name_,
                                          "' was deleted while this RegisterGroup call was open; "
                                          "register it again"));
}

void RegisterReactor::FinishWithGroup() {
  std::shared_ptr<Group> group = group_.lock();
  if (group == nullptr || group->deleted()) {
    Finish(ToGrpcStatus(GroupDeletedError()));
    return;
  }
  GroupInfoToProto(*group, response_->mutable_group());
  response_->set_created(created_);
  Finish(grpc::Status::OK);
}

}  // namespace optstate

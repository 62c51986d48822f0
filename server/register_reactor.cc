// RegisterGroup: the spec registers (idempotently), values chunks fill pages.
#include "server/register_reactor.h"

#include "server/proto_convert.h"

namespace optstate {

RegisterReactor::RegisterReactor(StepEngine* engine, std::string tenant,
                                 v1::RegisterGroupResponse* response)
    : engine_(engine), tenant_(std::move(tenant)), response_(response) {
  StartRead(&request_);
}

void RegisterReactor::OnReadDone(bool ok) {
  if (!ok) {
    // Client half-closed (or the call broke: Finish is then a no-op).
    if (group_ == nullptr) {
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
  if (group_ == nullptr) {
    if (!request_.has_spec()) {
      status = absl::InvalidArgumentError(
          "the first RegisterGroup message must carry a spec (name, num_elements, "
          "hyperparameters)");
    } else {
      const v1::GroupSpec& spec = request_.spec();
      GroupConfig config;
      config.num_elements = spec.num_elements();
      config.hyperparameters = HyperparametersFromProto(spec.hyperparameters());
      config.has_initial_values = spec.has_initial_values();
      absl::StatusOr<StateStore::Registration> registered =
          engine_->store()->Register(GroupKey{tenant_, spec.name()}, config);
      if (registered.ok()) {
        group_ = registered->group;
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
    status = type.ok() ? engine_->WriteInitialValues(*group_, values.offset(), *type,
                                                     values.data())
                       : type.status();
  }
  if (!status.ok()) {
    Finish(ToGrpcStatus(status));
    return;
  }
  request_.Clear();
  StartRead(&request_);
}

void RegisterReactor::FinishWithGroup() {
  GroupInfoToProto(*group_, response_->mutable_group());
  response_->set_created(created_);
  Finish(grpc::Status::OK);
}

}  // namespace optstate

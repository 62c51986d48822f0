// ImportState: the header stages the group, chunks fill it, the end installs it.
#include "server/rpc/import_reactor.h"

#include "absl/strings/str_cat.h"
#include "server/rpc/proto_convert.h"

namespace optstate {
namespace {

absl::StatusOr<StateTensor> TensorFromProto(v1::StateTensor tensor) {
  switch (tensor) {
    case v1::STATE_TENSOR_PARAMS:
      return StateTensor::kParams;
    case v1::STATE_TENSOR_EXP_AVG:
      return StateTensor::kExpAvg;
    case v1::STATE_TENSOR_EXP_AVG_SQ:
      return StateTensor::kExpAvgSq;
    case v1::STATE_TENSOR_PAGE_STEPS:
      return StateTensor::kPageSteps;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("chunk.tensor ", static_cast<int>(tensor),
                       " is not a tensor of the state; use STATE_TENSOR_PARAMS, _EXP_AVG, "
                       "_EXP_AVG_SQ or _PAGE_STEPS"));
  }
}

}  // namespace

ImportReactor::ImportReactor(StepEngine* engine, grpc::CallbackServerContext* context,
                             std::string tenant, v1::ImportStateResponse* response)
    : engine_(engine), context_(context), tenant_(std::move(tenant)), response_(response) {
  StartRead(&request_);
}

void ImportReactor::OnReadDone(bool ok) {
  if (!ok) {
    if (context_->IsCancelled()) {
      // A broken stream: drop what arrived (Finish is a no-op for the peer).
      import_.reset();
      Finish(
          grpc::Status(grpc::StatusCode::CANCELLED, "the import stream broke; nothing imported"));
      return;
    }
    if (import_ == nullptr) {
      Finish(grpc::Status(grpc::StatusCode::INVALID_ARGUMENT,
                          "ImportState needs a first message with a header"));
      return;
    }
    engine_->pool()->Schedule([this] { CommitAndFinish(); });
    return;
  }
  engine_->pool()->Schedule([this] { HandleMessage(); });
}

void ImportReactor::HandleMessage() {
  absl::Status status;
  if (import_ == nullptr) {
    if (!request_.has_header()) {
      status = absl::InvalidArgumentError(
          "the first ImportState message must carry a header (name, num_elements, "
          "hyperparameters)");
    } else {
      const v1::GroupStateHeader& h = request_.header();
      absl::StatusOr<AdamWHyperparameters> hyperparameters =
          HyperparametersFromProto(h.hyperparameters());
      if (!hyperparameters.ok()) {
        status = hyperparameters.status();
      } else {
        StateHeader header{GroupKey{tenant_, h.name()}, h.num_elements(), *hyperparameters};
        absl::StatusOr<std::unique_ptr<StateImport>> begun =
            StateImport::Begin(engine_->store(), engine_->backend(), header);
        if (begun.ok()) {
          import_ = std::move(*begun);
        } else {
          status = begun.status();
        }
      }
    }
  } else if (!request_.has_chunk()) {
    status = absl::InvalidArgumentError(
        "only the first ImportState message may carry a header; later ones carry chunks");
  } else {
    const v1::StateChunk& chunk = request_.chunk();
    absl::StatusOr<StateTensor> tensor = TensorFromProto(chunk.tensor());
    status =
        tensor.ok() ? import_->AddChunk(*tensor, chunk.offset(), chunk.data()) : tensor.status();
  }
  if (!status.ok()) {
    import_.reset();
    Finish(ToGrpcStatus(status));
    return;
  }
  request_.Clear();
  StartRead(&request_);
}

void ImportReactor::CommitAndFinish() {
  absl::StatusOr<StateImport::Result> result = import_->Commit();
  import_.reset();
  if (!result.ok()) {
    Finish(ToGrpcStatus(result.status()));
    return;
  }
  GroupInfoToProto(*result->group, response_->mutable_group());
  response_->set_replaced(result->replaced);
  Finish(grpc::Status::OK);
}

}  // namespace optstate

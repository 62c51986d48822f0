// ImportState: the header stages the group, chunks fill it, the end installs it.
#include "server/rpc/import_reactor.h"

#include <system_error>
#include <thread>

#include "absl/strings/str_cat.h"
#include "server/rpc/proto_convert.h"
#include "server/rpc/raw_message.h"

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
    case v1::STATE_TENSOR_MAX_EXP_AVG_SQ:
      return StateTensor::kMaxExpAvgSq;
    default:
      return absl::InvalidArgumentError(
          absl::StrCat("chunk.tensor ", static_cast<int>(tensor),
                       " is not a tensor of the state; use STATE_TENSOR_PARAMS, _EXP_AVG, "
                       "_EXP_AVG_SQ, _PAGE_STEPS or _MAX_EXP_AVG_SQ"));
  }
}

}  // namespace

ImportReactor::ImportReactor(StepEngine* engine, grpc::CallbackServerContext* context,
                             std::string tenant, grpc::ByteBuffer* response,
                             StreamRegistry* streams, LeaseClaim lease, Checkpointer* checkpointer)
    : engine_(engine),
      checkpointer_(checkpointer),
      context_(context),
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

bool ImportReactor::HoldIfIdleSince(absl::Time idle_since) {
  absl::MutexLock lock(&mu_);
  if (finish_called_ || final_.has_value() || ending_ || committing_) return false;
  if (idle_since != absl::InfiniteFuture() && (handling_ || last_activity_ > idle_since)) {
    return false;
  }
  ending_ = true;
  ++holds_;
  return true;
}

void ImportReactor::EndHeld(absl::Status status) {
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

void ImportReactor::OnReadDone(bool ok) {
  enum class Next { kFinishIfDue, kEnd, kHandle, kCommit } next;
  absl::Status status;
  {
    absl::MutexLock lock(&mu_);
    last_activity_ = absl::Now();
    if (final_.has_value() || ending_) {
      next = Next::kFinishIfDue;  // Being ended: the message or half-close is dropped.
    } else if (ok) {
      handling_ = true;
      next = Next::kHandle;
    } else if (context_->IsCancelled()) {
      // A broken stream: drop what arrived (Finish is a no-op for the peer).
      status = absl::CancelledError("the import stream broke; nothing imported");
      next = Next::kEnd;
    } else if (!has_header_) {
      status = absl::InvalidArgumentError("ImportState needs a first message with a header");
      next = Next::kEnd;
    } else {
      handling_ = committing_ = true;
      next = Next::kCommit;
    }
  }
  switch (next) {
    case Next::kFinishIfDue:
      FinishIfDue();
      break;
    case Next::kEnd:
      End(std::move(status));
      break;
    case Next::kHandle:
      engine_->pool()->Schedule([this] { HandleMessage(); });
      break;
    case Next::kCommit:
      if (checkpointer_ != nullptr) {
        // A commit over an existing group waits for a checkpoint being
        // written (StateImport::Commit), which may take minutes: on a thread
        // of its own, not a worker that Steps of every job need.
        try {
          std::thread([this] { CommitAndFinish(); }).detach();
          break;
        } catch (const std::system_error&) {
          // No thread: the worker waits instead.
        }
      }
      engine_->pool()->Schedule([this] { CommitAndFinish(); });
      break;
  }
}

void ImportReactor::HandleMessage() {
  ++messages_;
  v1::ImportStateRequest request;
  absl::Status status = ParseRawMessage(
      incoming_, &request, absl::StrCat("message ", messages_, " of the ImportState stream"));
  incoming_.Clear();
  if (!status.ok()) {
    // Refused below; the import gathered so far is dropped with the call.
  } else if (import_ == nullptr) {
    if (!request.has_header()) {
      status = absl::InvalidArgumentError(
          "the first ImportState message must carry a header (name, num_elements, "
          "hyperparameters)");
    } else {
      const v1::GroupStateHeader& h = request.header();
      absl::StatusOr<AdamWHyperparameters> hyperparameters =
          HyperparametersFromProto(h.hyperparameters());
      if (!hyperparameters.ok()) {
        status = hyperparameters.status();
      } else {
        StateHeader header{GroupKey{tenant_, h.name()}, h.num_elements(), *hyperparameters,
                           h.accept_non_finite()};
        absl::StatusOr<std::unique_ptr<StateImport>> begun =
            StateImport::Begin(engine_->store(), engine_->backend(), header);
        if (begun.ok()) {
          import_ = std::move(*begun);
        } else {
          status = begun.status();
        }
      }
    }
  } else if (!request.has_chunk()) {
    status = absl::InvalidArgumentError(
        request.has_header()
            ? "only the first ImportState message may carry a header; later ones carry chunks"
            : "an ImportState message after the first must carry a chunk (this one carries "
              "neither header nor chunk)");
  } else {
    const v1::StateChunk& chunk = request.chunk();
    absl::StatusOr<StateTensor> tensor = TensorFromProto(chunk.tensor());
    status =
        tensor.ok() ? import_->AddChunk(*tensor, chunk.offset(), chunk.data()) : tensor.status();
  }
  bool read_on, held;
  {
    absl::MutexLock lock(&mu_);
    handling_ = false;
    has_header_ = import_ != nullptr;
    last_activity_ = absl::Now();
    read_on = status.ok() && !final_.has_value() && !ending_;
    // Held by the registry, which has not set its status yet: EndHeld ends
    // the call (it sees handling_ cleared).
    held = status.ok() && !final_.has_value() && ending_;
  }
  if (read_on) {
    StartRead(&incoming_);
  } else if (!held) {
    End(status);  // A refusal, or (status OK) the registry's status, already set.
  }
}

void ImportReactor::CommitAndFinish() {
  absl::StatusOr<StateImport::Result> result = import_->Commit(lease_, checkpointer_);
  import_.reset();
  absl::Status status = result.status();
  if (result.ok()) {
    v1::ImportStateResponse response;
    GroupInfoToProto(*result->group, response.mutable_group());
    response.set_replaced(result->replaced);
    status = SerializeRawMessage(response, response_);
  }
  {
    absl::MutexLock lock(&mu_);
    handling_ = false;
    // Not held while committing (HoldIfIdleSince), so this is the call's
    // outcome.
    if (!final_.has_value()) final_ = status;
  }
  FinishIfDue();
}

void ImportReactor::End(absl::Status status) {
  {
    absl::MutexLock lock(&mu_);
    if (!final_.has_value()) final_ = std::move(status);
  }
  FinishIfDue();
}

void ImportReactor::FinishIfDue() {
  absl::Status status;
  {
    absl::MutexLock lock(&mu_);
    if (finish_called_ || !final_.has_value() || handling_ || holds_ > 0) return;
    finish_called_ = true;
    status = *final_;
  }
  // Nothing handles a message any more: the import gathered so far (none
  // after a commit) is dropped, its staged memory given back, before the
  // client hears the status.
  import_.reset();
  Finish(ToGrpcStatus(status));  // OnDone may delete `this` from here on.
}

void ImportReactor::OnDone() {
  if (in_registry_) streams_->Remove(this);
  delete this;
}

}  // namespace optstate

// ExportState, ImportState and Checkpoint: a group's whole state in chunks
// that fit any message limit, and the trainer's checkpoint call.
#include <algorithm>
#include <cstring>

#include "absl/strings/str_cat.h"
#include "client/call/proto_convert.h"
#include "client/call/retry.h"
#include "client/call/status.h"
#include "client/client_impl.h"
#include "optstate/message_limits.h"

namespace optstate {
namespace {

using client_internal::FromGrpcStatus;
using client_internal::PrepareContext;
using client_internal::WithRetries;

// Bytes of payload per chunk: chunk_bytes, within the message limit.
uint64_t ChunkBytes(const ClientOptions& options) {
  const uint64_t limit = static_cast<uint64_t>(options.max_message_bytes) - kMessageFieldRoomBytes;
  return std::max<uint64_t>(8, std::min<uint64_t>(options.chunk_bytes, limit)) / 8 * 8;
}

absl::StatusOr<Client::GroupState> ExportOnce(v1::OptimizerState::Stub& stub,
                                              const ClientOptions& options, const std::string& name,
                                              const std::string& moved_to) {
  grpc::ClientContext context;
  PrepareContext(&context, options);
  v1::ExportStateRequest request;
  request.set_name(name);
  request.set_moved_to(moved_to);
  std::unique_ptr<grpc::ClientReader<v1::ExportStateResponse>> reader =
      stub.ExportState(&context, request);
  v1::ExportStateResponse response;
  Client::GroupState state;
  bool have_header = false;
  uint64_t num_elements = 0;
  absl::Status malformed;
  while (malformed.ok() && reader->Read(&response)) {
    if (response.has_header()) {
      const v1::GroupStateHeader& h = response.header();
      const v1::AdamWHyperparameters& hp = h.hyperparameters();
      state.name = h.name();
      state.hyperparameters = client_internal::HyperparametersFromProto(hp);
      state.page_elements = h.page_elements();
      num_elements = h.num_elements();
      if (state.page_elements == 0) {
        malformed = absl::InternalError("ExportState header has page_elements 0");
        break;
      }
      state.params.assign(num_elements, 0.0f);
      state.exp_avg.assign(num_elements, 0.0f);
      state.exp_avg_sq.assign(num_elements, 0.0f);
      if (state.hyperparameters.amsgrad) state.max_exp_avg_sq.assign(num_elements, 0.0f);
      state.page_steps.assign((num_elements + state.page_elements - 1) / state.page_elements, 0);
      have_header = true;
      continue;
    }
    const v1::StateChunk& chunk = response.chunk();
    const std::string& data = chunk.data();
    if (!have_header) {
      malformed = absl::InternalError("ExportState sent a chunk before its header");
    } else if (chunk.tensor() == v1::STATE_TENSOR_PAGE_STEPS) {
      const uint64_t count = data.size() / sizeof(uint64_t);
      if (data.size() % sizeof(uint64_t) != 0 || chunk.offset() > state.page_steps.size() ||
          count > state.page_steps.size() - chunk.offset()) {
        malformed = absl::InternalError("ExportState sent page steps out of range");
      } else {
        std::memcpy(state.page_steps.data() + chunk.offset(), data.data(), data.size());
      }
    } else {
      std::vector<float>* target =
          chunk.tensor() == v1::STATE_TENSOR_PARAMS       ? &state.params
          : chunk.tensor() == v1::STATE_TENSOR_EXP_AVG    ? &state.exp_avg
          : chunk.tensor() == v1::STATE_TENSOR_EXP_AVG_SQ ? &state.exp_avg_sq
          : chunk.tensor() == v1::STATE_TENSOR_MAX_EXP_AVG_SQ && state.hyperparameters.amsgrad
              ? &state.max_exp_avg_sq
              : nullptr;
      const uint64_t count = data.size() / sizeof(float);
      if (target == nullptr || data.size() % sizeof(float) != 0 || chunk.offset() > num_elements ||
          count > num_elements - chunk.offset()) {
        malformed = absl::InternalError("ExportState sent a chunk out of range");
      } else {
        std::memcpy(target->data() + chunk.offset(), data.data(), data.size());
      }
    }
  }
  if (!malformed.ok()) {
    context.TryCancel();
    reader->Finish();
    return malformed;
  }
  absl::Status status = FromGrpcStatus(reader->Finish());
  if (!status.ok()) return status;
  if (!have_header) return absl::InternalError("ExportState ended without a header");
  return state;
}

absl::Status ImportOnce(v1::OptimizerState::Stub& stub, const ClientOptions& options,
                        const Client::GroupState& state) {
  grpc::ClientContext context;
  PrepareContext(&context, options);
  v1::ImportStateResponse response;
  std::unique_ptr<grpc::ClientWriter<v1::ImportStateRequest>> writer =
      stub.ImportState(&context, &response);
  v1::ImportStateRequest request;
  v1::GroupStateHeader* header = request.mutable_header();
  header->set_name(state.name);
  header->set_num_elements(state.params.size());
  client_internal::HyperparametersToProto(state.hyperparameters, header->mutable_hyperparameters());
  header->set_accept_non_finite(state.accept_non_finite);
  bool ok = writer->Write(request);
  const uint64_t chunk_bytes = ChunkBytes(options);
  auto send = [&](v1::StateTensor tensor, const char* data, uint64_t count, size_t size) {
    const uint64_t per_chunk = chunk_bytes / size;
    for (uint64_t at = 0; ok && at < count; at += per_chunk) {
      const uint64_t n = std::min(per_chunk, count - at);
      request.Clear();
      v1::StateChunk* chunk = request.mutable_chunk();
      chunk->set_tensor(tensor);
      chunk->set_offset(at);
      chunk->set_data(data + at * size, n * size);
      ok = writer->Write(request);
    }
  };
  send(v1::STATE_TENSOR_PAGE_STEPS, reinterpret_cast<const char*>(state.page_steps.data()),
       state.page_steps.size(), sizeof(uint64_t));
  send(v1::STATE_TENSOR_PARAMS, reinterpret_cast<const char*>(state.params.data()),
       state.params.size(), sizeof(float));
  send(v1::STATE_TENSOR_EXP_AVG, reinterpret_cast<const char*>(state.exp_avg.data()),
       state.exp_avg.size(), sizeof(float));
  send(v1::STATE_TENSOR_EXP_AVG_SQ, reinterpret_cast<const char*>(state.exp_avg_sq.data()),
       state.exp_avg_sq.size(), sizeof(float));
  send(v1::STATE_TENSOR_MAX_EXP_AVG_SQ, reinterpret_cast<const char*>(state.max_exp_avg_sq.data()),
       state.max_exp_avg_sq.size(), sizeof(float));
  writer->WritesDone();
  return FromGrpcStatus(writer->Finish());
}

}  // namespace

absl::StatusOr<Client::GroupState> Client::ExportState(const std::string& name) {
  if (Client* owner = OwnerClient(name)) {
    absl::StatusOr<GroupState> state = owner->ExportState(name);
    if (!state.ok()) return InOwner(name, state.status());
    return state;
  }
  return ExportStateForMove(name, "");
}

absl::StatusOr<Client::GroupState> Client::ExportStateForMove(const std::string& name,
                                                              const std::string& moved_to) {
  absl::StatusOr<GroupState> state;
  absl::Status status = WithRetries(impl_->options, impl_->channel.get(), [&](int) {
    state = ExportOnce(*impl_->stub, impl_->options, name, moved_to);
    return state.status();
  });
  if (!status.ok()) return impl_->Explain(status);
  return state;
}

absl::Status Client::ImportState(const GroupState& state) {
  if (Client* owner = OwnerClient(state.name)) {
    return InOwner(state.name, owner->ImportState(state));
  }
  return ImportStateForMove(state, /*take_lease=*/true);
}

absl::Status Client::ImportStateForMove(const GroupState& state, bool take_lease) {
  const size_t n = state.params.size();
  if (n == 0 || state.exp_avg.size() != n || state.exp_avg_sq.size() != n) {
    return absl::InvalidArgumentError(
        absl::StrCat("GroupState of '", state.name, "' has params of ", n, " elements, exp_avg of ",
                     state.exp_avg.size(), " and exp_avg_sq of ", state.exp_avg_sq.size(),
                     "; all three must have the group's size, at least 1"));
  }
  if (state.max_exp_avg_sq.size() != (state.hyperparameters.amsgrad ? n : 0)) {
    return absl::InvalidArgumentError(absl::StrCat(
        "GroupState of '", state.name, "' has max_exp_avg_sq of ", state.max_exp_avg_sq.size(),
        " elements with amsgrad=", state.hyperparameters.amsgrad ? "true" : "false",
        "; it must have the group's size with amsgrad, and be empty without"));
  }
  if (state.page_steps.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "GroupState of '", state.name,
        "' has no page_steps; give one per daemon page, or exactly one for every page"));
  }
  impl_->Forget(state.name);
  ClientOptions options = impl_->options;
  if (!take_lease) {
    options.lease_holder.clear();
    options.lease_takeover.clear();
  }
  return impl_->Explain(WithRetries(impl_->options, impl_->channel.get(),
                                    [&](int) { return ImportOnce(*impl_->stub, options, state); }));
}

absl::StatusOr<Client::CheckpointResult> Client::Checkpoint(
    const CheckpointRequestOptions& options) {
  if (impl_->several) return CheckpointMembers(options);
  if (absl::Status s = RideOutRestart(); !s.ok()) return s;
  grpc::ClientContext context;
  PrepareContext(&context, impl_->options);
  v1::CheckpointRequest request;
  for (const std::string& group : options.groups) request.add_groups(group);
  if (options.wait_for_step) request.set_wait_for_step(*options.wait_for_step);
  v1::CheckpointResponse response;
  absl::Status status = FromGrpcStatus(impl_->stub->Checkpoint(&context, request, &response));
  if (!status.ok()) return impl_->Explain(status);
  return CheckpointResult{response.id(), response.step(), response.bytes()};
}

absl::StatusOr<Client::RewindResult> Client::RewindJob(const std::string& prefix,
                                                       std::optional<uint64_t> step,
                                                       bool validate_only) {
  if (impl_->several) return RewindMembers(prefix, step, validate_only);
  if (absl::Status s = RideOutRestart(); !s.ok()) return s;
  grpc::ClientContext context;
  PrepareContext(&context, impl_->options);
  v1::RewindJobRequest request;
  request.set_prefix(prefix);
  if (step.has_value()) request.set_step(*step);
  request.set_validate_only(validate_only);
  v1::RewindJobResponse response;
  absl::Status status = FromGrpcStatus(impl_->stub->RewindJob(&context, request, &response));
  if (!status.ok()) return impl_->Explain(status);
  // The rewound groups' layouts are as before (same size); their steps moved.
  RewindResult result;
  result.checkpoint_id = response.checkpoint_id();
  result.step = response.step();
  result.groups.assign(response.groups().begin(), response.groups().end());
  result.passed_over.assign(response.passed_over().begin(), response.passed_over().end());
  result.written_checkpoint_id = response.written_checkpoint_id();
  result.not_written = response.not_written();
  return result;
}

}  // namespace optstate

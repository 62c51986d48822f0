// Reads and applies one input as the Step reactor would, and checks what
// must hold whatever the bytes.
#include "tests/fuzz/step_input_target.h"

#include <unistd.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "common/region_protocol.h"
#include "google/protobuf/stubs/logging.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/slice.h"
#include "optstate/dtype.h"
#include "optstate/v1/step_wire_format.h"
#include "server/base/log.h"
#include "server/rpc/proto_convert.h"
#include "server/rpc/step_message.h"
#include "server/rpc/step_plan.h"
#include "server/rpc/step_request_reader.h"
#include "tests/testing/random_cuts.h"

namespace optstate::fuzz {
namespace {

using testing::Gather;

// Where `cut` (a byte) says to cut `n` bytes: into up to three slices.
std::vector<size_t> Cuts(size_t n, uint8_t cut) {
  const size_t first = (cut & 0x0f) * n / 16;
  return {first, first + (cut >> 4) * (n - first) / 16};
}

// The reply as one string, parsed by protobuf.
bool ParseReply(const std::vector<grpc::Slice>& slices, v1::StepResponse* reply) {
  std::string bytes;
  for (const grpc::Slice& slice : slices) {
    bytes.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
  }
  return reply->ParseFromString(bytes);
}

}  // namespace

StepInputTarget::StepInputTarget()
    : pool_(2),
      backend_(&pool_),
      store_(&backend_, 1ull << 30, kPage),
      engine_(&store_, &backend_, &pool_) {
  // Quiet: protobuf logs every non-UTF-8 name it refuses, the store every
  // registration.
  google::protobuf::SetLogHandler(nullptr);
  SetLogLevel(LogLevel::kError);
  // A group whose last page is short, a one-page group, and one still
  // waiting for its initial values.
  for (auto [name, elements, values] :
       {std::tuple{"a", 3000, false}, {"b", 1024, false}, {"c", 2048, true}}) {
    GroupConfig config;
    config.num_elements = elements;
    config.has_initial_values = values;
    if (!store_.Register(GroupKey{"", name}, config).ok()) std::abort();
  }
  // One region of small finite gradients (and room for params).
  session_ = regions_.OpenSession("");
  absl::StatusOr<int> memfd = region_protocol::CreateSealedMemfd("fuzz-region", kRegionBytes);
  if (!memfd.ok()) std::abort();
  std::vector<float> values(kRegionBytes / sizeof(float));
  for (size_t i = 0; i < values.size(); ++i) values[i] = 0.01f * std::cos(0.3f * i);
  if (pwrite(*memfd, values.data(), kRegionBytes, 0) != static_cast<ssize_t>(kRegionBytes)) {
    std::abort();
  }
  absl::StatusOr<std::shared_ptr<const MappedRegion>> region = regions_.Register(session_, *memfd);
  if (!region.ok() || (*region)->id() != 1) std::abort();
}

std::string StepInputTarget::Snapshot() const {
  std::string state;
  for (const auto& group : store_.List("")) {
    const size_t bytes = group->num_elements() * sizeof(float);
    state.append(reinterpret_cast<const char*>(group->params()), bytes);
    state.append(reinterpret_cast<const char*>(group->exp_avg()), bytes);
    state.append(reinterpret_cast<const char*>(group->exp_avg_sq()), bytes);
    for (uint64_t page = 0; page < group->num_pages(); ++page) {
      const uint64_t step = group->page_step(page);
      state.append(reinterpret_cast<const char*>(&step), sizeof(step));
    }
  }
  return state;
}

std::string StepInputTarget::Outcomes() const {
  std::string text;
  for (const auto& [outcome, count] : outcomes_) {
    absl::StrAppend(&text, text.empty() ? "" : ", ", outcome, ": ", count);
  }
  return text;
}

std::string StepInputTarget::Run(const uint8_t* data, size_t size) {
  if (size == 0) return "";
  const uint8_t* wire = data + 1;
  const size_t n = size - 1;

  // Read as protobuf reads it, and as the reactor does.
  v1::StepRequest expected;
  const bool protobuf_ok = expected.ParseFromArray(wire, static_cast<int>(n)) &&
                           static_cast<size_t>(expected.more_size()) <= kMaxPackedChunks;
  expected.DiscardUnknownFields();
  grpc::ByteBuffer buffer =
      testing::Sliced(absl::string_view(reinterpret_cast<const char*>(wire), n), Cuts(n, data[0]));
  StepMessage message;
  const absl::Status read = ReadStepRequest(&buffer, kMaxPackedChunks, &message);
  bool nested = false;  // Packed chunks that pack chunks: read as placeholders.
  for (const v1::StepRequest& packed : expected.more()) nested |= !packed.more().empty();
  if (!nested) {
    if (read.ok() != protobuf_ok) {
      return absl::StrCat("ReadStepRequest says ", read.ToString(), ", protobuf ",
                          protobuf_ok ? "accepts" : "refuses", " the bytes");
    }
    if (read.ok()) {
      v1::StepRequest whole = message.request;
      whole.set_gradient(Gather(message.gradients[0]));
      for (int i = 0; i < whole.more_size(); ++i) {
        whole.mutable_more(i)->set_gradient(Gather(message.gradients[i + 1]));
      }
      if (whole.SerializeAsString() != expected.SerializeAsString()) {
        return "ReadStepRequest read other fields or gradients than protobuf";
      }
    }
  }
  if (!read.ok()) {
    ++outcomes_["not read"];
    return "";
  }

  // Chunks that name regions name ours (a real client's key).
  for (int i = 0; i <= message.request.more_size(); ++i) {
    v1::StepRequest* chunk = i == 0 ? &message.request : message.request.mutable_more(i - 1);
    if (chunk->has_gradient_region() || chunk->has_params_region()) {
      chunk->set_region_session(session_);
    }
  }

  // A use of a step plan (in our session) finds its plan as the reactor
  // does; one it cannot find changes nothing.
  const bool uses_plan = UsesStepPlan(message.request);
  const std::string before = Snapshot();
  if (uses_plan) {
    message.request.set_region_session(session_);
    absl::StatusOr<std::shared_ptr<const StepPlan>> plan = FindStepPlan(&regions_, "", message);
    if (!plan.ok()) {
      ++outcomes_[absl::StrCat("plan ", absl::StatusCodeToString(plan.status().code()))];
      return "";
    }
    message.plan = *std::move(plan);
  }

  // Apply as the reactor does.
  std::vector<grpc::Slice> slices;
  const absl::Status applied =
      ApplyStepMessage(&engine_, "", kMaxReplyBytes, message, &slices, &regions_);
  ++outcomes_[absl::StrCat(uses_plan ? "plan " : "",
                           applied.ok() ? "applied" : absl::StatusCodeToString(applied.code()))];
  // A message marked gradients_checked has its chunks' values checked as
  // each is applied: a non-finite one refuses that chunk unapplied, and the
  // refusal says the others may be applied (StepRequest.gradients_checked).
  const bool others_may_be_applied =
      message.request.gradients_checked() &&
      absl::StrContains(applied.message(), "marked gradients_checked");
  if ((applied.code() == absl::StatusCode::kInvalidArgument ||
       applied.code() == absl::StatusCode::kOutOfRange) &&
      !others_may_be_applied) {
    if (Snapshot() != before) {
      return absl::StrCat("a message refused with ", applied.ToString(), " changed state");
    }
    return "";
  }
  if (!applied.ok()) return "";

  v1::StepResponse reply;
  if (!ParseReply(slices, &reply)) return "the reply is not a StepResponse";
  const v1::StepRequest& request = message.request;
  const v1::StepRequest& chunks = ChunksOf(message);  // A plan's use: the plan's.
  if (uses_plan ? reply.more_size() != 0 || reply.plan() != request.plan() ||
                      reply.step() != request.step() || !reply.params_in_region()
                : reply.more_size() != request.more_size()) {
    return absl::StrCat("the reply packs ", reply.more_size(), " replies for ", request.more_size(),
                        " packed chunks", uses_plan ? " (a plan's use: one, naming it)" : "");
  }
  uint64_t plan_elements = 0;
  for (int i = 0; i <= chunks.more_size(); ++i) {
    const v1::StepRequest& chunk = i == 0 ? chunks : chunks.more(i - 1);
    const v1::StepResponse& answer = i == 0 || uses_plan ? reply : reply.more(i - 1);
    const uint64_t step = uses_plan ? request.step() : chunk.step();
    // The gradient as the chunk gave it: from its region slice, or its bytes.
    std::string gradient = uses_plan ? std::string() : Gather(message.gradients[i]);
    if (chunk.has_gradient_region()) {
      auto region = regions_.Find("", session_, chunk.gradient_region().region());
      if (!region.ok()) return absl::StrCat("chunk ", i, " was applied from a missing region");
      absl::StatusOr<char*> at =
          (*region)->Slice(chunk.gradient_region().offset(), chunk.gradient_region().bytes(), "");
      if (!at.ok()) return absl::StrCat("chunk ", i, " was applied from past its region's end");
      gradient.assign(*at, chunk.gradient_region().bytes());
    }
    const uint64_t elements =
        gradient.size() / WireTypeSize(*WireTypeFromProto(chunk.gradient_dtype(), ""));
    const size_t param_bytes = WireTypeSize(*WireTypeFromProto(chunk.param_dtype(), ""));
    const size_t reply_params = chunk.has_params_region() ? 0 : elements * param_bytes;
    plan_elements += elements;
    if (!uses_plan &&
        (answer.group() != chunk.group() || answer.offset() != chunk.offset() ||
         answer.step() != chunk.step() || answer.num_elements() != elements ||
         answer.params().size() != reply_params ||
         answer.params_in_region() != chunk.has_params_region() ||
         (chunk.has_params_region() && chunk.params_region().bytes() != elements * param_bytes))) {
      return absl::StrCat("reply ", i, " does not answer its chunk");
    }
    // Only finite gradients (as widened, times grad_scale) are applied.
    std::vector<float> widened(elements);
    DecodeToFloat(*WireTypeFromProto(chunk.gradient_dtype(), ""), gradient.data(), widened.data(),
                  elements);
    const float scale = uses_plan && request.has_grad_scale() ? request.grad_scale()
                        : chunk.has_grad_scale()              ? chunk.grad_scale()
                                                              : 1.0f;
    for (uint64_t k = 0; k < elements; ++k) {
      if (!std::isfinite(widened[k] * scale)) {
        return absl::StrCat("chunk ", i, " was applied with a gradient not finite at ", k);
      }
    }
    auto group = store_.Find(GroupKey{"", chunk.group()});
    if (!group.ok()) return absl::StrCat("chunk ", i, " was applied to a group that is not there");
    for (uint64_t page = chunk.offset() / kPage; page * kPage < chunk.offset() + elements; ++page) {
      if ((*group)->page_step(page) < step) {
        return absl::StrCat("chunk ", i, " was answered but page ", page, " is at step ",
                            (*group)->page_step(page), ", behind ", step);
      }
    }
  }
  if (uses_plan && reply.num_elements() != plan_elements) {
    return absl::StrCat("the reply to a plan's use counts ", reply.num_elements(), " elements of ",
                        plan_elements);
  }
  return "";
}

}  // namespace optstate::fuzz

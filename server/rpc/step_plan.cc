// Step plans: what a plan's defining message and its uses must carry, and
// where plans are kept (their region session, RegionRegistry::Keep).
#include "server/rpc/step_plan.h"

#include <utility>

#include "absl/strings/str_cat.h"

namespace optstate {
namespace {

// The first field that a plan's use cannot carry, or nullptr.
const char* ChunkFieldOf(const StepMessage& message) {
  const v1::StepRequest& request = message.request;
  if (request.more_size() != 0) return "more";
  if (request.offset() != 0) return "offset";
  if (!message.gradients.empty() && message.gradients[0].size() != 0) return "gradient";
  if (request.gradient_dtype() != v1::DTYPE_UNSPECIFIED) return "gradient_dtype";
  if (request.param_dtype() != v1::DTYPE_UNSPECIFIED) return "param_dtype";
  if (request.group_elements() != 0) return "group_elements";
  if (request.has_gradient_region()) return "gradient_region";
  if (request.has_params_region()) return "params_region";
  if (request.has_lr_float32()) return "lr_float32";
  return nullptr;
}

}  // namespace

absl::Status CheckStepPlanDefinition(const v1::StepRequest& request) {
  for (int i = -1; i < request.more_size(); ++i) {
    const v1::StepRequest& chunk = i < 0 ? request : request.more(i);
    const char* missing = !chunk.has_gradient_region() ? "gradient_region"
                          : !chunk.has_params_region() ? "params_region"
                                                       : nullptr;
    const bool other_session = chunk.region_session() != request.region_session();
    if (missing == nullptr && !other_session) continue;
    const std::string which =
        i < 0 ? std::string("the request's own chunk") : absl::StrCat("StepRequest.more[", i, "]");
    return absl::InvalidArgumentError(absl::StrCat(
        "this message defines step plan ", request.plan(), ", but ", which, " (group '",
        chunk.group(), "') ",
        missing != nullptr ? absl::StrCat("names no ", missing)
                           : std::string("names another region_session than the request's"),
        "; a plan's chunks name a gradient_region and a params_region of one region session "
        "(its uses send no bytes and get no params back): send this step without `plan`, or "
        "name them; nothing was applied"));
  }
  return absl::OkStatus();
}

absl::StatusOr<std::shared_ptr<const StepPlan>> FindStepPlan(RegionRegistry* regions,
                                                             const std::string& tenant,
                                                             const StepMessage& message) {
  const v1::StepRequest& request = message.request;
  if (const char* field = ChunkFieldOf(message); field != nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        "this message uses step plan ", request.plan(), " (it names no group) and sets `", field,
        "`; a plan's use carries only plan, region_session, step, gradients_checked and the "
        "per-step lr, beta1, beta2, eps, weight_decay, maximize and grad_scale: leave `",
        field, "` out, or send the chunks with their groups"));
  }
  if (regions == nullptr) {
    return absl::FailedPreconditionError(
        "this daemon offers no shared-memory regions (started with --region_socket=none), so "
        "it keeps no step plans; send the step's chunks with their gradients");
  }
  absl::StatusOr<std::shared_ptr<const void>> kept =
      regions->Kept(tenant, request.region_session(), request.plan());
  if (!kept.ok()) return kept.status();
  if (*kept == nullptr) {
    return absl::NotFoundError(absl::StrCat(
        "step plan ", request.plan(),
        " is not kept by this region session (never defined, its defining message refused, or "
        "forgotten for newer plans); send the step's chunks with plan ",
        request.plan(), " to define it again; nothing was applied"));
  }
  // Only StepPlans are kept (KeepStepPlan is the registry's one user of Keep).
  return std::static_pointer_cast<const StepPlan>(*std::move(kept));
}

absl::Status KeepStepPlan(RegionRegistry* regions, const std::string& tenant,
                          const v1::StepRequest& request) {
  if (regions == nullptr) {  // Unreached: a plan's chunks name regions, refused without any.
    return absl::FailedPreconditionError("this daemon offers no regions, so it keeps no plans");
  }
  auto plan = std::make_shared<StepPlan>();
  plan->chunks = request;
  plan->chunks.set_gradients_checked(false);  // Each use says its own.
  const uint64_t bytes = sizeof(StepPlan) + plan->chunks.SpaceUsedLong();
  return regions->Keep(tenant, request.region_session(), request.plan(), std::move(plan), bytes);
}

void ForgetStepPlan(RegionRegistry* regions, const std::string& tenant,
                    const v1::StepRequest& request) {
  if (regions != nullptr) regions->Unkeep(tenant, request.region_session(), request.plan());
}

}  // namespace optstate

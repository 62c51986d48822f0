// The first step (or SharedBuffer) that reaches the daemon decides; a
// daemon that does not answer, or whose region connections are all taken,
// leaves the choice open.
#include "client/data_plane_choice.h"

namespace optstate::client_internal {

namespace {

// How long a kAuto client refused for the daemon's cap on region
// connections steps over the wire before it asks again (each ask is a
// GetDataPlane call and a connection the daemon refuses).
constexpr absl::Duration kAskAgainAfterFull = absl::Seconds(10);

}  // namespace

std::optional<absl::Status> DataPlaneChoice::Decide(grpc::Channel* channel,
                                                    const ClientOptions& options) {
  if (decided_) return std::nullopt;
  if (options.data_plane == DataPlane::kAuto && absl::Now() < ask_again_at_) return full_;
  absl::StatusOr<std::unique_ptr<SharedMemoryPlane>> plane =
      SharedMemoryPlane::Open(channel, options);
  if (plane.ok()) {
    plane_ = std::move(*plane);
    decided_ = true;
  } else if (plane.status().code() == absl::StatusCode::kFailedPrecondition) {
    why_not_ = plane.status();
    decided_ = true;
  } else {
    if (plane.status().code() == absl::StatusCode::kResourceExhausted) {
      full_ = plane.status();  // The daemon's cap on connections, said by it.
      ask_again_at_ = absl::Now() + kAskAgainAfterFull;
    }
    return plane.status();  // No plane now: decide next time.
  }
  return std::nullopt;
}

std::optional<absl::Status> DataPlaneChoice::StepOnSharedMemory(
    grpc::Channel* channel, const ClientOptions& options,
    absl::FunctionRef<std::optional<absl::Status>(SharedMemoryPlane&)> step) {
  if (options.data_plane == DataPlane::kWire) return std::nullopt;
  absl::MutexLock lock(&mu_);
  if (std::optional<absl::Status> unanswered = Decide(channel, options)) {
    if (options.data_plane == DataPlane::kSharedMemory) return unanswered;
    return std::nullopt;  // The wire step retries, or reports, the same trouble.
  }
  if (plane_ != nullptr) return step(*plane_);
  if (options.data_plane == DataPlane::kSharedMemory) return why_not_;
  return std::nullopt;
}

absl::StatusOr<std::shared_ptr<SharedMapping>> DataPlaneChoice::AllocateShared(
    grpc::Channel* channel, const ClientOptions& options, uint64_t bytes) {
  if (options.data_plane == DataPlane::kWire) {
    return absl::FailedPreconditionError(
        "this client's data plane is the wire (ClientOptions::data_plane kWire): shared buffers "
        "need kAuto or kSharedMemory");
  }
  absl::MutexLock lock(&mu_);
  if (std::optional<absl::Status> unanswered = Decide(channel, options)) return *unanswered;
  if (plane_ == nullptr) return why_not_;
  return plane_->AllocateShared(channel, options, bytes);
}

void DataPlaneChoice::ForgetGroup(const std::string& group) {
  absl::MutexLock lock(&mu_);
  if (plane_ != nullptr) plane_->ForgetArea(group);
}

}  // namespace optstate::client_internal

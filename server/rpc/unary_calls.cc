// A reactor that counts itself out when gRPC is done with it.
#include "server/rpc/unary_calls.h"


namespace optstate {

class UnaryCalls::CountedReactor : public grpc::ServerUnaryReactor {
 public:
  explicit CountedReactor(UnaryCalls* calls) : calls_(calls) {}
  // After Finish's status is sent, or the call is cancelled and finished.
  void OnDone() override {
    calls_->Done();
    delete this;
  }

 private:
  UnaryCalls* const calls_;
};

bool UnaryCalls::Begin(grpc::CallbackServerContext* context, grpc::ServerUnaryReactor** reactor) {
  {
    absl::MutexLock lock(&mu_);
    if (accepting_) {
      ++under_way_;
      *reactor = new CountedReactor(this);
      return true;
    }
  }
  *reactor = context->DefaultReactor();
  (*reactor)->Finish(grpc::Status(
      grpc::StatusCode::UNAVAILABLE,
      "optstated is shutting down; retry the call against the restarted daemon"));
  return false;
}

void UnaryCalls::StopAccepting() {
  absl::MutexLock lock(&mu_);
  accepting_ = false;
}

bool UnaryCalls::WaitUntilNone(absl::Time deadline) {
  absl::MutexLock lock(&mu_);
  auto none = [this]() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) { return under_way_ == 0; };
  return mu_.AwaitWithDeadline(absl::Condition(&none), deadline);
}

void UnaryCalls::Done() {
  absl::MutexLock lock(&mu_);
  --under_way_;
}

}  // namespace optstate

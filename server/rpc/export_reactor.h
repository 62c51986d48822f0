// The ExportState stream: a group's header, then its pages, each page's
// tensors and step read together under its lock. One reactor per call.
#ifndef OPTSTATE_SERVER_RPC_EXPORT_REACTOR_H_
#define OPTSTATE_SERVER_RPC_EXPORT_REACTOR_H_

#include <cstdint>
#include <memory>

#include "grpcpp/grpcpp.h"
#include "optstate/v1/optstate.pb.h"
#include "server/durability/page_capture.h"
#include "server/engine/step_engine.h"

namespace optstate {

// Flow: (constructor) header -> StartWrite -> OnWriteDone -> (worker:
// capture the next run of pages, about 1 MiB per tensor) -> StartWrite of
// its page_steps, params, exp_avg, exp_avg_sq chunks, one at a time -> ...
// -> Finish. One message is in flight at a time, so the reactor holds one
// run of pages (copies of at most max(3 MiB, one page of params, m and v))
// however large the group. Each chunk holds whole pages of one tensor and
// fits the message limit.
class ExportReactor : public grpc::ServerWriteReactor<v1::ExportStateResponse> {
 public:
  ExportReactor(StepEngine* engine, const GroupKey& key);

  void OnWriteDone(bool ok) override;
  void OnDone() override { delete this; }

 private:
  // Runs on a worker; ends with StartWrite or Finish, touching nothing after.
  void WriteNext();

  StepEngine* const engine_;
  std::shared_ptr<Group> group_;
  uint64_t pages_per_run_ = 1;
  uint64_t next_page_ = 0;  // First page not yet captured.
  int next_tensor_ = 0;     // Of pages_: 0 (capture anew), 1 steps, 2 params, 3 m, 4 v.
  CapturedPages pages_;
  v1::ExportStateResponse response_;
};

}  // namespace optstate

#endif  // OPTSTATE_SERVER_RPC_EXPORT_REACTOR_H_

// Worker threads, a FIFO of tasks, and a caller-participating ParallelFor.
#include "server/base/thread_pool.h"

#include <atomic>
#include <memory>

namespace optstate {

ThreadPool::ThreadPool(int threads) {
  if (threads < 1) threads = 1;
  workers_.reserve(threads);
  for (int i = 0; i < threads; ++i) workers_.emplace_back([this] { WorkerLoop(); });
}

ThreadPool::~ThreadPool() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  for (auto& worker : workers_) worker.join();
}

void ThreadPool::Schedule(std::function<void()> task) {
  absl::MutexLock lock(&mu_);
  tasks_.push_back(std::move(task));
}

void ThreadPool::WorkerLoop() {
  for (;;) {
    std::function<void()> task;
    {
      absl::MutexLock lock(&mu_);
      mu_.Await(absl::Condition(this, &ThreadPool::HasTaskOrStopping));
      if (tasks_.empty()) return;  // Stopping and drained.
      task = std::move(tasks_.front());
      tasks_.pop_front();
    }
    task();
  }
}

namespace {

// Shared between the caller and helpers; helpers may outlive the call.
struct ParallelForState {
  explicit ParallelForState(size_t shards, const std::function<void(size_t)>& fn)
      : shards(shards), fn(fn) {}
  const size_t shards;
  const std::function<void(size_t)>& fn;  // Valid while finished < shards.
  std::atomic<size_t> next{0};
  absl::Mutex mu;
  size_t finished ABSL_GUARDED_BY(mu) = 0;

  bool AllFinished() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu) { return finished == shards; }

  // Runs shards until none are left.
  void Drain() ABSL_LOCKS_EXCLUDED(mu) {
    for (;;) {
      size_t i = next.fetch_add(1);
      if (i >= shards) return;
      fn(i);
      absl::MutexLock lock(&mu);
      ++finished;
    }
  }
};

}  // namespace

void ThreadPool::ParallelFor(size_t shards, const std::function<void(size_t)>& fn) {
  if (shards == 0) return;
  if (shards == 1) {
    fn(0);
    return;
  }
  auto state = std::make_shared<ParallelForState>(shards, fn);
  size_t helpers = std::min(shards - 1, workers_.size());
  for (size_t i = 0; i < helpers; ++i) Schedule([state] { state->Drain(); });
  state->Drain();
  absl::MutexLock lock(&state->mu);
  state->mu.Await(absl::Condition(state.get(), &ParallelForState::AllFinished));
}

}  // namespace optstate

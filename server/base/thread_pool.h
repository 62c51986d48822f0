// A fixed pool of worker threads that runs scheduled tasks and splits a
// range of work over its threads with ParallelFor.
#ifndef OPTSTATE_SERVER_BASE_THREAD_POOL_H_
#define OPTSTATE_SERVER_BASE_THREAD_POOL_H_

#include <cstddef>
#include <deque>
#include <functional>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/synchronization/mutex.h"

namespace optstate {

// Thread-safe: every method may be called from any thread, pool threads too.
class ThreadPool {
 public:
  // Starts `threads` workers (at least one).
  explicit ThreadPool(int threads);
  // Runs every task already scheduled, then joins the workers.
  ~ThreadPool();

  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  // Runs `task` on some worker, later.
  void Schedule(std::function<void()> task) ABSL_LOCKS_EXCLUDED(mu_);

  // Calls fn(i) for every i in [0, shards) and returns when all calls have
  // returned. The caller runs shards too, so calling this from a worker never
  // deadlocks; idle workers take the rest.
  void ParallelFor(size_t shards, const std::function<void(size_t)>& fn) ABSL_LOCKS_EXCLUDED(mu_);

  int size() const { return static_cast<int>(workers_.size()); }

 private:
  void WorkerLoop() ABSL_LOCKS_EXCLUDED(mu_);
  // What a worker waits for: a task, or the pool stopping.
  bool HasTaskOrStopping() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    return stopping_ || !tasks_.empty();
  }

  absl::Mutex mu_;
  std::deque<std::function<void()>> tasks_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  std::vector<std::thread> workers_;  // Set by the constructor only.
};

}  // namespace optstate

#endif  // OPTSTATE_SERVER_BASE_THREAD_POOL_H_

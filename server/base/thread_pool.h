// A fixed pool of worker threads that runs scheduled tasks and splits a
// range of work over its threads with ParallelFor.
#ifndef OPTSTATE_SERVER_BASE_THREAD_POOL_H_
#define OPTSTATE_SERVER_BASE_THREAD_POOL_H_

#include <condition_variable>
#include <cstddef>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

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
  void Schedule(std::function<void()> task);

  // Calls fn(i) for every i in [0, shards) and returns when all calls have
  // returned. The caller runs shards too, so calling this from a worker never
  // deadlocks; idle workers take the rest.
  void ParallelFor(size_t shards, const std::function<void(size_t)>& fn);

  int size() const { return static_cast<int>(workers_.size()); }

 private:
  void WorkerLoop();

  std::mutex mu_;
  std::condition_variable wake_;
  std::deque<std::function<void()>> tasks_;  // Guarded by mu_.
  bool stopping_ = false;                    // Guarded by mu_.
  std::vector<std::thread> workers_;
};

}  // namespace optstate

#endif  // OPTSTATE_SERVER_BASE_THREAD_POOL_H_

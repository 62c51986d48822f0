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
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  wake_.notify_all();
  for (auto& worker : workers_) worker.join();
}

void ThreadPool::Schedule(std::function<void()> task) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    tasks_.push_back(std::move(task));
  }
  wake_.notify_one();
}

void ThreadPool::WorkerLoop() {
  for (;;) {
    std::function<void()> task;
    {
      std::unique_lock<std::mutex> lock(mu_);
      wake_.wait(lock, [this] { return stopping_ || !tasks_.empty(); });
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
  std::mutex mu;
  std::condition_variable all_done;
  size_t finished = 0;  // Guarded by mu.

  // Runs shards until none are left.
  void Drain() {
    for (;;) {
      size_t i = next.fetch_add(1);
      if (i >= shards) return;
      fn(i);
      std::lock_guard<std::mutex> lock(mu);
      if (++finished == shards) all_done.notify_all();
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
  std::unique_lock<std::mutex> lock(state->mu);
  state->all_done.wait(lock, [&] { return state->finished == state->shards; });
}

}  // namespace optstate

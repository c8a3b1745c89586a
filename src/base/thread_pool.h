// ThreadPool: a fixed set of worker threads for data-parallel loops (ParallelFor).
// The calling thread takes part in the work. One ParallelFor runs at a time per pool:
// calls from several threads are serialised by a mutex. Workers spin briefly between
// jobs (decode issues hundreds of short loops per token) and then sleep.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace dinfer {

class ThreadPool {
 public:
  // num_threads counts the caller: 1 means no worker threads.
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return static_cast<int>(workers_.size()) + 1; }

  // Calls fn(thread_index, task) for every task in [0, num_tasks), spread over the threads.
  // Tasks are handed out dynamically; fn must be safe to run concurrently on distinct tasks.
  void ParallelFor(int64_t num_tasks, const std::function<void(int, int64_t)>& fn);

  // Splits [0, n) into one contiguous range per thread: fn(thread_index, begin, end).
  void ParallelRanges(int64_t n, const std::function<void(int, int64_t, int64_t)>& fn);

 private:
  void WorkerLoop(int index);
  void RunTasks(int thread_index);

  std::vector<std::thread> workers_;
  std::mutex submit_mu_;
  std::mutex mu_;
  std::condition_variable cv_;
  std::atomic<uint64_t> generation_{0};
  std::atomic<int> pending_workers_{0};
  std::atomic<int64_t> next_task_{0};
  int64_t num_tasks_ = 0;
  const std::function<void(int, int64_t)>* fn_ = nullptr;
  std::atomic<bool> stop_{false};
};

// Number of hardware threads to use by default (physical parallelism of this process).
int DefaultThreadCount();

}  // namespace dinfer

#include "base/thread_pool.h"

#include <sched.h>

#include <algorithm>
#include <chrono>

namespace dinfer {
namespace {

inline void CpuRelax() {
#if defined(__x86_64__)
  __builtin_ia32_pause();
#endif
}

}  // namespace

ThreadPool::ThreadPool(int num_threads) {
  const int workers = std::max(0, num_threads - 1);
  workers_.reserve(workers);
  for (int i = 0; i < workers; ++i) workers_.emplace_back([this, i] { WorkerLoop(i + 1); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_.store(true);
    generation_.fetch_add(1);
  }
  cv_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::RunTasks(int thread_index) {
  while (true) {
    const int64_t task = next_task_.fetch_add(1, std::memory_order_relaxed);
    if (task >= num_tasks_) break;
    (*fn_)(thread_index, task);
  }
}

void ThreadPool::WorkerLoop(int index) {
  uint64_t seen = 0;
  while (true) {
    // Spin a little before sleeping: the next loop usually comes within microseconds.
    uint64_t gen = generation_.load(std::memory_order_acquire);
    for (int spin = 0; gen == seen && spin < 20000; ++spin) {
      CpuRelax();
      gen = generation_.load(std::memory_order_acquire);
    }
    if (gen == seen) {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return generation_.load(std::memory_order_acquire) != seen; });
      gen = generation_.load(std::memory_order_acquire);
    }
    seen = gen;
    if (stop_.load()) return;
    RunTasks(index);
    pending_workers_.fetch_sub(1, std::memory_order_acq_rel);
  }
}

void ThreadPool::ParallelFor(int64_t num_tasks, const std::function<void(int, int64_t)>& fn) {
  if (num_tasks <= 0) return;
  if (workers_.empty() || num_tasks == 1) {
    for (int64_t t = 0; t < num_tasks; ++t) fn(0, t);
    return;
  }
  std::lock_guard<std::mutex> submit(submit_mu_);
  fn_ = &fn;
  num_tasks_ = num_tasks;
  next_task_.store(0, std::memory_order_relaxed);
  pending_workers_.store(static_cast<int>(workers_.size()), std::memory_order_relaxed);
  {
    std::lock_guard<std::mutex> lock(mu_);
    generation_.fetch_add(1, std::memory_order_acq_rel);
  }
  cv_.notify_all();
  RunTasks(0);
  // Spin while the workers finish their last tasks; yield if one of them was descheduled (an
  // oversubscribed machine), so it can run on this core.
  for (int spin = 0; pending_workers_.load(std::memory_order_acquire) != 0; ++spin) {
    if (spin < 2000) {
      CpuRelax();
    } else {
      std::this_thread::yield();
    }
  }
  fn_ = nullptr;
}

void ThreadPool::ParallelRanges(int64_t n, const std::function<void(int, int64_t, int64_t)>& fn) {
  const int64_t parts = std::min<int64_t>(n, num_threads());
  if (parts <= 0) return;
  ParallelFor(parts, [&](int thread, int64_t part) {
    const int64_t begin = n * part / parts;
    const int64_t end = n * (part + 1) / parts;
    fn(thread, begin, end);
  });
}

int DefaultThreadCount() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) return std::max(1, CPU_COUNT(&set));
  return std::max(1u, std::thread::hardware_concurrency());
}

}  // namespace dinfer

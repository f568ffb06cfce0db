// A fixed set of worker threads for data-parallel loops: attention and the model's matrix products split their work
// into tasks and wait for all of them. The calling thread works too (it is worker 0), so a pool of 1 starts no
// thread and runs everything inline. Between loops the workers stay hot for a while (kSpin in thread_pool.cpp): a
// forward pass runs a few loops per layer, microseconds apart, and a sleep and wake-up through the kernel costs
// about as much as a loop; polling, they offer the core to other threads now and then, and after kSpin without
// work they sleep.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <mutex>
#include <thread>
#include <type_traits>
#include <vector>

namespace kvq {

class ThreadPool {
 public:
  /// A pool of `n_workers` >= 1 workers: the caller plus n_workers - 1 threads started here.
  explicit ThreadPool(int n_workers);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_workers_; }

  /// Runs fn(task) or fn(task, worker) for every task < n_tasks and returns when all have finished. `worker` in
  /// [0, size()) names the worker running the task (for per-worker scratch); tasks are handed out in increasing
  /// order to whichever worker is free. If tasks throw, the tasks not yet started are skipped and the first
  /// exception is rethrown here. One caller thread at a time: a nested or concurrent call throws kvq::Error.
  template <class Fn>
  void parallel_for(size_t n_tasks, Fn&& fn) {
    auto call = [](void* ctx, size_t task, int worker) {
      Fn& f = *static_cast<std::remove_reference_t<Fn>*>(ctx);
      if constexpr (std::is_invocable_v<Fn&, size_t, int>) {
        f(task, worker);
      } else {
        f(task);
      }
    };
    run(n_tasks, const_cast<void*>(static_cast<const void*>(&fn)), call);
  }

 private:
  using Call = void (*)(void* ctx, size_t task, int worker);
  void run(size_t n_tasks, void* ctx, Call call);
  void work(int worker);
  void worker_loop(int worker);
  /// Returns once `ready()` holds: polls for a while, then sleeps on `cv` (whose notifier holds mutex_).
  template <class Ready>
  void wait_for(std::condition_variable& cv, Ready ready);

  int n_workers_;
  std::vector<std::thread> threads_;
  std::mutex mutex_;  // guards the sleeps on wake_ and done_, and error_
  std::condition_variable wake_, done_;
  // The current job: written by the caller before it increments generation_, read by workers after they see it.
  size_t n_tasks_ = 0;
  void* ctx_ = nullptr;
  Call call_ = nullptr;
  std::atomic<size_t> next_task_{0};  // next task to hand out
  std::atomic<int> busy_workers_{0};  // threads still working on the current generation
  std::atomic<uint64_t> generation_{0};
  std::atomic<bool> stop_{false};
  std::atomic<bool> running_{false};  // a parallel_for is in progress
  std::atomic<bool> failed_{false};   // a task of the current job threw: hand out no more
  std::exception_ptr error_;
};

}  // namespace kvq

#include "kvq/thread_pool.hpp"

#include <utility>

#include "kvq/error.hpp"

namespace kvq {

ThreadPool::ThreadPool(int n_workers) : n_workers_(n_workers) {
  KVQ_CHECK(n_workers >= 1 && n_workers <= 1024, "ThreadPool: ", n_workers, " workers requested (need 1..1024)");
  threads_.reserve(static_cast<size_t>(n_workers - 1));
  for (int w = 1; w < n_workers; ++w) threads_.emplace_back([this, w] { worker_loop(w); });
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  for (auto& t : threads_) t.join();
}

void ThreadPool::run(size_t n_tasks, void* ctx, Call call) {
  {
    std::lock_guard lock(mutex_);
    KVQ_CHECK(!running_,
              "ThreadPool::parallel_for called while another one runs on this pool "
              "(nested inside a task, or from a second thread)");
    running_ = true;
    n_tasks_ = n_tasks;
    ctx_ = ctx;
    call_ = call;
    next_task_ = 0;
    error_ = nullptr;
    busy_workers_ = static_cast<int>(threads_.size());
    ++generation_;
  }
  if (!threads_.empty()) wake_.notify_all();
  work(0);
  std::unique_lock lock(mutex_);
  done_.wait(lock, [this] { return busy_workers_ == 0; });
  running_ = false;
  if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
}

void ThreadPool::work(int worker) {
  while (true) {
    size_t task;
    {
      std::lock_guard lock(mutex_);
      if (next_task_ >= n_tasks_ || error_) return;
      task = next_task_++;
    }
    try {
      call_(ctx_, task, worker);
    } catch (...) {
      std::lock_guard lock(mutex_);
      if (!error_) error_ = std::current_exception();
    }
  }
}

void ThreadPool::worker_loop(int worker) {
  uint64_t seen = 0;
  while (true) {
    {
      std::unique_lock lock(mutex_);
      wake_.wait(lock, [&] { return stop_ || generation_ != seen; });
      if (stop_) return;
      seen = generation_;
    }
    work(worker);
    {
      std::lock_guard lock(mutex_);
      if (--busy_workers_ == 0) done_.notify_one();
    }
  }
}

}  // namespace kvq

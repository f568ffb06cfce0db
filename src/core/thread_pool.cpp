#include "kvq/attention.hpp"

#include <pthread.h>
#include <time.h>

#include <chrono>
#include <thread>
#include <utility>

#include "kvq/error.hpp"

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace kvq {
namespace {

// How long an idle worker (and a caller waiting for the others) polls, with pause alone, before it sleeps. Polling
// never offers the core to another thread (sched_yield): beside two busy processes a yield hands the core to one of
// them for its whole slice while the thread waited for is runnable, and a short spin then a sleep (which frees the
// core until a notify) beat it under every load measured (docs/perf/cpu.md, "The thread pool's wait"): SmolLM2 int4
// at 2 threads, depth 0, on a 2-core AMD EPYC VM: idle 138-149 tokens/s against 136-138 yielding, beside two
// nice-19 busy loops 141-147 against 40-42, beside two nice-0 loops 39-42 against 5-14.
constexpr std::chrono::microseconds kSpin{50};

// Tells the core that this is a polling loop (frees the sibling hyperthread, saves power).
inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#elif defined(__aarch64__)
  asm volatile("yield");
#endif
}

}  // namespace

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

double ThreadPool::worker_cpu_seconds() {
  double seconds = 0;
  for (auto& t : threads_) {
    clockid_t clock{};
    timespec ts{};
    KVQ_CHECK(pthread_getcpuclockid(t.native_handle(), &clock) == 0 && clock_gettime(clock, &ts) == 0,
              "ThreadPool: cannot read a worker thread's CPU clock");
    seconds += static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
  }
  return seconds;
}

template <class Ready>
void ThreadPool::wait_for(std::condition_variable& cv, Ready ready) {
  const auto deadline = std::chrono::steady_clock::now() + kSpin;
  for (int i = 1; !ready(); ++i) {
    cpu_relax();
    if (i % 64 == 0 && std::chrono::steady_clock::now() > deadline) {  // the clock read every 64 polls
      std::unique_lock lock(mutex_);
      cv.wait(lock, ready);
      return;
    }
  }
}

void ThreadPool::run(size_t n_tasks, void* ctx, Call call) {
  KVQ_CHECK(!running_.exchange(true, std::memory_order_acquire),
            "ThreadPool::parallel_for called while another one runs on this pool "
            "(nested inside a task, or from a second thread)");
  n_tasks_ = n_tasks;
  ctx_ = ctx;
  call_ = call;
  next_task_.store(0, std::memory_order_relaxed);
  failed_.store(false, std::memory_order_relaxed);
  error_ = nullptr;
  busy_workers_.store(static_cast<int>(threads_.size()), std::memory_order_relaxed);
  if (!threads_.empty()) {
    {
      std::lock_guard lock(mutex_);  // a worker going to sleep checks the generation under the lock
      generation_.fetch_add(1, std::memory_order_release);
    }
    wake_.notify_all();
  }
  work(0);
  wait_for(done_, [this] { return busy_workers_.load(std::memory_order_acquire) == 0; });
  std::exception_ptr error = std::exchange(error_, nullptr);
  running_.store(false, std::memory_order_release);
  if (error) std::rethrow_exception(error);
}

void ThreadPool::work(int worker) {
  while (!failed_.load(std::memory_order_relaxed)) {
    const size_t task = next_task_.fetch_add(1, std::memory_order_relaxed);
    if (task >= n_tasks_) return;
    try {
      call_(ctx_, task, worker);
    } catch (...) {
      std::lock_guard lock(mutex_);
      if (!error_) error_ = std::current_exception();
      failed_.store(true, std::memory_order_relaxed);
    }
  }
}

void ThreadPool::worker_loop(int worker) {
  uint64_t seen = 0;
  while (true) {
    wait_for(wake_, [&] {
      return stop_.load(std::memory_order_acquire) || generation_.load(std::memory_order_acquire) != seen;
    });
    if (stop_.load(std::memory_order_acquire)) return;
    seen = generation_.load(std::memory_order_acquire);
    work(worker);
    if (busy_workers_.fetch_sub(1, std::memory_order_acq_rel) == 1) {
      std::lock_guard lock(mutex_);  // the caller may be between its check and its sleep
      done_.notify_one();
    }
  }
}

}  // namespace kvq

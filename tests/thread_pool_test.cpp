#include "kvq/attention.hpp"

#include <gtest/gtest.h>
#include <time.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>
#include <vector>

#include "kvq/error.hpp"

namespace kvq {
namespace {

TEST(ThreadPool, RunsEveryTaskExactlyOnceWithValidWorkerIds) {
  for (int workers : {1, 2, 3}) {
    ThreadPool pool(workers);
    EXPECT_EQ(pool.size(), workers);
    for (size_t n : {size_t{0}, size_t{1}, size_t{7}, size_t{1000}}) {
      std::vector<std::atomic<int>> runs(n);
      std::atomic<bool> bad_worker{false};
      pool.parallel_for(n, [&](size_t task, int worker) {
        runs[task].fetch_add(1);
        if (worker < 0 || worker >= workers) bad_worker = true;
      });
      for (size_t i = 0; i < n; ++i) ASSERT_EQ(runs[i].load(), 1) << workers << " workers, task " << i << " of " << n;
      EXPECT_FALSE(bad_worker);
    }
  }
}

TEST(ThreadPool, PoolOfOneRunsInlineOnTheCaller) {
  ThreadPool pool(1);
  const auto caller = std::this_thread::get_id();
  bool all_inline = true;
  pool.parallel_for(10, [&](size_t) { all_inline = all_inline && std::this_thread::get_id() == caller; });
  EXPECT_TRUE(all_inline);
}

TEST(ThreadPool, TwoWorkersRunConcurrently) {
  // Each task waits for the other to start: this finishes only if two threads run tasks at the same time.
  ThreadPool pool(2);
  std::atomic<int> started{0};
  std::atomic<bool> timed_out{false};
  pool.parallel_for(2, [&](size_t) {
    started.fetch_add(1);
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (started.load() < 2)
      if (std::chrono::steady_clock::now() > deadline) {
        timed_out = true;
        return;
      }
  });
  EXPECT_FALSE(timed_out);
}

// A worker's CPU time counts up to the moment it is read (the process clock would add it only at a scheduler tick):
// right after a loop in which the worker burned 30 ms of its own thread time, worker_cpu_seconds has grown by that.
TEST(ThreadPool, WorkerCpuSecondsCountTheWorkersTimeAtOnce) {
  ThreadPool pool(2);
  const double before = pool.worker_cpu_seconds();
  std::atomic<int> started{0};
  pool.parallel_for(2, [&](size_t, int worker) {
    started.fetch_add(1);
    while (started.load() < 2) {
    }
    if (worker == 0) return;
    timespec t0{}, t{};
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t0);
    do clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    while ((t.tv_sec - t0.tv_sec) * 1e9 + (t.tv_nsec - t0.tv_nsec) < 30e6);
  });
  EXPECT_GE(pool.worker_cpu_seconds() - before, 0.030);
  EXPECT_EQ(ThreadPool(1).worker_cpu_seconds(), 0.0);
}

TEST(ThreadPool, WorkersThatWentToSleepWakeForTheNextLoop) {
  // Loops back to back (workers still polling) and after pauses far past their polling time (workers asleep on the
  // condition variable): every task runs once either way, and both threads take part.
  ThreadPool pool(2);
  for (int round = 0; round < 6; ++round) {
    if (round % 2) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    std::atomic<int> started{0}, count{0};
    std::atomic<bool> timed_out{false};
    pool.parallel_for(2, [&](size_t) {  // each of the two tasks waits for the other: two threads at once
      started.fetch_add(1);
      const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
      while (started.load() < 2)
        if (std::chrono::steady_clock::now() > deadline) {
          timed_out = true;
          return;
        }
      count.fetch_add(1);
    });
    EXPECT_FALSE(timed_out) << "round " << round;
    EXPECT_EQ(count.load(), 2) << "round " << round;
  }
}

TEST(ThreadPool, PropagatesExceptionsAndStaysUsable) {
  for (int workers : {1, 2}) {
    ThreadPool pool(workers);
    std::atomic<int> ran{0};
    EXPECT_THROW(pool.parallel_for(100,
                                   [&](size_t task) {
                                     ran.fetch_add(1);
                                     if (task == 3) throw std::runtime_error("task 3 failed");
                                   }),
                 std::runtime_error);
    if (workers == 1) {
      EXPECT_EQ(ran.load(), 4) << "tasks after a failure are skipped";
    }
    std::atomic<int> count{0};
    pool.parallel_for(50, [&](size_t) { count.fetch_add(1); });
    EXPECT_EQ(count.load(), 50);
  }
}

TEST(ThreadPool, NestedCallsAndBadSizesAreErrors) {
  ThreadPool pool(2);
  EXPECT_THROW(pool.parallel_for(4, [&](size_t) { pool.parallel_for(1, [](size_t) {}); }), Error);
  EXPECT_THROW(ThreadPool(0), Error);
  EXPECT_THROW(ThreadPool(-3), Error);
}

}  // namespace
}  // namespace kvq

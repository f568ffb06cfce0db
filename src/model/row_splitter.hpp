// Splits a range of rows over a few persistent threads (the caller included): the matrix-vector products of
// one decode step are too short to pay for starting threads each time.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace kvq {

class RowSplitter {
 public:
  /// threads: total threads including the caller (>= 1).
  explicit RowSplitter(int threads);
  ~RowSplitter();
  RowSplitter(const RowSplitter&) = delete;
  RowSplitter& operator=(const RowSplitter&) = delete;

  int threads() const { return static_cast<int>(workers_.size()) + 1; }
  /// Calls fn(begin, end) on contiguous parts of [0, n), one per thread, and returns when all are done.
  /// fn must not throw.
  void run(int64_t n, const std::function<void(int64_t, int64_t)>& fn);

 private:
  void worker(int index);
  void part(int index, int64_t& begin, int64_t& end) const;

  std::vector<std::thread> workers_;
  std::mutex mutex_;
  std::condition_variable start_, finished_;
  const std::function<void(int64_t, int64_t)>* job_ = nullptr;
  int64_t n_ = 0;
  uint64_t generation_ = 0;
  int pending_ = 0;
  bool stop_ = false;
};

}  // namespace kvq

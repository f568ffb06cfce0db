#include "model/row_splitter.hpp"

#include "kvq/error.hpp"

namespace kvq {

RowSplitter::RowSplitter(int threads) {
  KVQ_CHECK(threads >= 1, "thread count ", threads, " must be at least 1");
  for (int i = 1; i < threads; ++i) workers_.emplace_back([this, i] { worker(i); });
}

RowSplitter::~RowSplitter() {
  {
    std::lock_guard lock(mutex_);
    stop_ = true;
  }
  start_.notify_all();
  for (auto& t : workers_) t.join();
}

void RowSplitter::part(int index, int64_t& begin, int64_t& end) const {
  const int64_t t = threads();
  begin = n_ * index / t;
  end = n_ * (index + 1) / t;
}

void RowSplitter::run(int64_t n, const std::function<void(int64_t, int64_t)>& fn) {
  if (workers_.empty() || n < 2) {
    fn(0, n);
    return;
  }
  {
    std::lock_guard lock(mutex_);
    job_ = &fn;
    n_ = n;
    pending_ = static_cast<int>(workers_.size());
    ++generation_;
  }
  start_.notify_all();
  int64_t begin, end;
  part(0, begin, end);
  fn(begin, end);
  std::unique_lock lock(mutex_);
  finished_.wait(lock, [this] { return pending_ == 0; });
  job_ = nullptr;
}

void RowSplitter::worker(int index) {
  uint64_t seen = 0;
  for (;;) {
    std::unique_lock lock(mutex_);
    start_.wait(lock, [&] { return stop_ || generation_ != seen; });
    if (stop_) return;
    seen = generation_;
    const auto* job = job_;
    int64_t begin, end;
    part(index, begin, end);
    lock.unlock();
    (*job)(begin, end);
    lock.lock();
    if (--pending_ == 0) finished_.notify_one();
  }
}

}  // namespace kvq

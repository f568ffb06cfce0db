// Where a sliding window (AttentionOptions::window) starts in one sequence of a device decode batch. As on the CPU
// (src/attention/attention_engine.cpp), the decode query is the sequence's newest token and sees its last `window`
// tokens, all of them when the window is 0 or at least the sequence's length. The pages wholly before the window
// leave the split kernel's block table, the page it starts inside goes to the split kernel's window-start variant,
// and the fp32 window's tokens and sink tokens before it are skipped by the merge. Plain C++, checked on the host by
// tests/window_start_test.cpp.
#pragma once

#include <algorithm>
#include <cstddef>

namespace kvq::cuda::detail {

struct WindowStart {
  size_t page = 0;      // the first page the window sees (n_pages when it sees none)
  int in_page = 0;      // that page's tokens before the window (0: the window starts on a page boundary)
  int in_residual = 0;  // the fp32 window's tokens before the window
  int in_sinks = 0;     // the sink tokens before the window

  /// The first page the split kernel reads whole.
  size_t first_whole_page() const { return page + (in_page > 0 ? 1 : 0); }
};

/// A sequence of `sinks` sink tokens, n_pages full pages of T tokens, then `residual` tokens in its fp32 window.
/// Positions count from the sinks, so a window longer than pages and fp32 window reaches into the sinks.
inline WindowStart window_start(size_t n_pages, int T, int residual, size_t window, int sinks = 0) {
  const size_t t = static_cast<size_t>(T), encoded = n_pages * t, length = encoded + static_cast<size_t>(residual);
  const size_t s = static_cast<size_t>(sinks), total = s + length;
  const size_t position = window > 0 && total > window ? total - window : 0;  // the window's first token
  WindowStart w;
  w.in_sinks = static_cast<int>(std::min(position, s));
  const size_t first = position > s ? position - s : 0;  // in the stream of pages and fp32 window
  if (first >= encoded) {
    w.page = n_pages;
    w.in_residual = static_cast<int>(first - encoded);
  } else {
    w.page = first / t;
    w.in_page = static_cast<int>(first % t);
  }
  return w;
}

}  // namespace kvq::cuda::detail

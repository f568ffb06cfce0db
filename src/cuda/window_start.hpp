// Where a sliding window (AttentionOptions::window) starts in one sequence of a device decode batch. As on the CPU
// (src/attention/attention_engine.cpp), the decode query is the sequence's newest token and sees its last `window`
// tokens, all of them when the window is 0 or at least the sequence's length. The pages wholly before the window
// leave the split kernel's block table, the page it starts inside goes to the split kernel's window-start variant,
// and the fp32 window's tokens before it are skipped by the merge. Plain C++, checked on the host by
// tests/window_start_test.cpp.
#pragma once

#include <cstddef>

namespace kvq::cuda::detail {

struct WindowStart {
  size_t page = 0;      // the first page the window sees (n_pages when it sees none)
  int in_page = 0;      // that page's tokens before the window (0: the window starts on a page boundary)
  int in_residual = 0;  // the fp32 window's tokens before the window

  /// The first page the split kernel reads whole.
  size_t first_whole_page() const { return page + (in_page > 0 ? 1 : 0); }
};

/// A sequence of n_pages full pages of T tokens, then `residual` tokens in its fp32 window.
inline WindowStart window_start(size_t n_pages, int T, int residual, size_t window) {
  const size_t t = static_cast<size_t>(T), encoded = n_pages * t, length = encoded + static_cast<size_t>(residual);
  const size_t first = window > 0 && length > window ? length - window : 0;
  WindowStart w;
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

// Where the device decode's sliding window starts (src/cuda/window_start.hpp), on the host: the pages the split
// kernel reads whole, the tokens of the page the window starts in that the window-start kernel hides, and the fp32
// window tokens the merge skips must leave exactly the tokens the CPU's decode attention sees, the last `window` of
// the sequence (all of them for window 0 or a window at least the sequence's length).
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "cuda/window_start.hpp"

namespace kvq::cuda::detail {
namespace {

// Token by token, whether the device reads it: pages [0, n_pages) of T tokens, then the fp32 window.
std::vector<bool> device_sees(size_t n_pages, int T, int residual, const WindowStart& w) {
  const size_t t = static_cast<size_t>(T);
  std::vector<bool> seen(n_pages * t + static_cast<size_t>(residual), false);
  for (size_t p = w.first_whole_page(); p < n_pages; ++p)
    for (size_t i = 0; i < t; ++i) seen[p * t + i] = true;
  if (w.in_page > 0)
    for (size_t i = static_cast<size_t>(w.in_page); i < t; ++i) seen[w.page * t + i] = true;
  for (int i = w.in_residual; i < residual; ++i) seen[n_pages * t + static_cast<size_t>(i)] = true;
  return seen;
}

TEST(WindowStart, LeavesTheTokensTheCpuSees) {
  for (const int T : {64, 128})
    for (const int R : {0, 64, 128}) {
      for (const size_t n_pages : {0, 1, 2, 7, 80})
        for (const int residual : {0, 1, 5, 63, 64, 100, 127, 128, 191, 255}) {
          // the fp32 window holds up to R + T - 1 tokens, and at least R once a page exists
          if (residual > R + T - 1 || (n_pages > 0 && residual < R)) continue;
          for (const size_t window : {0, 1, 40, 63, 64, 65, 100, 511, 512, 513, 5000, 100000}) {
            SCOPED_TRACE("T " + std::to_string(T) + ", " + std::to_string(n_pages) + " pages, " +
                         std::to_string(residual) + " fp32 tokens, window " + std::to_string(window));
            const WindowStart w = window_start(n_pages, T, residual, window);
            const std::vector<bool> seen = device_sees(n_pages, T, residual, w);
            const size_t length = seen.size(), first = window > 0 && length > window ? length - window : 0;
            for (size_t i = 0; i < length; ++i) ASSERT_EQ(seen[i], i >= first) << "token " << i;
            ASSERT_LE(w.page, n_pages);
            ASSERT_TRUE(w.in_page >= 0 && w.in_page < T);
            ASSERT_TRUE(w.in_page == 0 || w.page < n_pages);
            ASSERT_TRUE(w.in_residual >= 0 && w.in_residual <= residual);
          }
        }
    }
}

// With sink tokens before the pages (CacheConfig::sink_tokens), positions count from the first sink: a window longer
// than pages and fp32 window hides the sinks before it, as the CPU's mask hides them.
TEST(WindowStart, SinksBeforeTheWindowAreHidden) {
  for (const int S : {1, 4, 70})
    for (const size_t n_pages : {0, 1, 3})
      for (const int residual : {0, 1, 63, 100}) {
        if (n_pages > 0 && residual < 64) continue;  // R = 64, T = 64
        for (const size_t window : {0, 1, 2, 63, 64, 65, 100, 200, 260, 5000}) {
          SCOPED_TRACE(std::to_string(S) + " sinks, " + std::to_string(n_pages) + " pages, " +
                       std::to_string(residual) + " fp32 tokens, window " + std::to_string(window));
          const WindowStart w = window_start(n_pages, 64, residual, window, S);
          std::vector<bool> seen(static_cast<size_t>(S), false);
          for (int i = w.in_sinks; i < S; ++i) seen[static_cast<size_t>(i)] = true;
          const std::vector<bool> stream = device_sees(n_pages, 64, residual, w);
          seen.insert(seen.end(), stream.begin(), stream.end());
          const size_t length = seen.size(), first = window > 0 && length > window ? length - window : 0;
          for (size_t i = 0; i < length; ++i) ASSERT_EQ(seen[i], i >= first) << "token " << i;
          ASSERT_TRUE(w.in_sinks >= 0 && w.in_sinks <= S);
        }
      }
}

TEST(WindowStart, NoWindowReadsEverything) {
  const WindowStart w = window_start(9, 64, 70, 0);
  EXPECT_EQ(w.page, 0u);
  EXPECT_EQ(w.in_page, 0);
  EXPECT_EQ(w.in_residual, 0);
  EXPECT_EQ(w.first_whole_page(), 0u);
}

}  // namespace
}  // namespace kvq::cuda::detail

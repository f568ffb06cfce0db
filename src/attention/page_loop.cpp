#include "attention/page_loop.hpp"

#include <algorithm>
#include <limits>

#include "attention/online_softmax.hpp"

namespace kvq::detail {

void attend_pages(const PageRun& run) {
  const int T = run.key_codec->block_tokens();
  const size_t stride = static_cast<size_t>(T);
  constexpr float kMasked = -std::numeric_limits<float>::infinity();
  for (size_t j = 0; j < run.pages.size(); ++j) {
    const PageId page = run.pages[j];
    const size_t base = run.first_token + j * stride;
    run.scorer->scores(run.cache->key_block(page, run.kv_head), T, run.scores);
    // Causal mask: query i sees the first visible[i] - base tokens of this page.
    for (int i = 0; i < run.n_q; ++i) {
      const size_t seen = run.visible[i] > base ? std::min(run.visible[i] - base, stride) : 0;
      std::fill(run.scores + i * stride + seen, run.scores + (i + 1) * stride, kMasked);
    }
    online_softmax_block(run.scores, stride, run.n_q, T, run.states);
    run.value_codec->accumulate(run.scores, run.n_q, run.cache->value_block(page, run.kv_head), T,
                                run.states[0].o.data());
  }
}

}  // namespace kvq::detail

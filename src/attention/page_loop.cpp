#include "attention/page_loop.hpp"

#include <algorithm>
#include <limits>

#include "attention/online_softmax.hpp"
#include "kvq/error.hpp"

namespace kvq::detail {
namespace {

void attend_generic(const PageRun& run) {
  const int T = run.key_codec->block_tokens();
  const size_t stride = static_cast<size_t>(T);
  constexpr float kMasked = -std::numeric_limits<float>::infinity();
  for (size_t j = 0; j < run.pages.size(); ++j) {
    const PageId page = run.pages[j];
    const size_t base = run.first_token + j * stride;
    run.scorer->scores(run.cache->key_block(page, run.kv_head), T, run.scores);
    // Causal mask: query i sees the first visible[i] - base tokens of this page; a window hides those before
    // first[i].
    for (int i = 0; i < run.n_q; ++i) {
      const size_t seen = run.visible[i] > base ? std::min(run.visible[i] - base, stride) : 0;
      std::fill(run.scores + i * stride + seen, run.scores + (i + 1) * stride, kMasked);
      if (run.first && run.first[i] > base)
        std::fill(run.scores + i * stride, run.scores + i * stride + std::min(run.first[i] - base, seen), kMasked);
    }
    online_softmax_block(run.scores, stride, run.n_q, T, run.states);
    run.value_codec->accumulate(run.scores, run.n_q, run.cache->value_block(page, run.kv_head), T,
                                run.states[0].o.data());
  }
}

void attend_fused(const PageRun& run) {
  const PageKernel& k = *run.kernel;
  const KVCache& cache = *run.cache;
  const size_t n_q = static_cast<size_t>(run.n_q);
  // Pages are consecutive in one pool (cache.hpp): page id starts page_bytes * id after page 0.
  const uint8_t* pool = cache.page(0);
  KVQ_CHECK(cache.page(run.pages.back()) == pool + cache.page_bytes() * run.pages.back(),
            "attention: the cache's pages are not laid out as one pool");
  KernelArgs a;
  a.pool = pool;
  a.page_bytes = cache.page_bytes();
  a.key_offset = cache.key_block_offset(run.kv_head);
  a.value_offset = cache.value_block_offset(run.kv_head);
  a.pages = run.pages.data();
  a.n_pages = run.pages.size();
  a.first_token = run.first_token;
  a.d = cache.config().head_dim;
  a.T = cache.config().block_tokens;
  a.n_q = run.n_q;
  a.key_group = k.key_group;
  a.value_group = k.value_group;
  a.key_scales_offset = k.key_scales_offset;
  a.value_scales_offset = k.value_scales_offset;
  a.key_mins_offset = k.key_mins_offset;
  a.value_mins_offset = k.value_mins_offset;
  a.key_levels = k.key_levels;
  a.value_levels = k.value_levels;
  a.key_level_bytes = k.key_level_bytes.data();
  a.key_level_unit = k.key_level_unit;
  a.key_space = run.key_codec->space_dim();
  a.value_space = run.value_codec->space_dim();
  a.key_signs_offset = k.key_signs_offset;
  a.value_signs_offset = k.value_signs_offset;
  a.key_residual_norms_offset = k.key_residual_norms_offset;
  a.value_residual_norms_offset = k.value_residual_norms_offset;
  a.key_sketch_scale = k.key_sketch_scale;
  a.value_sketch_scale = k.value_sketch_scale;
  a.q = run.q;
  a.visible = run.visible;
  a.m = run.scores;  // n_q x T floats of scratch hold the n_q maxima and sums
  a.l = run.scores + n_q;
  a.o = run.states[0].o.data();
  a.scratch = run.kernel_scratch;
  for (size_t i = 0; i < n_q; ++i) {
    KVQ_CHECK(run.states[i].empty(), "attention: a fused page run starts from empty states");
    a.m[i] = run.states[i].m;
    a.l[i] = run.states[i].l;
  }
  k.fn(a);
  const size_t d = static_cast<size_t>(a.d);  // value_lambda: int values, whose space is d wide
  for (size_t i = 0; i < n_q; ++i) {
    run.states[i].m = a.m[i];
    run.states[i].l = a.l[i];
    if (k.value_lambda)
      for (size_t c = 0; c < d; ++c) a.o[i * d + c] *= k.value_lambda[c];
  }
}

}  // namespace

void attend_pages(const PageRun& run) {
  if (run.pages.empty()) return;
  if (!run.kernel || !run.kernel->fn) {
    attend_generic(run);
    return;
  }
  // Pages a window cuts into come first in token order; the fused kernel starts from empty states, so it runs on
  // the others first and the generic loop folds the cut pages in after.
  const size_t T = static_cast<size_t>(run.key_codec->block_tokens());
  size_t cut = 0;
  if (run.first)
    while (cut < run.pages.size() && run.first_token + cut * T < run.cut_below) ++cut;
  if (cut < run.pages.size()) {
    PageRun rest = run;
    rest.pages = run.pages.subspan(cut);
    rest.first_token = run.first_token + cut * T;
    attend_fused(rest);
  }
  if (cut > 0) {
    PageRun cut_pages = run;
    cut_pages.pages = run.pages.first(cut);
    attend_generic(cut_pages);
  }
}

}  // namespace kvq::detail

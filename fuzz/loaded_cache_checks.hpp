// What must hold of any cache KVCache::load accepts: the pool's pages are either free or in exactly one block
// table, every window fits its slots, and decode attention runs over every layer of every sequence (reading every
// page through the codecs' scorers and accumulators, and every window).
#pragma once

#include <cstddef>
#include <vector>

#include "fuzz_check.hpp"
#include "kvq/attention.hpp"
#include "kvq/cache.hpp"

namespace kvq::fuzz {

inline void check_loaded(const KVCache& cache) {
  const CacheConfig& c = cache.config();
  const std::vector<SeqId> seqs = cache.sequences();
  std::vector<bool> taken(cache.capacity_pages(), false);
  size_t pages = 0;
  for (SeqId s : seqs)
    for (int l = 0; l < c.n_layers; ++l) {
      const LayerView v = cache.view(s, l);
      KVQ_FUZZ_CHECK(v.block_tokens == c.block_tokens, "a view has the cache's block size");
      KVQ_FUZZ_CHECK(v.residual_count >= 0 && v.residual_count < c.residual_tokens + c.block_tokens,
                     "a window holds at most R + T - 1 tokens");
      for (PageId p : v.pages) {
        KVQ_FUZZ_CHECK(p < taken.size() && !taken[p], "a page is in the pool and in one block table only");
        taken[p] = true;
      }
      pages += v.pages.size();
    }
  KVQ_FUZZ_CHECK(pages + cache.free_pages() == cache.capacity_pages(), "every page is either used or free");
  KVQ_FUZZ_CHECK(cache.memory().pages_in_use == pages, "memory() counts the pages in use");

  const size_t d = static_cast<size_t>(c.head_dim), rows = seqs.size() * static_cast<size_t>(c.n_kv_heads);
  std::vector<float> q(rows * d), out(rows * d);
  for (size_t i = 0; i < q.size(); ++i) q[i] = static_cast<float>(i % 7) - 3.0f;
  for (int l = 0; l < c.n_layers; ++l) decode_attention(cache, l, seqs, q, out);
}

}  // namespace kvq::fuzz

// The inner loop of attention over encoded pages, shared by decode and prefill.
#pragma once

#include <cstddef>
#include <span>

#include "kvq/attention.hpp"
#include "kvq/cache.hpp"
#include "kvq/codec.hpp"

namespace kvq::detail {

/// A run of consecutive pages of one (sequence, kv head) for the n_q queries of its GQA group (all positions of a
/// prefill chunk included): one split-K piece.
struct PageRun {
  const KVCache* cache = nullptr;
  const Codec* key_codec = nullptr;
  const Codec* value_codec = nullptr;
  Scorer* scorer = nullptr;       ///< prepared by key_codec for the n_q queries, the softmax scale folded in
  std::span<const PageId> pages;  ///< the pages, in token order
  size_t first_token = 0;         ///< position of the first token of pages[0]
  int kv_head = 0;
  int n_q = 0;
  const size_t* visible = nullptr;  ///< n_q causal limits: query i sees tokens t < visible[i]
  float* scores = nullptr;          ///< scratch, n_q x T floats
  AttnState* states = nullptr;      ///< n_q states whose o are the consecutive rows of one n_q x space_dim array
};

/// For every page: scores -> mask -> online softmax -> value_codec.accumulate with the weights. This is the one
/// place where a kernel fused for a (key codec, value codec) pair is to be dispatched instead of the generic loop.
void attend_pages(const PageRun& run);

}  // namespace kvq::detail

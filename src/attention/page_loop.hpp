// The inner loop of attention over encoded pages, shared by decode and prefill.
#pragma once

#include <cstddef>
#include <span>

#include "attention/page_kernel.hpp"
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
  const PageKernel* kernel = nullptr;  ///< select_page_kernel's choice for the codecs
  Scorer* scorer = nullptr;  ///< generic kernel: prepared by key_codec for the n_q queries, the softmax scale folded in
  const float* q = nullptr;  ///< fused kernel: the n_q queries from prepare_kernel_queries, the scale folded in
  uint8_t* kernel_scratch = nullptr;  ///< fused kernel: kernel_scratch_bytes(n_q, d) bytes, 64-byte aligned
  std::span<const PageId> pages;  ///< the pages, in token order
  size_t first_token = 0;         ///< position of the first token of pages[0]
  int kv_head = 0;
  int n_q = 0;
  const size_t* visible = nullptr;  ///< n_q causal limits: query i sees tokens t < visible[i]
  /// Sliding windows: n_q lower limits, query i sees tokens t >= first[i]; null: no window.
  const size_t* first = nullptr;
  /// The largest first[i]: pages starting below it are cut by some query's window, and only the generic loop
  /// applies that mask (fused kernels apply the causal one).
  size_t cut_below = 0;
  float* scores = nullptr;          ///< scratch, n_q x T floats
  /// n_q empty states whose o are the consecutive rows of one n_q x space_dim array: the run's partial attention.
  AttnState* states = nullptr;
};

/// For every page: scores -> mask -> online softmax -> accumulate the values with the weights, by the run's kernel:
/// fused (the packed blocks read directly) or generic (the key codec's Scorer and the value codec's accumulate).
/// Pages cut by a sliding window always run generic, after the fused ones: the scorer must be prepared for them.
void attend_pages(const PageRun& run);

}  // namespace kvq::detail

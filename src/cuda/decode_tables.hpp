// What the decode kernels read of a batch's sequences, in device memory: each sequence's block table (the split
// kernel's and its window-start variant's), fp32 window and sink tokens (the merge kernel's). A DecodePlan writes
// them once; a DecodeStep rewrites them before every step, so that launches of a fixed shape (a CUDA graph) follow
// the lengths.
#pragma once

#include <cstdint>

namespace kvq::cuda::detail {

/// One sequence of a batch: its device block table.
struct SeqPages {
  const uint32_t* pages;
  int n_pages;
  int window_first;  // the window-start variant: the tokens of its page before a sliding window (0 elsewhere)
};

/// One sequence's fp32 window and f16 sink tokens, as the merge kernel folds them in.
struct WindowDesc {
  const float* window;  // keys [H][slots][D], then values [H][slots][D]
  int count;
  int first;  // tokens before it lie outside a sliding window (0: none)
  const uint16_t* sinks;     // keys [H][sink_slots][D], then values (CacheConfig::sink_tokens); null: none
  int sink_slots, sink_count;
  int sink_first;            // the sinks before it lie outside a sliding window
  const float* key_offset;   // [H][D], subtracted from the sinks' keys where pages and window hold centered keys
};

/// A batch's tables, one entry per sequence each (device arrays). window_start: the pages sliding windows start
/// inside (n_pages 0 where a window starts on a page boundary or there is none), or null.
struct DecodeTables {
  const SeqPages* seqs = nullptr;
  const WindowDesc* windows = nullptr;
  const SeqPages* window_start = nullptr;
};

}  // namespace kvq::cuda::detail

// The bookkeeping of one batched device append (KVCache::append_device_batch), plain C++ so that the CPU
// tests check it: for every sequence of the batch, which tokens of its stream (the window's `used` tokens, then its
// fresh ones) become which of the batch's new pages, where the tokens that stay unencoded go, and whether the
// append sets the sequence's key offset; and, for an error the kernels report, which sequence and token it names.
//
// The batch's fresh tokens are the sequences' chunks concatenated in batch order ([sum n][H][d]); its new pages
// are numbered in batch order too (sequence 0's first, ...), so that they take the free list's pages in the order
// one append per sequence would. A chunk's first tokens that go to the sink tokens (SequenceChunk::sinks) stay in
// those arrays but are no part of the stream: the device store keeps them apart.
#pragma once

#include <cstddef>
#include <span>
#include <vector>

namespace kvq::cuda::detail {

/// One sequence of a batch as the cache holds it before the append, and its chunk.
struct SequenceChunk {
  size_t used = 0;  ///< window tokens
  size_t n_tokens = 0;
  bool has_offset = false;  ///< its key offset is set (centered keys)
  size_t sinks = 0;         ///< the chunk's first tokens that go to the sink tokens (stored apart), not the stream
};

/// What one sequence's append does.
struct SequencePlan {
  size_t fresh_first = 0;  ///< its first fresh stream token in the batch's arrays (after its sink tokens)
  size_t sinks = 0;        ///< its chunk's sink tokens, before fresh_first
  size_t used = 0, n_tokens = 0;  ///< n_tokens: the chunk's tokens that join the stream
  size_t first_page = 0, n_pages = 0;  ///< the batch's pages [first_page, first_page + n_pages)
  size_t encoded = 0;                  ///< n_pages * T stream tokens go to pages
  size_t kept = 0;                     ///< the window's tokens afterwards
  bool new_offset = false;             ///< this append fixes the key offset (its first page, centered keys)
  /// The stream tokens [gather_first, gather_first + gather_count) are copied toward the window: into its slots
  /// from `window_slot` where those are free (no page is encoded, or the window was empty), else into the batch's
  /// scratch from token `scratch_first` (per role and head), moved into the window by the commit.
  size_t gather_first = 0, gather_count = 0, window_slot = 0;
  bool through_scratch = false;
  size_t scratch_first = 0;
};

struct AppendPlan {
  std::vector<SequencePlan> seqs;
  size_t pages = 0;           ///< new pages of the batch
  size_t fresh_tokens = 0;    ///< sum of n_tokens
  size_t scratch_tokens = 0;  ///< scratch tokens per role and head
  size_t new_offsets = 0;     ///< sequences whose key offset this append sets
};

/// Plans the batch. T: tokens per page, R: the window's fp32 tokens, centers: the cache centers its keys.
inline AppendPlan plan_append(std::span<const SequenceChunk> chunks, size_t T, size_t R, bool centers) {
  AppendPlan plan;
  for (const SequenceChunk& c : chunks) {
    SequencePlan s;
    s.sinks = c.sinks;
    s.fresh_first = plan.fresh_tokens + c.sinks;
    s.used = c.used;
    s.n_tokens = c.n_tokens - c.sinks;
    const size_t total = c.used + s.n_tokens;
    s.n_pages = total >= R + T ? (total - R - T) / T + 1 : 0;
    s.first_page = plan.pages;
    s.encoded = s.n_pages * T;
    s.kept = total - s.encoded;
    s.new_offset = centers && !c.has_offset && s.n_pages > 0;
    if (s.encoded == 0) {  // the fresh tokens go behind the used slots
      s.gather_first = c.used;
      s.gather_count = s.n_tokens;
      s.window_slot = c.used;
    } else {
      s.gather_first = s.encoded;
      s.gather_count = s.kept;
      s.through_scratch = c.used > 0 && s.kept > 0;  // the window's used slots are read until the commit
      if (s.through_scratch) {
        s.scratch_first = plan.scratch_tokens;
        plan.scratch_tokens += s.kept;
      }
    }
    plan.pages += s.n_pages;
    plan.fresh_tokens += c.n_tokens;
    plan.new_offsets += s.new_offset ? 1 : 0;
    plan.seqs.push_back(s);
  }
  return plan;
}

/// A token of one sequence's stream: the window's token `index` (in_window) or its chunk's token `index` (counting
/// the chunk's sink tokens, as an append's caller counts them).
struct StreamToken {
  size_t seq = 0;
  bool in_window = false;
  size_t index = 0;
};

/// Token t of the batch's page `page`.
inline StreamToken locate_page_token(const AppendPlan& plan, size_t page, size_t t, size_t T) {
  // The last sequence whose pages start at or before `page` and that has pages.
  size_t i = 0;
  for (size_t k = 0; k < plan.seqs.size(); ++k)
    if (plan.seqs[k].n_pages > 0 && plan.seqs[k].first_page <= page) i = k;
  const SequencePlan& s = plan.seqs[i];
  const size_t token = (page - s.first_page) * T + t;
  return token < s.used ? StreamToken{i, true, token} : StreamToken{i, false, token - s.used + s.sinks};
}

/// The batch's fresh token `token` (an index into [sum n]).
inline StreamToken locate_fresh_token(const AppendPlan& plan, size_t token) {
  size_t i = 0;
  for (size_t k = 0; k < plan.seqs.size(); ++k)
    if (plan.seqs[k].n_tokens > 0 && plan.seqs[k].fresh_first <= token) i = k;
  return {i, false, token - plan.seqs[i].fresh_first + plan.seqs[i].sinks};
}

}  // namespace kvq::cuda::detail

// The plan-then-run engine behind decode_attention and prefill_attention.
#pragma once

#include <cstddef>
#include <memory>
#include <span>

#include "kvq/attention.hpp"

namespace kvq::detail {

/// The queries that attend through one kv head of one sequence: n_pos positions x the G query heads of the group.
/// Row (pos, g) of q and out starts at pos * pos_stride + g * head_dim. Position pos sees the first
/// min(visible0 + pos, length) tokens.
struct QueryGroup {
  SeqId seq = 0;
  int kv_head = 0;
  const float* q = nullptr;
  float* out = nullptr;
  size_t pos_stride = 0;
  int n_pos = 1;
  size_t visible0 = 0;
};

/// Plans the split of the groups' pages over the pool, runs the page loops, then merges, adds the residual
/// windows and writes the outputs. The scratch of a run (gathered queries, split-K states, each worker's buffers)
/// stays with the engine for the next: a run allocates only what the last one did not need; nothing inside the
/// page loop.
class AttentionEngine {
 public:
  AttentionEngine();
  ~AttentionEngine();
  AttentionEngine(AttentionEngine&&) noexcept;
  AttentionEngine& operator=(AttentionEngine&&) noexcept;

  void run(const KVCache& cache, int layer, std::span<const QueryGroup> groups, int group_size,
           const AttentionOptions& options, ThreadPool* pool);

 private:
  struct Scratch;
  std::unique_ptr<Scratch> scratch_;
};

/// One run of a new engine.
void run_attention(const KVCache& cache, int layer, std::span<const QueryGroup> groups, int group_size,
                   const AttentionOptions& options, ThreadPool* pool);

}  // namespace kvq::detail

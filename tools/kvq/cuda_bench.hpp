// kvq bench attention --device cuda (cuda_bench.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace kvq::cli {

struct CudaBenchOptions {
  size_t ctx = 32768, batch = 1;
  int q_heads = 32, kv_heads = 8, dim = 128, block = 64, reps = 20;
  std::vector<std::string> keys, values;
  bool json = false;
  bool hot = false;  ///< every sequence of the batch reads one sequence's pages (L2-resident when they fit)
  uint64_t seed = 1;
  int splits = 0;  ///< split-K ranges per sequence and kv head (AttentionOptions::splits); 0: the plan's choice
};

/// Times every (--k, --v) pair and the bf16/bf16 baseline on CUDA device 0; prints a table or one JSON object.
void run_cuda_bench(const CudaBenchOptions& o);

}  // namespace kvq::cli

// kvq bench append --device cuda (cuda_append_bench.cpp).
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace kvq::cli {

struct AppendBenchOptions {
  size_t batch = 32, chunk = 4096;
  int kv_heads = 8, dim = 128, block = 64, reps = 10;
  std::vector<std::string> codecs;
  bool json = false;
  uint64_t seed = 1;
  std::string device = "cuda";  ///< the only device the append kernels run on
};

/// Times KVCache::append_device per codec on CUDA device 0: a prefill chunk per sequence and a one-token
/// decode append per sequence; prints a table or one JSON object.
void run_cuda_append_bench(const AppendBenchOptions& o);

}  // namespace kvq::cli

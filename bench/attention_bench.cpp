// Decode attention per codec pair and kernel instruction set (Google Benchmark), one thread, at a shape whose cache
// stays in the last-level cache: the kernels' compute speed. `kvq bench attention` measures them from memory.
// Run: build/release/bench/kvq_bench --benchmark_filter=attention
#include <benchmark/benchmark.h>

#include <cstdlib>
#include <string>
#include <vector>

#include "kvq/attention.hpp"
#include "kvq/cache.hpp"
#include "kvq/detail/synthetic.hpp"

namespace kvq {
namespace {

constexpr int kKvHeads = 8, kGroup = 4, kDim = 128, kBlock = 64;
constexpr size_t kContext = 2048;

void decode_benchmark(benchmark::State& state, const std::string& k, const std::string& v, const std::string& isa) {
  setenv("KVQ_ISA", isa.c_str(), 1);
  CacheConfig cfg;
  cfg.n_kv_heads = kKvHeads;
  cfg.head_dim = kDim;
  cfg.block_tokens = kBlock;
  cfg.key_codec = k;
  cfg.value_codec = v;
  cfg.capacity_pages = kContext / kBlock;
  KVCache cache(cfg);
  const size_t rows = kContext * kKvHeads;
  const auto keys = sample_profile(key_like_profile(kDim, 1), rows, 2);
  const auto values = gaussian_vectors(rows, kDim, 3);
  const SeqId seq[1] = {cache.add_sequence()};
  cache.append(seq[0], 0, keys.data(), values.data(), kContext);
  const auto q = gaussian_vectors(kKvHeads * kGroup, kDim, 4);
  std::vector<float> out(q.size());
  for (auto _ : state) {
    decode_attention(cache, 0, seq, q, out);
    benchmark::DoNotOptimize(out.data());
  }
  const double bytes_per_token =
      kKvHeads * static_cast<double>(cache.key_codec(0).block_bytes() + cache.value_codec(0).block_bytes()) / kBlock;
  state.SetBytesProcessed(static_cast<int64_t>(static_cast<double>(state.iterations()) * bytes_per_token * kContext));
  state.SetLabel(attention_kernel(cache, 0));
  unsetenv("KVQ_ISA");
}

void register_attention_benchmarks() {
  const std::vector<std::pair<std::string, std::string>> pairs{
      {"f16", "f16"},         {"int4", "int4"},          {"int8", "int8"},
      {"kivi:2", "kivi:2"},   {"kivi:4", "kivi:4"},      {"turbo_mse:3", "turbo_mse:3"},
      {"turbo_mse:2", "turbo_mse:2"}, {"turbo_mse:4", "turbo_mse:4"}, {"turbo_prod:3", "turbo_mse:3"}};
  for (const auto& [k, v] : pairs)
    for (const std::string isa : {"scalar", "avx2", "avx512"})
      benchmark::RegisterBenchmark(("attention/decode/" + k + "_" + v + "/" + isa).c_str(),
                                   [k, v, isa](benchmark::State& state) {
                                     try {
                                       decode_benchmark(state, k, v, isa);
                                     } catch (const std::exception& e) {  // an ISA this CPU lacks
                                       unsetenv("KVQ_ISA");
                                       state.SkipWithError(e.what());
                                     }
                                   });
}

const int registered = (register_attention_benchmarks(), 0);

}  // namespace
}  // namespace kvq

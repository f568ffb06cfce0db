// Encode and decode throughput of every codec (Google Benchmark). Run: build/release/bench/kvq_bench
#include <benchmark/benchmark.h>

#include "codec_test_specs.hpp"
#include "kvq/codec.hpp"
#include "kvq/detail/synthetic.hpp"

namespace kvq {
namespace {

void register_codec_benchmarks() {
  for (const auto& spec : test::codec_test_specs()) {
    benchmark::RegisterBenchmark(("encode/" + spec).c_str(), [spec](benchmark::State& state) {
      constexpr int kD = 128, kT = 64;
      auto codec = make_codec(spec, CodecParams{kD, kT, 1, Role::key});
      const auto x = sample_profile(key_like_profile(kD, 1), 4096, 2);
      if (codec->needs_training()) codec->train(x.data(), 4096);
      std::vector<uint8_t> block(codec->block_bytes());
      for (auto _ : state) {
        codec->encode(x.data(), kT, block.data());
        benchmark::DoNotOptimize(block.data());
      }
      state.SetItemsProcessed(state.iterations() * kT);
    });
    benchmark::RegisterBenchmark(("decode/" + spec).c_str(), [spec](benchmark::State& state) {
      constexpr int kD = 128, kT = 64;
      auto codec = make_codec(spec, CodecParams{kD, kT, 1, Role::key});
      const auto x = sample_profile(key_like_profile(kD, 1), 4096, 2);
      if (codec->needs_training()) codec->train(x.data(), 4096);
      std::vector<uint8_t> block(codec->block_bytes());
      std::vector<float> out(static_cast<size_t>(kT) * kD);
      codec->encode(x.data(), kT, block.data());
      for (auto _ : state) {
        codec->decode(block.data(), kT, out.data());
        benchmark::DoNotOptimize(out.data());
      }
      state.SetItemsProcessed(state.iterations() * kT);
    });
  }
}

const int registered = (register_codec_benchmarks(), 0);

}  // namespace
}  // namespace kvq

// Throughput of Rotation::apply for each kind on a batch of 64 rows (Google Benchmark).
// Run: build/release/bench/kvq_bench --benchmark_filter=rotation
#include <benchmark/benchmark.h>

#include <string>
#include <vector>

#include "kvq/detail/synthetic.hpp"
#include "kvq/rotation.hpp"

namespace kvq {
namespace {

void register_rotation_benchmarks() {
  constexpr size_t kRows = 64;
  for (int d : {128, 80})
    for (const char* spec : {"identity", "hadamard", "srft", "haar", "householder"}) {
      if (std::string(spec) == "hadamard" && (d & (d - 1)) != 0) continue;
      const std::string name = std::string("rotation_apply/") + spec + "/d" + std::to_string(d) + "/rows64";
      benchmark::RegisterBenchmark(name.c_str(), [spec = std::string(spec), d](benchmark::State& state) {
        const auto rot = make_rotation(spec, d, 1);
        const auto x = sample_profile(key_like_profile(d, 1), kRows, 2);
        std::vector<float> y(x.size());
        for (auto _ : state) {
          rot->apply(x.data(), y.data(), kRows);
          benchmark::DoNotOptimize(y.data());
          benchmark::ClobberMemory();
        }
        state.SetItemsProcessed(state.iterations() * static_cast<int64_t>(kRows));
      });
    }
}

const int registered = (register_rotation_benchmarks(), 0);

}  // namespace
}  // namespace kvq

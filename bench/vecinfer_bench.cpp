// Throughput of the exact nearest-centroid search that encodes vecinfer sub-vectors (Google Benchmark), in
// sub-vectors per second. Run: build/release/bench/kvq_bench --benchmark_filter=nearest_centroid
#include <benchmark/benchmark.h>

#include "codec/nearest_centroid.hpp"
#include "kvq/detail/synthetic.hpp"

namespace kvq {
namespace {

// args: sub-vector length s, centroids K.
void nearest_centroid(benchmark::State& state) {
  const int s = static_cast<int>(state.range(0)), k = static_cast<int>(state.range(1));
  constexpr size_t kPoints = 4096;
  const auto centroids = gaussian_vectors(static_cast<size_t>(k), s, 1);
  const auto x = gaussian_vectors(kPoints, s, 2);
  const CentroidTable table(centroids.data(), k, s);
  std::vector<uint32_t> idx(kPoints);
  for (auto _ : state) {
    table.nearest(x.data(), kPoints, idx.data());
    benchmark::DoNotOptimize(idx.data());
  }
  state.SetItemsProcessed(static_cast<int64_t>(state.iterations() * kPoints));
}
BENCHMARK(nearest_centroid)->ArgNames({"s", "K"})->Args({4, 256})->Args({4, 4096})->Args({8, 256})->Args({8, 4096});

}  // namespace
}  // namespace kvq

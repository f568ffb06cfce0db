// Device timing for the benchmarks: CUDA events around repeated work, and the copy bandwidth figures are compared
// with.
#include <algorithm>
#include <functional>
#include <vector>

#include "cuda/cuda_check.cuh"
#include "cuda/device_memory.hpp"
#include "kvq/detail/cuda_bench_support.hpp"
#include "kvq/error.hpp"

namespace kvq::cuda {

double median_ms(const std::function<void()>& work, int reps, int warmup) {
  KVQ_CHECK(reps > 0, "median_ms: reps = ", reps);
  for (int i = 0; i < warmup; ++i) work();
  cudaEvent_t start = nullptr, stop = nullptr;
  KVQ_CUDA_CHECK(cudaEventCreate(&start));
  KVQ_CUDA_CHECK(cudaEventCreate(&stop));
  std::vector<float> ms(static_cast<size_t>(reps));
  for (float& t : ms) {
    KVQ_CUDA_CHECK(cudaEventRecord(start));
    work();
    KVQ_CUDA_CHECK(cudaEventRecord(stop));
    KVQ_CUDA_CHECK(cudaEventSynchronize(stop));
    KVQ_CUDA_CHECK(cudaEventElapsedTime(&t, start, stop));
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::nth_element(ms.begin(), ms.begin() + reps / 2, ms.end());
  return ms[static_cast<size_t>(reps / 2)];
}

double copy_bandwidth_gbps(size_t bytes, int reps, int device) {
  detail::use_device(device);
  // Several buffer pairs, rotated, so that a buffer smaller than ~3x L2 is not served from the cache.
  constexpr int kPairs = 2;
  std::vector<detail::DevicePtr<uint8_t>> src, dst;
  for (int i = 0; i < kPairs; ++i) {
    src.push_back(detail::device_alloc<uint8_t>(bytes, "the copy-bandwidth source"));
    dst.push_back(detail::device_alloc<uint8_t>(bytes, "the copy-bandwidth destination"));
    KVQ_CUDA_CHECK(cudaMemset(src.back().get(), 0x5a + i, bytes));
  }
  int next = 0;
  const double ms = median_ms(
      [&] {
        KVQ_CUDA_CHECK(cudaMemcpyAsync(dst[next].get(), src[next].get(), bytes, cudaMemcpyDeviceToDevice));
        next = (next + 1) % kPairs;
      },
      reps);
  return 2.0 * static_cast<double>(bytes) / (ms * 1e6);
}

}  // namespace kvq::cuda

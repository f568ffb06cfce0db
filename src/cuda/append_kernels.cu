// The append path's helper kernels (append_kernels.hpp).
#include "cuda/append_kernels.hpp"

#include <algorithm>

#include "cuda/cuda_check.cuh"

namespace kvq::cuda::detail {
namespace {

constexpr int kThreads = 256;

unsigned blocks_for(size_t n) { return static_cast<unsigned>(std::min<size_t>((n + kThreads - 1) / kThreads, 65536)); }

__device__ __forceinline__ const float* stream_row(const EncodeSource& s, size_t idx, int h) {
  return idx < static_cast<size_t>(s.used) ? s.window + (static_cast<size_t>(h) * s.slots + idx) * s.d
                                           : s.fresh + ((idx - s.used) * s.H + h) * s.d;
}

__global__ void key_mean_kernel(EncodeSource s, float* offset) {
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i >= s.H * s.d) return;
  const int h = i / s.d, c = i % s.d;
  float sum = 0;
  for (int t = 0; t < s.T; ++t) sum = __fadd_rn(sum, stream_row(s, static_cast<size_t>(t), h)[c]);
  offset[i] = __fdiv_rn(sum, static_cast<float>(s.T));
}

__global__ void gather_window_kernel(EncodeSource ks, EncodeSource vs, size_t stream_first, size_t count,
                                     float* dst_k, float* dst_v, size_t dst_slot, unsigned long long* nonfinite) {
  const bool value = blockIdx.y == 1;
  const EncodeSource& s = value ? vs : ks;
  float* dst = value ? dst_v : dst_k;
  const size_t per_head = count * s.d, n = per_head * s.H;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const int h = static_cast<int>(i / per_head), c = static_cast<int>(i % s.d);
    const size_t k = i % per_head / s.d, idx = stream_first + k;
    const float* row = stream_row(s, idx, h);
    float v = row[c];
    if (!isfinite(v)) atomicMin(nonfinite + (value ? 1 : 0), static_cast<unsigned long long>(row + c - s.fresh));
    if (s.offset != nullptr && (idx >= static_cast<size_t>(s.used) || s.center_window))
      v = __fsub_rn(v, s.offset[h * s.d + c]);
    dst[(static_cast<size_t>(h) * s.slots + dst_slot + k) * s.d + c] = v;
  }
}

}  // namespace

void launch_key_mean(const EncodeSource& src, float* offset, cudaStream_t stream) {
  const size_t n = static_cast<size_t>(src.H) * src.d;
  key_mean_kernel<<<blocks_for(n), kThreads, 0, stream>>>(src, offset);
  KVQ_CUDA_CHECK(cudaGetLastError());
}

void launch_gather_window(const EncodeSource& keys, const EncodeSource& values, size_t stream_first, size_t count,
                          float* dst_keys, float* dst_values, size_t dst_slot, unsigned long long* nonfinite,
                          cudaStream_t stream) {
  const size_t n = count * keys.d * keys.H;
  if (n == 0) return;
  const dim3 grid(blocks_for(n), 2);
  gather_window_kernel<<<grid, kThreads, 0, stream>>>(keys, values, stream_first, count, dst_keys, dst_values, dst_slot,
                                                      nonfinite);
  KVQ_CUDA_CHECK(cudaGetLastError());
}

}  // namespace kvq::cuda::detail

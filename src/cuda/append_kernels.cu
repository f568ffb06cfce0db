// The append path's helper kernels (append_kernels.hpp).
#include "cuda/append_kernels.hpp"

#include <algorithm>

#include "cuda/cuda_check.cuh"

namespace kvq::cuda::detail {
namespace {

constexpr int kThreads = 256;

unsigned blocks_for(size_t n) { return static_cast<unsigned>(std::min<size_t>((n + kThreads - 1) / kThreads, 65536)); }

__device__ __forceinline__ const float* stream_row(const EncodeSource& src, const EncodeStream& s, size_t idx, int h) {
  return idx < static_cast<size_t>(s.used) ? s.window + (static_cast<size_t>(h) * src.slots + idx) * src.d
                                           : src.fresh_base + ((s.fresh_first + idx - s.used) * src.H + h) * src.d;
}

__global__ void key_mean_kernel(const __grid_constant__ EncodeSource src, const KeyMean* means) {
  const KeyMean m = means[blockIdx.y];
  const int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (m.offset == nullptr || i >= src.H * src.d) return;  // an empty entry
  const EncodeStream s = src.streams[m.stream];
  const int h = i / src.d, c = i % src.d;
  float sum = 0;
  for (int t = 0; t < src.T; ++t) sum = __fadd_rn(sum, stream_row(src, s, static_cast<size_t>(t), h)[c]);
  m.offset[i] = __fdiv_rn(sum, static_cast<float>(src.T));
}

__global__ void gather_window_kernel(const __grid_constant__ EncodeSource ks, const __grid_constant__ EncodeSource vs,
                                     const WindowGather* gathers, unsigned long long* nonfinite) {
  const bool value = blockIdx.z == 1;
  const EncodeSource& src = value ? vs : ks;
  const WindowGather g = gathers[blockIdx.y];
  const EncodeStream s = src.streams[g.stream];
  float* dst = g.dst + (value ? static_cast<size_t>(src.H) * g.stride * src.d : 0);
  const size_t per_head = static_cast<size_t>(g.count) * src.d, n = per_head * src.H;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const int h = static_cast<int>(i / per_head), c = static_cast<int>(i % src.d);
    const size_t k = i % per_head / src.d, idx = g.first + k;
    const float* row = stream_row(src, s, idx, h);
    float v = row[c];
    const bool fresh = idx >= static_cast<size_t>(s.used);
    if (fresh && !isfinite(v))
      atomicMin(nonfinite + (value ? 1 : 0), static_cast<unsigned long long>(row + c - src.fresh_base));
    if (s.offset != nullptr && (fresh || s.center_window)) v = __fsub_rn(v, s.offset[h * src.d + c]);
    dst[(static_cast<size_t>(h) * g.stride + g.slot + k) * src.d + c] = v;
  }
}

__global__ void move_window_kernel(const WindowMove* moves, int H, int slots, int d) {
  const WindowMove m = moves[blockIdx.y];
  const size_t per_row = static_cast<size_t>(m.count) * d, n = per_row * 2 * H;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n;
       i += static_cast<size_t>(gridDim.x) * blockDim.x)
    m.to[i / per_row * slots * d + i % per_row] = m.from[i];
}

__global__ void place_page_ids_kernel(const EncodePage* pages, size_t n, PageId* const* table_ends, int T) {
  for (size_t p = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; p < n;
       p += static_cast<size_t>(gridDim.x) * blockDim.x) {
    const EncodePage page = pages[p];
    if (page.stream != kNoStream) table_ends[page.stream][page.first / T] = page.target;
  }
}

}  // namespace

void launch_key_means(const EncodeSource& keys, const KeyMean* means, size_t n, cudaStream_t stream) {
  if (n == 0) return;
  const dim3 grid(blocks_for(static_cast<size_t>(keys.H) * keys.d), static_cast<unsigned>(n));
  key_mean_kernel<<<grid, kThreads, 0, stream>>>(keys, means);
  KVQ_CUDA_CHECK(cudaGetLastError());
}

void launch_gather_windows(const EncodeSource& keys, const EncodeSource& values, const WindowGather* gathers, size_t n,
                           size_t max_count, unsigned long long* nonfinite, cudaStream_t stream) {
  if (n == 0 || max_count == 0) return;
  const dim3 grid(blocks_for(max_count * keys.d * keys.H), static_cast<unsigned>(n), 2);
  gather_window_kernel<<<grid, kThreads, 0, stream>>>(keys, values, gathers, nonfinite);
  KVQ_CUDA_CHECK(cudaGetLastError());
}

void launch_move_windows(const WindowMove* moves, size_t n, size_t max_count, int H, int slots, int d,
                         cudaStream_t stream) {
  if (n == 0 || max_count == 0) return;
  const dim3 grid(blocks_for(2 * max_count * d * H), static_cast<unsigned>(n));
  move_window_kernel<<<grid, kThreads, 0, stream>>>(moves, H, slots, d);
  KVQ_CUDA_CHECK(cudaGetLastError());
}

void launch_place_page_ids(const EncodePage* pages, size_t n, PageId* const* table_ends, int T, cudaStream_t stream) {
  if (n == 0) return;
  place_page_ids_kernel<<<blocks_for(n), kThreads, 0, stream>>>(pages, n, table_ends, T);
  KVQ_CUDA_CHECK(cudaGetLastError());
}

}  // namespace kvq::cuda::detail

// The encoders' rotation of a page's tokens in shared memory: y = R x for each row of a [rows][d] tile, by the whole
// thread block. The randomized Hadamard transform takes a row per warp into registers and runs the CPU's butterflies
// there (hadamard_lanes.cuh: bit-exact with src/rotation/hadamard.cpp, one barrier for the tile); any other
// rotation (srft, householder, haar, identity) multiplies by its dense matrix, whose float order differs from the
// CPU's.
#pragma once

#include <cstdint>

#include "cuda/encode_layout.cuh"
#include "cuda/hadamard_lanes.cuh"

namespace kvq::cuda::detail {

/// A DeviceRotation (device_encoder.hpp) as kernels read it.
struct RotationView {
  const float* signs = nullptr;    ///< hadamard: d signs (null: dense)
  const float* columns = nullptr;  ///< dense: row i = R e_i
  float scale = 0;
  __host__ __device__ bool hadamard() const { return signs != nullptr; }
};

struct WarpXor {
  __device__ float operator()(float value, int m) const { return __shfl_xor_sync(0xffffffffu, value, m); }
};

// The Hadamard transform of every row, a row per warp at a time: E elements a lane (d = 32 E, or d < 32 with E = 1).
template <int E>
__device__ void hadamard_rows(const RotationView& r, float* x, int rows, int d) {
  const int lane = static_cast<int>(threadIdx.x) & 31, lanes = d / E;
  for (int row = static_cast<int>(threadIdx.x) >> 5; row < rows; row += static_cast<int>(blockDim.x) >> 5) {
    float* at = x + row * d + lane * E;
    float v[E] = {};
    if (lane < lanes) {
      if constexpr (E % 4 == 0) {
#pragma unroll
        for (int k = 0; k < E; k += 4) {
          const float4 q = *reinterpret_cast<const float4*>(at + k);
          v[k] = q.x, v[k + 1] = q.y, v[k + 2] = q.z, v[k + 3] = q.w;
        }
      } else {
#pragma unroll
        for (int k = 0; k < E; ++k) v[k] = at[k];
      }
    }
    hadamard_row_lanes<E>(v, r.signs, r.scale, lane, lanes, WarpXor{});
    if (lane < lanes) {
      if constexpr (E % 4 == 0) {
#pragma unroll
        for (int k = 0; k < E; k += 4) *reinterpret_cast<float4*>(at + k) = {v[k], v[k + 1], v[k + 2], v[k + 3]};
      } else {
#pragma unroll
        for (int k = 0; k < E; ++k) at[k] = v[k];
      }
    }
  }
}

/// Rotates the rows of x in place; `spare` holds rows * d floats for a dense rotation (unused by Hadamard). Called
/// by every thread of the block; ends with a barrier.
__device__ inline void rotate_rows(const RotationView& r, float* x, float* spare, int rows, int d,
                                   const FastDiv& dd) {
  const int n = rows * d;
  if (r.hadamard()) {  // d is a power of two, at most 512 (launch_encode refuses a page of T >= 64 x d = 1024)
    switch (d >> 5) {
      case 0:
      case 1: hadamard_rows<1>(r, x, rows, d); break;
      case 2: hadamard_rows<2>(r, x, rows, d); break;
      case 4: hadamard_rows<4>(r, x, rows, d); break;
      case 8: hadamard_rows<8>(r, x, rows, d); break;
      default: hadamard_rows<16>(r, x, rows, d); break;
    }
    __syncthreads();
    return;
  }
  for (int k = threadIdx.x; k < n; k += blockDim.x) {
    const float* row = x + dd.div(k) * d;
    const int j = dd.mod(k);
    float acc = 0;
    for (int i = 0; i < d; ++i) acc = fmaf(row[i], __ldg(r.columns + i * d + j), acc);
    spare[k] = acc;
  }
  __syncthreads();
  for (int i = threadIdx.x; i < n; i += blockDim.x) x[i] = spare[i];
  __syncthreads();
}

}  // namespace kvq::cuda::detail

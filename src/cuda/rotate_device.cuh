// The encoders' rotation of a page's tokens in shared memory: y = R x for each row of a [rows][d] tile, by the whole
// thread block. The randomized Hadamard transform runs the CPU's butterflies (src/rotation/hadamard.cpp) stage by
// stage with rounded, never fused, operations, so it is bit-exact with the CPU; any other rotation (srft,
// householder, haar, identity) multiplies by its dense matrix, whose float order differs from the CPU's.
#pragma once

#include <cstdint>

#include "cuda/encode_layout.cuh"

namespace kvq::cuda::detail {

/// A DeviceRotation (device_encoder.hpp) as kernels read it.
struct RotationView {
  const float* signs = nullptr;    ///< hadamard: d signs (null: dense)
  const float* columns = nullptr;  ///< dense: row i = R e_i
  float scale = 0;
  __host__ __device__ bool hadamard() const { return signs != nullptr; }
};

/// Rotates the rows of x in place; `spare` holds rows * d floats for a dense rotation (unused by Hadamard).
__device__ inline void rotate_rows(const RotationView& r, float* x, float* spare, int rows, int d,
                                   const FastDiv& dd) {
  const int n = rows * d;
  if (r.hadamard()) {  // d is a power of two
    for (int i = threadIdx.x; i < n; i += blockDim.x) x[i] = __fmul_rn(x[i], r.signs[dd.mod(i)]);
    __syncthreads();
    const int lhalf = dd.shift - 1, half = d / 2;
    for (int lh = 0; (1 << lh) < d; ++lh) {
      const int h = 1 << lh;
      for (int k = threadIdx.x; k < rows * half; k += blockDim.x) {
        const int p = k & (half - 1);
        float* v = x + ((k >> lhalf) << dd.shift) + ((p >> lh) << (lh + 1)) + (p & (h - 1));
        const float a = v[0], b = v[h];
        v[0] = __fadd_rn(a, b);
        v[h] = __fsub_rn(a, b);
      }
      __syncthreads();
    }
    for (int i = threadIdx.x; i < n; i += blockDim.x) x[i] = __fmul_rn(x[i], r.scale);
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

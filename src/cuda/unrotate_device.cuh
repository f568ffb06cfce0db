// The encoders' inverse rotation of rows in shared memory, y = R^T x (turbo_prod's residual against the decoded
// MSE stage, vecinfer's gamma against the decoded token), as the CPU's apply_inverse: for the randomized Hadamard
// transform R^T = diag(s) H / sqrt(d), rotate_rows with unit signs (the butterflies, then times 1 / sqrt(d)), then
// times the signs: the CPU's y * (s_j / sqrt(d)) equals (y / sqrt(d)) * s_j exactly (s_j = +-1), so bit-exact;
// any other rotation by the dense matrix of R^T (float order differs). State: DeviceInverseRotation.
#pragma once

#include "cuda/encode_layout.cuh"
#include "cuda/rotate_device.cuh"

namespace kvq::cuda::detail {

struct InverseRotationView {
  RotationView butterflies;
  const float* signs = nullptr;  ///< hadamard: applied after the butterflies; null: dense
  __host__ __device__ bool hadamard() const { return butterflies.hadamard(); }
};

/// Rotates the rows of x in place by R^T; `spare` holds rows * d floats for a dense rotation.
__device__ inline void unrotate_rows(const InverseRotationView& r, float* x, float* spare, int rows, int d,
                                     const FastDiv& dd) {
  rotate_rows(r.butterflies, x, spare, rows, d, dd);
  if (r.signs == nullptr) return;
  for (int i = threadIdx.x; i < rows * d; i += blockDim.x) x[i] = __fmul_rn(x[i], r.signs[dd.mod(i)]);
  __syncthreads();
}

}  // namespace kvq::cuda::detail

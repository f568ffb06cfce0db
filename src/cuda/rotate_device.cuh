// The encoders' rotation of a page's tokens in shared memory: y = R x for each row of a [rows][d] tile, by the whole
// thread block. The randomized Hadamard transform takes a row per warp into registers and runs the CPU's butterflies
// there (hadamard_lanes.cuh: bit-exact with src/rotation/hadamard.cpp, one barrier for the tile); any other
// rotation (srft, householder, haar, identity) multiplies by its dense matrix, whose float order differs from the
// CPU's.
#pragma once

#include <cstdint>

#include "cuda/encode_kernel.cuh"
#include "cuda/encode_layout.cuh"
#include "cuda/exact_quotient.cuh"
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

// A lane's elements [lane E, (lane + 1) E) of a row (at = the row + lane E) into v, or from v into the row.
template <int E>
__device__ __forceinline__ void load_lane_row(const float* at, float (&v)[E]) {
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
template <int E>
__device__ __forceinline__ void store_lane_row(float* at, const float (&v)[E]) {
  if constexpr (E % 4 == 0) {
#pragma unroll
    for (int k = 0; k < E; k += 4) *reinterpret_cast<float4*>(at + k) = {v[k], v[k + 1], v[k + 2], v[k + 3]};
  } else {
#pragma unroll
    for (int k = 0; k < E; ++k) at[k] = v[k];
  }
}

// E >= 8 (d = 256, 512): one row at a time.
template <int E>
__device__ __forceinline__ void hadamard_rows_single(const RotationView& r, float* x, int rows, int d,
                                                     const Divisor* divisor) {
  const int lane = static_cast<int>(threadIdx.x) & 31, lanes = d / E;
  const int warp = static_cast<int>(threadIdx.x) >> 5, warps = kEncodeThreads >> 5;
  const bool active = lane < lanes;
  for (int row = warp; row < rows; row += warps) {
    float* at = x + row * d + lane * E;
    float v[E] = {};
    if (active) load_lane_row<E>(at, v);
    hadamard_row_lanes<E>(v, r.signs, r.scale, lane, lanes, WarpXor{});
    if (active) {
      if (divisor != nullptr) {
#pragma unroll
        for (int k0 = 0; k0 < E; k0 += 4) {  // 4 at a time: the divisors of the whole row would spill
          float w[4] = {v[k0], v[k0 + 1], v[k0 + 2], v[k0 + 3]};
          divide<4>(w, [&](int k) { return divisor[lane * E + k0 + k]; });
#pragma unroll
          for (int k = 0; k < 4; ++k) v[k0 + k] = w[k];
        }
      }
      store_lane_row<E>(at, v);
    }
  }
}

// The same in a function of its own (not inlined), for a caller in whose body both instances (d = 256 and 512) took
// more registers than its occupancy allows (the int encoder's: a spilled row counter).
template <int E>
__device__ __noinline__ void hadamard_rows_single_outlined(const RotationView& r, float* x, int rows, int d,
                                                            const Divisor* divisor) {
  hadamard_rows_single<E>(r, x, rows, d, divisor);
}

// The Hadamard transform of every row: E elements a lane (d = 32 E, or d < 32 with E = 1). `divisor` (null: none):
// each element of the result then divided by divisor[c] (the IEEE quotient, as the CPU's x' / lambda_c, from the
// divisor's reciprocal: exact_quotient.cuh), before it is stored.
// Up to d = 128 (E <= 4) a warp takes two rows at a time (rows 2 w, 2 w + 1, then 2 (w + warps), ...): two
// independent rows between a stage's shuffles, so one row's exchange latency overlaps the other's, with the lane's
// signs and divisors loaded once for all its rows. Larger E keep one row at a time (hadamard_rows_single: the
// registers of two rows of 8 or 16 elements, with their signs, exceed what the encoders' occupancy allows).
template <int E, bool kOutlineSingle>
__device__ void hadamard_rows(const RotationView& r, float* x, int rows, int d, const Divisor* divisor) {
  if constexpr (E > 4 && kOutlineSingle) {
    hadamard_rows_single_outlined<E>(r, x, rows, d, divisor);
  } else if constexpr (E > 4) {
    hadamard_rows_single<E>(r, x, rows, d, divisor);
  } else {
    const int lane = static_cast<int>(threadIdx.x) & 31, lanes = d / E;
    // (the append blocks' kEncodeThreads, a constant: no register for the rows' stride)
    const int warp = static_cast<int>(threadIdx.x) >> 5, warps = kEncodeThreads >> 5;
    const bool active = lane < lanes;
    constexpr int R = 2;
    float sign[E];
    Divisor div[E];
#pragma unroll
    for (int k = 0; k < E; ++k) {
      sign[k] = active ? r.signs[lane * E + k] : 1.0f;
      div[k] = active && divisor != nullptr ? divisor[lane * E + k] : Divisor{1.0f, 1.0f};
    }
    for (int row0 = warp * R; row0 < rows; row0 += warps * R) {
      float v[R][E] = {};
#pragma unroll
      for (int i = 0; i < R; ++i)
        if (active && row0 + i < rows) load_lane_row<E>(x + (row0 + i) * d + lane * E, v[i]);
      // A row past `rows` (an odd count's last pair) is transformed as zeros and not stored; the condition is the
      // same for the whole warp, so every lane takes part in every shuffle.
      hadamard_rows_lanes<E, R>(v, sign, r.scale, lane, lanes, WarpXor{});
      if (divisor != nullptr) {
#pragma unroll
        for (int i = 0; i < R; ++i)  // (not the zeros of idle lanes and missing rows: each would take the divisions)
          if (active && row0 + i < rows) divide<E>(v[i], [&](int k) { return div[k]; });
      }
#pragma unroll
      for (int i = 0; i < R; ++i)
        if (active && row0 + i < rows) store_lane_row<E>(x + (row0 + i) * d + lane * E, v[i]);
    }
  }
}

/// Rotates the rows of x in place; `spare` holds rows * d floats for a dense rotation (unused by Hadamard). Called
/// by every thread of the block; ends with a barrier. `divisor` (Hadamard only; null: none): each rotated element
/// of channel c then divided by divisor[c] in the same pass (the IEEE quotient, the value the CPU's x' / divisor[c]
/// gives); a dense rotation ignores it (the caller divides). kOutlineSingle: d >= 256 by hadamard_rows_single_outlined.
template <bool kOutlineSingle = false>
__device__ inline void rotate_rows(const RotationView& r, float* x, float* spare, int rows, int d,
                                   const FastDiv& dd, const Divisor* divisor = nullptr) {
  const int n = rows * d;
  if (r.hadamard()) {  // d is a power of two, at most 512 (launch_encode refuses a page of T >= 64 x d = 1024)
    switch (d >> 5) {
      case 0:
      case 1: hadamard_rows<1, kOutlineSingle>(r, x, rows, d, divisor); break;
      case 2: hadamard_rows<2, kOutlineSingle>(r, x, rows, d, divisor); break;
      case 4: hadamard_rows<4, kOutlineSingle>(r, x, rows, d, divisor); break;
      case 8: hadamard_rows<8, kOutlineSingle>(r, x, rows, d, divisor); break;
      default: hadamard_rows<16, kOutlineSingle>(r, x, rows, d, divisor); break;
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

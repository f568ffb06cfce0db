// The tokens' norms in the append kernels, as the CPU encoders take them (src/codec/lane_norm.hpp: 32 partial sums
// of squares in double, partial r of coordinates r, r + 32, ..., then added by halves), four lanes to a row and
// eight rows to a warp, so that the square roots, reciprocals and stores of eight rows share one instruction.
//
// Lane k of a quad holds the partials r = k + 4 s (s = 0..7) in registers i = (s - g) mod 8, rotated by the row's
// place g in the warp: at step i of each 32-coordinate chunk the eight quads then read eight distinct columns, 32
// distinct banks when the rows start in the same bank (d a multiple of 32). The rotation leaves the order of every
// sum alone: partials 16, 8, 4 apart are slots 4, 2, 1 apart mod 8, so registers i and i + 4, then i and i + 2 mod 4,
// then 0 and 1 hold the same pairs for every g; the quad's lanes (partials 2 and 1 apart) then add by shuffles.
// Every add takes the same two values as the CPU's (in either order: IEEE addition is commutative).
#pragma once

#include "codec/lane_norm.hpp"

namespace kvq::cuda::detail {

/// Rows whose norms a warp takes at once.
constexpr int kNormRowsPerWarp = 8;

/// ||row|| of the d elements of `row` (floats or doubles, widened exactly) in each lane of the calling quad of
/// lanes; the whole warp calls it, each quad with its own row (d = 0 for none: norm 0).
template <class Element>
__device__ double quad_row_norm(const Element* row, int d) {
  static_assert(kNormLanes == 32 && kNormRowsPerWarp == 8, "four lanes of eight partials a row");
  const int lane = static_cast<int>(threadIdx.x) & 31, k = lane & 3, g = lane >> 2;
  double acc[8] = {};
  const auto add = [&](int i, int j) {
    const double v = static_cast<double>(row[j]);
    acc[i] = __dadd_rn(acc[i], __dmul_rn(v, v));
  };
  int chunk = 0;
  for (; chunk + 32 <= d; chunk += 32) {
#pragma unroll
    for (int i = 0; i < 8; ++i) add(i, chunk + k + 4 * ((i + g) & 7));
  }
  if (chunk < d) {  // d not a multiple of 32
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const int j = chunk + k + 4 * ((i + g) & 7);
      if (j < d) add(i, j);
    }
  }
#pragma unroll
  for (int i = 0; i < 4; ++i) acc[i] = __dadd_rn(acc[i], acc[i + 4]);
#pragma unroll
  for (int i = 0; i < 2; ++i) acc[i] = __dadd_rn(acc[i], acc[i + 2]);
  double sum = __dadd_rn(acc[0], acc[1]);
  sum = __dadd_rn(sum, __shfl_xor_sync(0xffffffffu, sum, 2));
  sum = __dadd_rn(sum, __shfl_xor_sync(0xffffffffu, sum, 1));
  return sqrt(sum);
}

/// f(t, ||row t||) once for each of the `rows` rows of d elements at x + t * stride (floats or doubles), the norms
/// taken by quads of lanes; the whole block calls it.
template <class Element, class F>
__device__ void for_each_row_norm(const Element* x, int rows, int stride, int d, F&& f) {
  const int warp = static_cast<int>(threadIdx.x) / 32, warps = static_cast<int>(blockDim.x) / 32;
  const int quad = (static_cast<int>(threadIdx.x) & 31) / 4;
  for (int t0 = warp * kNormRowsPerWarp; t0 < rows; t0 += warps * kNormRowsPerWarp) {
    const int t = t0 + quad;
    const double norm = quad_row_norm(x + (t < rows ? t : 0) * stride, t < rows ? d : 0);
    if (t < rows && (threadIdx.x & 3) == 0) f(t, norm);
  }
}

}  // namespace kvq::cuda::detail

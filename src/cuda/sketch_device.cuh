// The QJL sketch's sign bits on the device (src/codec/qjl_sketch.cpp), shared by the qjl and turbo_prod encoders:
// row i of S v in double with the CPU's four partial sums (coordinate j into sum j % 4, a tail past the last
// multiple of 4 into sum 0, then (a0 + a1) + (a2 + a3)), every product and sum rounded on its own, so the sign bit
// (set when the dot is >= 0) is bit-exact with the CPU's.
//
// Work split: the vectors lie in shared memory as doubles (converted once); a thread takes one sketch row and
// kSketchTokens vectors, so that each S element it loads (consecutive rows in consecutive lanes: coalesced, from
// L1) is converted once and feeds that many products, and each vector coordinate pair is one broadcast load.
#pragma once

#include <cstddef>

namespace kvq::cuda::detail {

/// S as the encoders read it: column-major, columns[j * m + i] = S_ij (consecutive rows i are consecutive floats,
/// so the threads of a warp, one row each, load a coalesced line per coordinate).
struct SketchView {
  const float* columns = nullptr;
  int m = 0;  ///< rows
};

constexpr int kSketchTokens = 8;  // vectors per thread (register blocking)

/// Doubles per row of a vector buffer for sketch_signs: d rounded up to even, so that coordinate pairs (j, j + 1)
/// at j % 4 == 0 are 16-byte aligned.
__host__ __device__ inline int sketch_row_stride(int d) { return d + (d & 1); }
/// Doubles of a vector buffer for up to n vectors: whole groups of kSketchTokens rows (the last group reads rows
/// past n, whose results it drops).
__host__ __device__ inline size_t sketch_buffer_doubles(int n, int d) {
  return static_cast<size_t>((n + kSketchTokens - 1) / kSketchTokens * kSketchTokens) * sketch_row_stride(d);
}

/// Calls set(t, i) for every vector t < n and sketch row i where (S v_t)_i >= 0; v: n vectors of d doubles, row
/// stride sketch_row_stride(d), 16-byte aligned, in shared memory of sketch_buffer_doubles(n, d). kExactProducts:
/// every v coordinate is a float
/// (so each product S_ij v_j is exact in double and the fused a + S_ij v_j rounds as the CPU's a + (S_ij v_j));
/// else each product is rounded on its own.
template <bool kExactProducts, class Set>
__device__ void sketch_signs(const SketchView& s, const double* v, int n, int d, Set set) {
  const int stride = sketch_row_stride(d), groups = (n + kSketchTokens - 1) / kSketchTokens;
  for (int k = threadIdx.x; k < groups * s.m; k += blockDim.x) {  // a warp: consecutive rows of one group
    const int g = k / s.m, i = k - g * s.m, t0 = g * kSketchTokens;
    const double* vg = v + t0 * stride;
    double a[kSketchTokens][4];
#pragma unroll
    for (int u = 0; u < kSketchTokens; ++u) a[u][0] = a[u][1] = a[u][2] = a[u][3] = 0;
    auto add = [](double acc, double c, double x) {
      return kExactProducts ? __fma_rn(c, x, acc) : __dadd_rn(acc, __dmul_rn(c, x));
    };
    const float* col = s.columns + i;
    int j = 0;
    for (; j + 4 <= d; j += 4) {
      double c[4];
#pragma unroll
      for (int q = 0; q < 4; ++q) c[q] = static_cast<double>(__ldg(col + (j + q) * s.m));
#pragma unroll
      for (int u = 0; u < kSketchTokens; ++u) {
        const double2 lo = *reinterpret_cast<const double2*>(vg + u * stride + j);
        const double2 hi = *reinterpret_cast<const double2*>(vg + u * stride + j + 2);
        a[u][0] = add(a[u][0], c[0], lo.x);
        a[u][1] = add(a[u][1], c[1], lo.y);
        a[u][2] = add(a[u][2], c[2], hi.x);
        a[u][3] = add(a[u][3], c[3], hi.y);
      }
    }
    for (; j < d; ++j) {
      const double c = static_cast<double>(__ldg(col + j * s.m));
#pragma unroll
      for (int u = 0; u < kSketchTokens; ++u) a[u][0] = add(a[u][0], c, vg[u * stride + j]);
    }
#pragma unroll
    for (int u = 0; u < kSketchTokens; ++u)
      if (t0 + u < n && __dadd_rn(__dadd_rn(a[u][0], a[u][1]), __dadd_rn(a[u][2], a[u][3])) >= 0) set(t0 + u, i);
  }
}

}  // namespace kvq::cuda::detail

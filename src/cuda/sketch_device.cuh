// The QJL sketch's sign bits on the device (src/codec/qjl_sketch.cpp), shared by the qjl and turbo_prod encoders:
// row i of S v in double with the CPU's four partial sums (coordinate j into sum j % 4, a tail past the last
// multiple of 4 into sum 0, then (a0 + a1) + (a2 + a3)), every product and sum rounded on its own (no fused
// multiply-add), so the sign bit (set when the dot is >= 0) is bit-exact with the CPU's.
#pragma once

namespace kvq::cuda::detail {

/// S as the encoders read it: column-major, columns[j * m + i] = S_ij (consecutive rows i are consecutive floats,
/// so the threads of a warp, one row each, load a coalesced line per coordinate).
struct SketchView {
  const float* columns = nullptr;
  int m = 0;  ///< rows
};

/// (S v)_i for the d coordinates v(j) (doubles).
template <class Coordinate>
__device__ double sketch_row_dot(const SketchView& s, int i, int d, Coordinate v) {
  const float* col = s.columns + i;
  double a0 = 0, a1 = 0, a2 = 0, a3 = 0;
  int j = 0;
  for (; j + 4 <= d; j += 4) {
    a0 = __dadd_rn(a0, __dmul_rn(static_cast<double>(__ldg(col + (j + 0) * s.m)), v(j + 0)));
    a1 = __dadd_rn(a1, __dmul_rn(static_cast<double>(__ldg(col + (j + 1) * s.m)), v(j + 1)));
    a2 = __dadd_rn(a2, __dmul_rn(static_cast<double>(__ldg(col + (j + 2) * s.m)), v(j + 2)));
    a3 = __dadd_rn(a3, __dmul_rn(static_cast<double>(__ldg(col + (j + 3) * s.m)), v(j + 3)));
  }
  for (; j < d; ++j) a0 = __dadd_rn(a0, __dmul_rn(static_cast<double>(__ldg(col + j * s.m)), v(j)));
  return __dadd_rn(__dadd_rn(a0, a1), __dadd_rn(a2, a3));
}

}  // namespace kvq::cuda::detail

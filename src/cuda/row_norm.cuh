// A token's norm in the append kernels, as the CPU encoders take it: sum_j v_j^2 in double in coordinate order
// (each square and sum rounded on its own), then sqrt. One thread per row; each lane of a warp runs one step behind
// the previous, so that rows of consecutive tokens (which start in one shared-memory bank when d is a multiple of
// 32) are read in distinct banks: in step s lane l reads coordinate s - l.
#pragma once

namespace kvq::cuda::detail {

/// ||row|| of the d elements of `row` (floats or doubles, widened exactly).
template <class Element>
__device__ double row_norm(const Element* row, int d) {
  const int lag = static_cast<int>(threadIdx.x) & 31;
  double sum = 0;
  for (int step = 0; step < d + lag; ++step) {
    const int j = step - lag;
    if (j < 0) continue;
    const double v = static_cast<double>(row[j]);
    sum = __dadd_rn(sum, __dmul_rn(v, v));
  }
  return sqrt(sum);
}

}  // namespace kvq::cuda::detail

// The norm ||x|| of the codecs that store one per token (turbo_mse, turbo_prod, turbo_rvq, qjl), summed in the
// order of a warp: partial sum l of coordinates l, l + 32, l + 64, ... in turn, then the 32 partials by halves
// (partial l += partial l + 16, then + 8, ... + 1), every square and sum rounded to double on its own. The CUDA
// append kernels (src/cuda/row_norm.cuh) take the same sums in the same order, four lanes to a row, so the stored
// norms are bit-identical; a sum in coordinate order would take one thread per row (three quarters of a block idle)
// and chain d dependent additions.
#pragma once

#include <cmath>

namespace kvq {

/// Partial sums of a norm: a warp's lanes.
constexpr int kNormLanes = 32;

/// ||v|| of the d elements of v (floats or doubles, widened exactly), in the order above; d may be any size (the
/// partials past d are zero).
template <class Element>
double lane_norm(const Element* v, int d) {
  double partial[kNormLanes] = {};
  for (int j = 0; j < d; ++j) {
    const double x = static_cast<double>(v[j]);
    partial[j % kNormLanes] += x * x;
  }
  for (int half = kNormLanes / 2; half > 0; half /= 2)
    for (int l = 0; l < half; ++l) partial[l] += partial[l + half];
  return std::sqrt(partial[0]);
}

}  // namespace kvq

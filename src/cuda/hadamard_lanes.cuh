// The randomized Hadamard transform of one token row held by a warp, in registers: lane l holds the row's elements
// [l E, (l + 1) E), E = max(1, d / 32), so d / E lanes take part. It runs the CPU's fast transform
// (src/rotation/hadamard.cpp) stage by stage, strides 1, 2, ..., d / 2, every element of a stage the rounded a + b
// (lower) or a - b (upper) of the same two floats, so the result is bit-identical with the CPU's: strides below E
// within a lane, the others between lanes l and l ^ (stride / E), exchanged by `partner` (the device: a warp
// shuffle; the CPU tests: 32 host threads in lockstep, tests/hadamard_lanes_test.cpp).
#pragma once

#include "cuda/encode_layout.cuh"
#include "cuda/float_rn.cuh"
#include "cuda/unroll.cuh"

namespace kvq::cuda::detail {

/// A stage between lanes l and l ^ m gives the lower lane a + b (its own value plus the other's) and the upper lane
/// a - b (the other's minus its own): both are side * own + other with side = +1 or -1, one fma whose product is
/// exact, so rounded once as the CPU's sum and difference (signed zeros included), with no select between the two.
KVQ_ENCODE_HD float exchange_side(int lane, int m) { return (lane & m) != 0 ? -1.0f : 1.0f; }

/// y = H diag(signs) x * scale for R rows at once: row r's elements [lane E, (lane + 1) E) are v[r], and the lane's
/// E signs are already loaded (sign[k] = signs[lane E + k]; any value at lanes >= `lanes`). The rows' butterflies
/// are interleaved (independent work between a stage's exchanges); each element goes through the operations of
/// hadamard_row_lanes (below) in the same order, so every row's result is the same. lanes = d / E; every lane of the
/// warp calls it (`partner(value, m)`: lane ^ m's value, m < lanes), lanes at or beyond `lanes` with values that are
/// ignored.
template <int E, int R, class Partner>
KVQ_ENCODE_HD void hadamard_rows_lanes(float (&v)[R][E], const float (&sign)[E], float scale, int lane, int lanes,
                                       const Partner& partner) {
  if (lane < lanes) {
KVQ_UNROLL
    for (int r = 0; r < R; ++r)
KVQ_UNROLL
      for (int k = 0; k < E; ++k) v[r][k] = mul_rn(v[r][k], sign[k]);
  }
KVQ_UNROLL
  for (int h = 1; h < E; h <<= 1)
KVQ_UNROLL
    for (int i = 0; i < E; i += 2 * h)
KVQ_UNROLL
      for (int j = i; j < i + h; ++j)
KVQ_UNROLL
        for (int r = 0; r < R; ++r) {
          const float a = v[r][j], b = v[r][j + h];
          v[r][j] = add_rn(a, b);
          v[r][j + h] = sub_rn(a, b);
        }
  for (int m = 1; m < lanes; m <<= 1) {  // stride m E
    const float side = exchange_side(lane, m);
KVQ_UNROLL
    for (int r = 0; r < R; ++r)
KVQ_UNROLL
      for (int k = 0; k < E; ++k) v[r][k] = fma_rn(side, v[r][k], partner(v[r][k], m));
  }
KVQ_UNROLL
  for (int r = 0; r < R; ++r)
KVQ_UNROLL
    for (int k = 0; k < E; ++k) v[r][k] = mul_rn(v[r][k], scale);
}

/// y = H diag(signs) x * scale for the row whose elements [lane E, (lane + 1) E) are v, as the CPU computes it.
/// lanes = d / E; every lane of the warp calls it (`partner(value, m)`: lane ^ m's value, m < lanes), lanes at or
/// beyond `lanes` with values that are ignored.
template <int E, class Partner>
KVQ_ENCODE_HD void hadamard_row_lanes(float (&v)[E], const float* signs, float scale, int lane, int lanes,
                                      const Partner& partner) {
  if (lane < lanes) {
KVQ_UNROLL
    for (int k = 0; k < E; ++k) v[k] = mul_rn(v[k], signs[lane * E + k]);
  }
KVQ_UNROLL
  for (int h = 1; h < E; h <<= 1)
KVQ_UNROLL
    for (int i = 0; i < E; i += 2 * h)
KVQ_UNROLL
      for (int j = i; j < i + h; ++j) {
        const float a = v[j], b = v[j + h];
        v[j] = add_rn(a, b);
        v[j + h] = sub_rn(a, b);
      }
  for (int m = 1; m < lanes; m <<= 1) {  // stride m E
    const float side = exchange_side(lane, m);
KVQ_UNROLL
    for (int k = 0; k < E; ++k) v[k] = fma_rn(side, v[k], partner(v[k], m));
  }
KVQ_UNROLL
  for (int k = 0; k < E; ++k) v[k] = mul_rn(v[k], scale);
}

}  // namespace kvq::cuda::detail

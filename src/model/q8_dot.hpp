// Dot products of weight rows stored in ggml block formats with activations quantized to 8 bits (q8_activations.hpp),
// in integer arithmetic: per block of 32 elements, the sum of weight codes times activation codes is an exact
// integer; only the block's scales are applied in float. One kernel table per instruction set (q8_dot_scalar.cpp,
// the plain reference; q8_dot_avx2.cpp; q8_dot_avx512.cpp with AVX512-VNNI), chosen at run time in q8_dot.cpp.
//
// What a kernel computes, for a row of B blocks of 32 (k-quants: B / 8 super-blocks), with i_b the exact integer
// sum over block b (or sub-block) of weight code times activation code, d_b / s_b the activation scale and sum:
//   Q4_0   sum_b w_d (d_b i_b - 8 s_b)                 (codes 0..15)
//   Q4_1   sum_b w_d d_b i_b + w_m s_b
//   Q8_0   sum_b w_d d_b i_b
//   Q4_K   sum_s d sc_s d_b i_s - dmin m_s s_b          (sub-blocks of 32: one per activation block)
//   Q6_K   sum_b d d_b sum_{g in b} sc_g i_g            (sub-blocks g of 16, codes minus 32)
// equal, up to float rounding, to sum_j W_j x^_j with W the dequantized row and x^_j = d_b c_j.
#pragma once

#include <cstddef>
#include <cstdint>

#include "attention/isa.hpp"
#include "kvq/detail/ggml_quants.hpp"
#include "model/q8_activations.hpp"

namespace kvq::detail {

/// Activation rows a kernel of Q8Kernels::rows takes at once.
constexpr int kQ8Rows = 4;

/// out[r] = sum_j W_j x^_{r,j} over a row of `blocks` x 32 elements, for the activation rows x[0 .. R): the
/// weight row (its ggml blocks) is read once for all of them.
using Q8RowDot = void (*)(const uint8_t* row, const Q8Row* x, size_t blocks, float* out);

/// Weight rows a kernel of Q8Kernels::weight_rows takes at once (a decode step: one activation row).
constexpr int kQ8WeightRows = 4;

/// out[k] = sum_j W_kj x^_j for the kQ8WeightRows rows W_k at row + k * row_bytes: the activation codes are read
/// once for all of them, and each row's sums are the ones `one` computes, in the same order (equal results).
using Q8WeightRowsDot = void (*)(const uint8_t* row, size_t row_bytes, const Q8Row& x, size_t blocks, float* out);

/// The kernels of one format: for R = 1 and R = kQ8Rows activation rows, and for kQ8WeightRows weight rows with
/// one activation row (null where a format has none: `one` row by row).
struct Q8Kernels {
  Q8RowDot one = nullptr, rows = nullptr;
  Q8WeightRowsDot weight_rows = nullptr;
  explicit operator bool() const { return one != nullptr; }
};

/// The kernels of one instruction set.
struct Q8DotTable {
  Q8Kernels q4_0, q4_1, q8_0, q4_k, q6_k;
};

extern const Q8DotTable kQ8DotScalar;
extern const Q8DotTable kQ8DotAvx2;
extern const Q8DotTable kQ8DotAvx512Vnni;

/// Whether `isa` has vector kernels. Where it has none (scalar, NEON) the runner keeps the fp32 path, whose loops
/// are vectorized: the scalar kernels are the tests' reference, not meant to be fast.
bool q8_vectorized(Isa isa);

/// The kernels for `type` at `isa` (AVX-512 without VNNI takes AVX2's, NEON the scalar ones); empty for a type no
/// kernel takes (F32, F16, BF16, Q5_0, Q5_1, Q5_K: the float path).
Q8Kernels q8_kernels(GgmlType type, Isa isa);

}  // namespace kvq::detail

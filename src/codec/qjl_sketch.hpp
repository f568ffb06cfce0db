// The QJL sketch (arXiv 2406.03482): an m x d matrix S of independent N(0, 1) entries. A vector k is stored as the
// m sign bits of S k and its norm; for any q,
//     E[ sqrt(pi/2) / m * ||k|| * <S q, sign(S k)> ] = <q, k>,
// with variance at most (pi/2) / m * ||q||^2 ||k||^2. Shared by qjl and turbo_prod (which sketches a residual).
//
// Sign bits follow bitpack.hpp: bit i is bit (i % 8) of byte i / 8, set when (S k)_i >= 0 (sign +1).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace kvq {

class QjlSketch {
 public:
  /// S drawn row by row from Rng(seed); dim a multiple of 8 (the codecs' head dimensions are of 16).
  QjlSketch(int rows, int dim, uint64_t seed);

  int rows() const { return rows_; }
  int dim() const { return dim_; }
  /// sqrt(pi/2) / m: the estimator's scale.
  float scale() const { return scale_; }

  /// y = S x for n rows (n x dim in, n x rows out), accumulated in double.
  void apply(const float* x, float* y, size_t n) const;
  /// x = S^T y for n rows (n x rows in, n x dim out), accumulated in double.
  void apply_transpose(const float* y, float* x, size_t n) const;
  /// The sign bits of S x for one vector x (dim doubles) into rows / 8 bytes.
  void sign_bits(const double* x, uint8_t* bits) const;

 private:
  int rows_, dim_;
  float scale_;
  std::vector<float> s_;  // rows x dim, row-major
};

/// Sign i of a sign-bit stream: +1 when bit i is set, else -1.
inline bool sign_bit(const uint8_t* bits, int i) { return (bits[i >> 3] >> (i & 7)) & 1; }

/// sum_i sign_i v_i over m signs, m a multiple of 8 (eight partial sums, one per bit of a byte).
inline float signed_sum(const uint8_t* bits, const float* v, int m) {
  float s[8] = {};
  for (int i = 0; i < m; i += 8) {
    const unsigned byte = bits[i >> 3];
    for (int k = 0; k < 8; ++k) s[k] += (byte >> k) & 1u ? v[i + k] : -v[i + k];
  }
  return ((s[0] + s[1]) + (s[2] + s[3])) + ((s[4] + s[5]) + (s[6] + s[7]));
}

/// y_i = a sign_i over m signs (a token decoded into the sketch space).
inline void decode_signs(const uint8_t* bits, float a, int m, float* y) {
  for (int i = 0; i < m; ++i) y[i] = sign_bit(bits, i) ? a : -a;
}

/// y_i += a sign_i over m signs (a weighted token accumulated in the sketch space).
inline void add_signs(const uint8_t* bits, float a, int m, float* y) {
  for (int i = 0; i < m; ++i) y[i] += sign_bit(bits, i) ? a : -a;
}

}  // namespace kvq

// Quotients by a divisor that many elements share, with no division per element. With y = RN(1 / b) formed once,
// q = RN(a y), the residual r = a - q b (exact: one fma) and RN(q + r y) is RN(a / b), what an IEEE division gives
// (Markstein's theorem: y within half an ulp of 1 / b and q within an ulp of a / b), where no step under- or
// overflows: three instructions for a division's nine and its slow-path branch. The int8/int4 encoder divides by the
// trained lambda_c and by each group's fp16 scale so, kivi by each range's fp16 step; tests/exact_quotient_test.cpp
// checks each form against the division on the host.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>

#include "cuda/float_rn.cuh"
#include "cuda/unroll.cuh"

namespace kvq::cuda::detail {

/// A divisor b with y = RN(1 / b), or y = NaN where b lies outside [2^-16, 2^16] (every quotient by it then takes
/// the division).
struct Divisor {
  float b, y;
};

KVQ_ENCODE_HD Divisor divisor_of(float b) {
  const bool in_range = b >= 0x1p-16f && b <= 0x1p16f;
  return {b, in_range ? div_rn(1.0f, b) : __builtin_nanf("")};
}

/// q + r y of the comment above: RN(a / b) wherever b lies in [2^-16, 2^16] and |a / b| >= 2^-70 (a y and r
/// normal, r exact), up to the overflow: where RN(a / b) overflows so does the sum (inf, as the division), and
/// where the product a y alone overflows the sum is NaN.
KVQ_ENCODE_HD float corrected_quotient(float a, const Divisor& d) {
  const float q = mul_rn(a, d.y);
  return fma_rn(fma_rn(-q, d.b, a), d.y, q);
}

/// Whether a corrected quotient c is the division's: |c| >= 2^-64, one compare. A quotient below 2^-70 gives a c
/// below 2^-68 (within a few ulps where no step underflows, at most about 3 |a / b| where one does), a divisor out
/// of range (y = NaN) or an overflowing product gives NaN: false for those, and for zeros and non-finite a.
KVQ_ENCODE_HD bool exact_range(float c) {
#if defined(__CUDA_ARCH__)
  return fabsf(c) >= 0x1p-64f;
#else
  return std::fabs(c) >= 0x1p-64f;
#endif
}

/// v[k] = RN(v[k] / d(k)) for N elements of a lane (Divisor d(int k)): the corrected quotients, their ranges
/// checked together (a compare each, one branch), and only where one falls outside its exact range (rare: zeros,
/// tiny or non-finite quotients) the divisions.
template <int N, class D>
KVQ_ENCODE_HD void divide(float (&v)[N], const D& d) {
  float c[N];
  bool exact = true;
KVQ_UNROLL
  for (int k = 0; k < N; ++k) {
    c[k] = corrected_quotient(v[k], d(k));
    exact &= exact_range(c[k]);
  }
  if (!exact) {
KVQ_UNROLL
    for (int k = 0; k < N; ++k) c[k] = div_rn(v[k], d(k).b);
  }
KVQ_UNROLL
  for (int k = 0; k < N; ++k) v[k] = c[k];
}

/// rounded_code_bits' y for a group's or range's scale s: RN(1 / s), or 0 where s = 0.
KVQ_ENCODE_HD float code_inverse(float s) { return s > 0 ? div_rn(1.0f, s) : 0.0f; }

/// clamp(rint(RN(v / s)), lo, hi) as the CPU codes an element (v / s in float, nearbyint: ties to even), for an
/// fp16 scale s > 0 with y = RN(1 / s), or 0 where s = y = 0; lo <= 0 <= hi integers within 2^22, v finite with
/// |v| <= 2^100 s (the encoders': |v| <= (qmax + 1/2) s, or kivi's 0 <= v <= levels s). The corrected quotient is
/// RN(v / s) wherever |v / s| >= 1/4 (y lies in [2^-16, 2^24], v in no subnormal range), and within a few ulps of
/// it, so below 1/2, where |v / s| < 1/4; it rounds to the CPU's integer. The clamped value plus 1.5 * 2^23 rounds
/// to that integer (ties to even: 1.5 * 2^23 is even) and holds it in the low bits: returns those bits, the
/// integer's two's complement in the low 22 (mask them to the code's bits).
KVQ_ENCODE_HD uint32_t rounded_code_bits(float v, float s, float y, float lo, float hi) {
  const float c = corrected_quotient(v, Divisor{s, y});
#if defined(__CUDA_ARCH__)
  return __float_as_uint(__fadd_rn(fminf(fmaxf(c, lo), hi), 0x1.8p23f));
#else
  const float r = add_rn(std::fmin(std::fmax(c, lo), hi), 0x1.8p23f);
  uint32_t bits;
  std::memcpy(&bits, &r, sizeof bits);
  return bits;
#endif
}

}  // namespace kvq::cuda::detail

// x / norm rounded to double, then to float, for a float x (the unit vectors of the turbo codecs), from a product
// by 1 / norm instead of a division: the CUDA append kernels take the reciprocal once per token and a multiply per
// coordinate (a double division is a long sequence of instructions). Plain C++ that nvcc also compiles for the
// device; the CPU encoders keep the division, which this reproduces bit for bit (tests/unit_quotient_test.cpp).
//
// Why it is exact. Let y = x / norm (norm > 0 finite) and inverse = RN(1 / norm). Then x * inverse = y (1 + e) with
// |e| <= 2^-53 < ulp(y) / |y|, so the double q = RN(x * inverse) is less than 1.5 ulp(y) from y and RN(y) is within
// 2 ulps of q. Rounding to float decides at the midpoints between floats: in a binade of normal floats, the doubles
// whose low 29 significand bits are 2^28 (2^28 ulps from the powers of two, so q, y and RN(y) near one share its
// binade). Where q's low bits are more than 4 from 2^28, no midpoint lies within 4 ulps of q, so RN(y) and q round
// to the same float; q nearer a midpoint, or below the normal floats (whose midpoints lie elsewhere; also q = 0),
// takes the division. Both checks are needed: tests/unit_quotient_test.cpp fails without either.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define KVQ_QUOTIENT_HD __host__ __device__ __forceinline__
#else
#define KVQ_QUOTIENT_HD inline
#endif

namespace kvq {

/// float(double(x) / norm) for norm > 0 finite, given inverse = 1 / norm rounded to nearest.
KVQ_QUOTIENT_HD float unit_quotient(float x, double norm, double inverse) {
#if defined(__CUDA_ARCH__)
  const double q = __dmul_rn(static_cast<double>(x), inverse);
  const auto bits = static_cast<uint64_t>(__double_as_longlong(q));
#else
  const double q = static_cast<double>(x) * inverse;
  uint64_t bits;
  std::memcpy(&bits, &q, sizeof bits);
#endif
  constexpr uint32_t kMidpoint = 1u << 28, kMargin = 4, kLowMask = (1u << 29) - 1;
  constexpr uint32_t kFloatMinExponent = 1023 - 126;  // biased double exponent of the smallest normal float
  const uint32_t low = static_cast<uint32_t>(bits) & kLowMask;
  const uint32_t exponent = static_cast<uint32_t>(bits >> 52) & 0x7ff;
  if (low - (kMidpoint - kMargin) <= 2 * kMargin || exponent < kFloatMinExponent) {
#if defined(__CUDA_ARCH__)
    return __double2float_rn(__ddiv_rn(static_cast<double>(x), norm));
#else
    return static_cast<float>(static_cast<double>(x) / norm);
#endif
  }
#if defined(__CUDA_ARCH__)
  return __double2float_rn(q);
#else
  return static_cast<float>(q);
#endif
}

}  // namespace kvq

// The fast attention kernels' queries in fixed point (docs/METHODS.md, "Fast attention kernels"): q_c ~ S sum_k D_k
// B^(Digits-1-k) with signed digits of Bits bits (B = 2^Bits; 8 unless a kernel's products need smaller ones), the
// top one in [-(B/2 - 1), B/2 - 1], the others in [-B/2, B/2 - 1]. One definition
// for the CPU's kernels (fused_kernel.hpp) and the CUDA decode kernel's integer path (decode_kernel.cuh), so that both
// round a query alike; plain C++ that nvcc also compiles for the device.
#pragma once

#include <cfloat>
#include <cstdint>

// Internal linkage on the host: the CPU kernels' translation units each compile these with their own instruction set
// (kernels_avx2.cpp, kernels_avx512*.cpp), and one inline definition shared by all of them would let the linker keep
// a copy with AVX-512 instructions for the AVX2 kernels too.
#if defined(__CUDACC__)
#define KVQ_DIGITS_HD __host__ __device__ __forceinline__
#else
#define KVQ_DIGITS_HD static inline
#endif

namespace kvq::detail {

/// The largest |q_c / S|: the top digit at B/2 - 1 (8-bit digits: Digits = 2: 32512, 3: 8323072).
template <int Digits, int Bits = 8>
constexpr int32_t kDigitsMax = ((1 << (Bits - 1)) - 1) << (Bits * (Digits - 1));

/// S for a query whose largest |q_c| is amax: amax / kDigitsMax, or 1 for a query too small for a normal S (amax
/// below FLT_MIN x kDigitsMax, about 4e-34 for two digits): q / S would overflow to inf, an undefined conversion;
/// with S = 1 every digit rounds to zero, so its scores are zero to float precision.
template <int Digits, int Bits = 8>
KVQ_DIGITS_HD float digit_scale(float amax) {
  constexpr float kMax = static_cast<float>(kDigitsMax<Digits, Bits>);
  return amax >= FLT_MIN * kMax ? amax / kMax : 1.0f;
}

/// The digits of q (|q| <= amax) at scale S = digit_scale(amax): v = q / S rounded half away from zero, then the
/// low digits in [-B/2, B/2 - 1] from the bottom, the top one what remains (digit[0] = floor((v + B/2) / B) for two).
template <int Digits, int Bits = 8>
KVQ_DIGITS_HD void query_digits(float q, float scale, int32_t (&digit)[Digits]) {
  constexpr int32_t base = 1 << Bits, half = base / 2;
  const float x = q / scale;  // |x| <= kDigitsMax
  int32_t rest = static_cast<int32_t>(x < 0 ? x - 0.5f : x + 0.5f);
  for (int k = Digits - 1; k > 0; --k) {
    digit[k] = ((rest + half) & (base - 1)) - half;
    rest = (rest - digit[k]) / base;
  }
  digit[0] = rest;
}

}  // namespace kvq::detail

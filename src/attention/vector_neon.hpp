// The NEON (AArch64 Advanced SIMD) vector traits of fused_kernel.hpp: 4 fp32 lanes, 32 registers. Baseline armv8-a:
// every AArch64 CPU runs them. Compiled only into kernels_neon.cpp. Internal linkage: see kernel_args.hpp.
#pragma once

#include <arm_neon.h>

#include <cstdint>
#include <limits>

namespace kvq::detail {
namespace {

struct Neon {
  // 32 registers: 16 accumulators and 8 queries per pass leave room for the operands.
  static constexpr int W = 4, kAccumulators = 16, kMaxQ = 8;
  static constexpr bool kVnni = false;
  using F = float32x4_t;
  using I = int32x4_t;

  static F zero() { return vdupq_n_f32(0.0f); }
  static F set1(float x) { return vdupq_n_f32(x); }
  static F load(const float* p) { return vld1q_f32(p); }
  static void store(float* p, F x) { vst1q_f32(p, x); }
  static F fma(F a, F b, F c) { return vfmaq_f32(c, a, b); }
  static F fma1(F a, const float* b, F c) { return vfmaq_n_f32(c, a, *b); }
  static F mul(F a, F b) { return vmulq_f32(a, b); }
  static F add(F a, F b) { return vaddq_f32(a, b); }
  static F sub(F a, F b) { return vsubq_f32(a, b); }
  static F max(F a, F b) { return vmaxq_f32(a, b); }
  // Byte loads: blocks carry no alignment promise, and a uint16_t load would claim one.
  static F load_f16(const uint8_t* p) { return vcvt_f32_f16(vreinterpret_f16_u8(vld1_u8(p))); }
  static I load_i(const uint8_t* p) { return vreinterpretq_s32_u8(vld1q_u8(p)); }
  // Sign to bit 31, exponent and mantissa to bits 27..13 (bits 30..28 and 12..0 cleared): the fp32 bits of h 2^-112.
  static void f16_split(const uint8_t* p, F& even, F& odd) {
    const I x = load_i(p), mask = vdupq_n_s32(static_cast<int32_t>(0x8FFFE000u));
    even = vreinterpretq_f32_s32(vandq_s32(vshrq_n_s32(vshlq_n_s32(x, 16), 3), mask));
    odd = vreinterpretq_f32_s32(vandq_s32(vshrq_n_s32(x, 3), mask));
  }

  // Element J of a lane (Bits wide, two's complement): shifted to the top, shifted back arithmetically, converted.
  template <int Bits, int J>
  static F element(I x) {
    if constexpr ((J + 1) * Bits == 32) {
      return vcvtq_f32_s32(vshrq_n_s32(x, 32 - Bits));
    } else {
      return vcvtq_f32_s32(vshrq_n_s32(vshlq_n_s32(x, 32 - (J + 1) * Bits), 32 - Bits));
    }
  }

  // The same element, unsigned: shifted back logically (kivi codes).
  template <int Bits, int J>
  static F uelement(I x) {
    const uint32x4_t u = vreinterpretq_u32_s32(x);
    if constexpr ((J + 1) * Bits == 32) {
      return vcvtq_f32_u32(vshrq_n_u32(u, 32 - Bits));
    } else {
      return vcvtq_f32_u32(vshrq_n_u32(vshlq_n_u32(u, 32 - (J + 1) * Bits), 32 - Bits));
    }
  }
  // The top three bits of each lane (a kivi:3 code, joined there by kivi3_code), unsigned, converted.
  static F top3(I x) { return vcvtq_f32_u32(vshrq_n_u32(vreinterpretq_u32_s32(x), 29)); }

  // Lane-code decoding (turbo_mse): logical shifts, a bit select, and a 16-entry table lookup by the low 4 bits
  // (one 64-byte table lookup of the entry's four bytes).
  template <int N>
  static I shr(I x) {
    if constexpr (N == 0) {
      return x;
    } else {
      return vreinterpretq_s32_u32(vshrq_n_u32(vreinterpretq_u32_s32(x), N));
    }
  }
  template <int N>
  static I shl(I x) {
    if constexpr (N == 0) {
      return x;
    } else {
      return vshlq_n_s32(x, N);
    }
  }
  static I select_bits(I a, I b, uint32_t mask) {  // a where mask is set, else b
    return vbslq_s32(vdupq_n_u32(mask), a, b);
  }
  struct Table {
    uint8x16x4_t bytes;
  };
  static Table load_table(const float* t16) {
    const uint8_t* p = reinterpret_cast<const uint8_t*>(t16);
    return {{vld1q_u8(p), vld1q_u8(p + 16), vld1q_u8(p + 32), vld1q_u8(p + 48)}};
  }
  static F lookup(const Table& t, I idx) {
    // Byte k of lane i reads table byte 4 (idx_i & 15) + k.
    const uint32x4_t base = vshlq_n_u32(vandq_u32(vreinterpretq_u32_s32(idx), vdupq_n_u32(15)), 2);
    const uint32x4_t bytes = vaddq_u32(vmulq_n_u32(base, 0x01010101u), vdupq_n_u32(0x03020100u));
    return vreinterpretq_f32_u8(vqtbl4q_u8(t.bytes, vreinterpretq_u8_u32(bytes)));
  }

  // Sign bits (turbo_prod): a lane mask of bit R (all ones where set), and a broadcast added under it.
  using Mask = uint32x4_t;
  template <int R>
  static Mask test_bit(I x) {
    return vtstq_u32(vreinterpretq_u32_s32(x), vdupq_n_u32(1u << R));
  }
  static F add_masked(F acc, Mask k, const float* b) {
    return vaddq_f32(acc, vreinterpretq_f32_u32(vandq_u32(k, vreinterpretq_u32_f32(vdupq_n_f32(*b)))));
  }

  static float hmax(F x) { return vmaxvq_f32(x); }
  static float hsum(F x) { return vaddvq_f32(x); }
  static float first(F x) { return vgetq_lane_f32(x, 0); }

  // Cephes' expf, as in the AVX-512 traits; 2^n built in the exponent field (n >= -126 after the clamp).
  static F exp(F x) {
    const uint32x4_t tiny = vcltq_f32(x, vdupq_n_f32(-87.3365f));
    x = vminq_f32(vmaxq_f32(x, vdupq_n_f32(-87.3365f)), vdupq_n_f32(88.0f));
    const F n = vrndnq_f32(vmulq_f32(x, vdupq_n_f32(1.44269504088896341f)));
    F r = vfmsq_f32(x, n, vdupq_n_f32(0.693359375f));
    r = vfmsq_f32(r, n, vdupq_n_f32(-2.12194440e-4f));
    F p = vdupq_n_f32(1.9875691500e-4f);
    p = vfmaq_f32(vdupq_n_f32(1.3981999507e-3f), p, r);
    p = vfmaq_f32(vdupq_n_f32(8.3334519073e-3f), p, r);
    p = vfmaq_f32(vdupq_n_f32(4.1665795894e-2f), p, r);
    p = vfmaq_f32(vdupq_n_f32(1.6666665459e-1f), p, r);
    p = vfmaq_f32(vdupq_n_f32(5.0000001201e-1f), p, r);
    p = vaddq_f32(vfmaq_f32(r, p, vmulq_f32(r, r)), vdupq_n_f32(1.0f));
    const I e = vshlq_n_s32(vaddq_s32(vcvtq_s32_f32(n), vdupq_n_s32(127)), 23);
    const F y = vmulq_f32(p, vreinterpretq_f32_s32(e));
    return vreinterpretq_f32_u32(vbicq_u32(vreinterpretq_u32_f32(y), tiny));
  }

  static F mask_tail(F x, int n) {
    const float lane[4] = {0, 1, 2, 3};
    const uint32x4_t keep = vcltq_f32(vld1q_f32(lane), vdupq_n_f32(static_cast<float>(n)));
    return vbslq_f32(keep, x, vdupq_n_f32(-std::numeric_limits<float>::infinity()));
  }

  // 4 vectors v[t] -> lane t = sum of v[t]: two levels of pairwise adds.
  static F transpose_sum(const float* v) {
    const F s01 = vpaddq_f32(load(v), load(v + 4)), s23 = vpaddq_f32(load(v + 8), load(v + 12));
    return vpaddq_f32(s01, s23);
  }

  static void prefetch(const uint8_t* p) { __builtin_prefetch(p, 0, 2); }  // PRFM PLDL2KEEP
};

}  // namespace
}  // namespace kvq::detail

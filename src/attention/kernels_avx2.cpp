// The fused kernels for AVX2 + FMA + F16C: 8 fp32 lanes, 16 registers. This file alone is compiled with those flags.
#include "attention/kernel_args.hpp"

#if defined(__x86_64__)
#include <immintrin.h>

#include "attention/fused_kernel.hpp"
#include "attention/low_bits_table.hpp"

namespace kvq::detail {
namespace {

struct Avx2 {
  static constexpr int W = 8, kAccumulators = 8, kMaxQ = 4;
  static constexpr bool kVnni = false;
  using F = __m256;
  using I = __m256i;

  static F zero() { return _mm256_setzero_ps(); }
  static F set1(float x) { return _mm256_set1_ps(x); }
  static F load(const float* p) { return _mm256_loadu_ps(p); }
  static void store(float* p, F x) { _mm256_storeu_ps(p, x); }
  static F fma(F a, F b, F c) { return _mm256_fmadd_ps(a, b, c); }
  static F fma1(F a, const float* b, F c) { return _mm256_fmadd_ps(a, _mm256_broadcast_ss(b), c); }
  static F mul(F a, F b) { return _mm256_mul_ps(a, b); }
  static F add(F a, F b) { return _mm256_add_ps(a, b); }
  static F sub(F a, F b) { return _mm256_sub_ps(a, b); }
  static F max(F a, F b) { return _mm256_max_ps(a, b); }
  static F load_f16(const uint8_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
  static I load_i(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
  // Sign to bit 31, exponent and mantissa to bits 27..13 (bits 30..28 and 12..0 cleared): the fp32 bits of h 2^-112.
  static void f16_split(const uint8_t* p, F& even, F& odd) {
    const I x = load_i(p), mask = _mm256_set1_epi32(static_cast<int>(0x8FFFE000u));
    even = _mm256_castsi256_ps(_mm256_and_si256(_mm256_srai_epi32(_mm256_slli_epi32(x, 16), 3), mask));
    odd = _mm256_castsi256_ps(_mm256_and_si256(_mm256_srai_epi32(x, 3), mask));
  }

  // Element J of a lane (Bits wide, two's complement) as a float. Codes of at most 2 bits: shifted down and looked up
  // by vpermps, which reads only the low 3 bits of each index, in a table whose entry i holds the value of i's low
  // Bits bits (two operations). Wider codes: shifted to the top, shifted back arithmetically, converted (three).
  template <int Bits, int J, bool Signed = true>
  static F element(I x) {
    if constexpr (Bits <= 2) {
      return _mm256_permutevar8x32_ps(low_bits_table<Bits, Signed>(), shr<J * Bits>(x));
    } else {
      const I top = (J + 1) * Bits == 32 ? x : _mm256_slli_epi32(x, 32 - (J + 1) * Bits);
      return _mm256_cvtepi32_ps(Signed ? _mm256_srai_epi32(top, 32 - Bits) : _mm256_srli_epi32(top, 32 - Bits));
    }
  }
  // The same element, unsigned.
  template <int Bits, int J>
  static F uelement(I x) {
    return element<Bits, J, false>(x);
  }
  // Entry i: the value of i's low Bits bits, signed (two's complement) or not.
  template <int Bits, bool Signed>
  static F low_bits_table() {
    static constexpr auto kTable = low_bits_values<Bits, Signed, 8>();
    return _mm256_load_ps(kTable.value);
  }
  // The top three bits of each lane (a kivi:3 code, joined there by kivi3_code), unsigned, converted.
  static F top3(I x) { return _mm256_cvtepi32_ps(_mm256_srli_epi32(x, 29)); }

  // Lane-code decoding (turbo_mse): logical shifts, a bit select and a 16-entry table lookup by the low 4 bits (two
  // 8-entry permutes, chosen by bit 3).
  template <int N>
  static I shr(I x) {
    return N == 0 ? x : _mm256_srli_epi32(x, N);
  }
  template <int N>
  static I shl(I x) {
    return N == 0 ? x : _mm256_slli_epi32(x, N);
  }
  static I select_bits(I a, I b, uint32_t mask) {  // a where mask is set, else b
    const I m = _mm256_set1_epi32(static_cast<int>(mask));
    return _mm256_or_si256(_mm256_and_si256(m, a), _mm256_andnot_si256(m, b));
  }
  struct Table {
    F low, high;
  };
  static Table load_table(const float* t16) { return {_mm256_loadu_ps(t16), _mm256_loadu_ps(t16 + 8)}; }
  static F lookup(const Table& t, I idx) {
    const F high = _mm256_castsi256_ps(_mm256_slli_epi32(idx, 28));
    return _mm256_blendv_ps(_mm256_permutevar8x32_ps(t.low, idx), _mm256_permutevar8x32_ps(t.high, idx), high);
  }

  // Sign bits (turbo_prod): a lane mask of bit R (all ones where set), and a broadcast added under it.
  using Mask = F;
  template <int R>
  static Mask test_bit(I x) {
    const I bit = _mm256_set1_epi32(static_cast<int>(1u << R));
    return _mm256_castsi256_ps(_mm256_cmpeq_epi32(_mm256_and_si256(x, bit), bit));
  }
  static F add_masked(F acc, Mask k, const float* b) {
    return _mm256_add_ps(acc, _mm256_and_ps(k, _mm256_broadcast_ss(b)));
  }

  static float hmax(F x) {
    __m128 m = _mm_max_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    m = _mm_max_ps(m, _mm_movehl_ps(m, m));
    return _mm_cvtss_f32(_mm_max_ss(m, _mm_movehdup_ps(m)));
  }
  static float hsum(F x) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(x), _mm256_extractf128_ps(x, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    return _mm_cvtss_f32(_mm_add_ss(s, _mm_movehdup_ps(s)));
  }
  static float first(F x) { return _mm256_cvtss_f32(x); }

  // Cephes' expf, as in the AVX-512 traits; 2^n built in the exponent field (n >= -126 after the clamp).
  static F exp(F x) {
    const F tiny = _mm256_cmp_ps(x, _mm256_set1_ps(-87.3365f), _CMP_LT_OQ);
    x = _mm256_min_ps(_mm256_max_ps(x, _mm256_set1_ps(-87.3365f)), _mm256_set1_ps(88.0f));
    const F n = _mm256_round_ps(_mm256_mul_ps(x, _mm256_set1_ps(1.44269504088896341f)),
                                _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    F r = _mm256_fnmadd_ps(n, _mm256_set1_ps(0.693359375f), x);
    r = _mm256_fnmadd_ps(n, _mm256_set1_ps(-2.12194440e-4f), r);
    F p = _mm256_set1_ps(1.9875691500e-4f);
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
    p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
    p = _mm256_add_ps(_mm256_fmadd_ps(p, _mm256_mul_ps(r, r), r), _mm256_set1_ps(1.0f));
    const I e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(n), _mm256_set1_epi32(127)), 23);
    return _mm256_andnot_ps(tiny, _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
  }

  static F mask_tail(F x, int n) {
    const F keep = _mm256_cmp_ps(_mm256_setr_ps(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_ps(static_cast<float>(n)),
                                 _CMP_LT_OQ);
    return _mm256_blendv_ps(_mm256_set1_ps(-std::numeric_limits<float>::infinity()), x, keep);
  }

  // 8 vectors v[t] -> lane t = sum of v[t]: 128-bit halves paired, then two horizontal adds.
  static F transpose_sum(const float* v) {
    F w[4];
    for (int k = 0; k < 4; ++k) {  // [P(2k) 4 lanes | P(2k+1) 4 lanes]
      const F a = load(v + 16 * k), b = load(v + 16 * k + 8);
      w[k] = _mm256_add_ps(_mm256_permute2f128_ps(a, b, 0x20), _mm256_permute2f128_ps(a, b, 0x31));
    }
    // hadd within 128-bit halves: half 0 holds tokens 0, 2, 4, 6; half 1 tokens 1, 3, 5, 7
    const F z = _mm256_hadd_ps(_mm256_hadd_ps(w[0], w[1]), _mm256_hadd_ps(w[2], w[3]));
    return _mm256_permutevar8x32_ps(z, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
  }

  static void prefetch(const uint8_t* p) { _mm_prefetch(reinterpret_cast<const char*>(p), _MM_HINT_T1); }
};

// The fast kernel's int4 keys by 8-bit integer dot products (fused_kernel.hpp, kVnni), two digits per query: per 8
// tokens x 8 channels, query and digit, two vpmaddubsw (u8 codes x s8 digits, pairs summed in int16: at most
// 2 x 15 x 128 each, so the sum of both stays far from saturation), a vpaddw, a vpmaddwd by ones into int32 and a
// vpaddd; the FMA path takes 8 FMAs and 8 broadcasts.
struct Avx2Dot : Avx2 {
  static constexpr bool kVnni = true;

  static I zero_i() { return _mm256_setzero_si256(); }
  static I xor_i(I x, uint32_t k) { return _mm256_xor_si256(x, _mm256_set1_epi32(static_cast<int>(k))); }
  static I and_i(I x, uint32_t k) { return _mm256_and_si256(x, _mm256_set1_epi32(static_cast<int>(k))); }
  static I srl4(I x) { return _mm256_srli_epi32(x, 4); }
  static I sll8(I x) { return _mm256_slli_epi32(x, 8); }
  static I add_i(I x, I y) { return _mm256_add_epi32(x, y); }
  static I sub_i(I x, const int32_t* k) { return _mm256_sub_epi32(x, _mm256_set1_epi32(*k)); }
  static F cvt(I x) { return _mm256_cvtepi32_ps(x); }
  static I dpbusd2(I acc, I u0, const int8_t* s0, I u1, const int8_t* s1) {
    const I p = _mm256_add_epi16(_mm256_maddubs_epi16(u0, broadcast4(s0)), _mm256_maddubs_epi16(u1, broadcast4(s1)));
    return _mm256_add_epi32(acc, _mm256_madd_epi16(p, _mm256_set1_epi16(1)));
  }

  // turbo_mse keys (key_scores_turbo_int): level bytes up to 255 against 6-bit query digits in [-32, 31], so that
  // dpbusd2's two pairs of products sum within int16 (|4 x 255 x 32| = 32640 <= 32767); 8-bit digits would reach
  // 2 x 255 x 128 = 65280 in one pair and saturate. The 16 level bytes in both 128-bit lanes.
  static constexpr int kLevelDigitBits = 6;
  static I load_bytes16(const uint8_t* p) {
    return _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static I shuffle_bytes(I table, I idx) { return _mm256_shuffle_epi8(table, idx); }

  // kivi keys (key_scores_kivi_int): |x| (the sign bit cleared), and 16 channels of w as two 8-bit digits of
  // v = w inv rounded to nearest (ties to even), inv = 1 / S: out[0..15] the top digits and out[16..31] the low ones,
  // each placed by the shuffle order (byte p takes channel order[p]). The codes are at most 15, so 8-bit digits stay
  // within dpbusd2's int16 sums (4 x 15 x 128). The packs interleave the 128-bit halves: the top digits of channels
  // 0-3, 8-11, the low ones of 0-3, 8-11 | the same of 4-7, 12-15; one permute puts them in channel order.
  static F abs(F x) { return _mm256_and_ps(x, _mm256_castsi256_ps(_mm256_set1_epi32(0x7FFFFFFF))); }
  static void kivi_digits(const float* w, float inv, const uint8_t* order, int8_t* out) {
    const F s = _mm256_set1_ps(inv);
    const I r0 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(w), s));
    const I r1 = _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(w + 8), s));
    const I half = _mm256_set1_epi32(128), byte = _mm256_set1_epi32(255);
    const I b0 = _mm256_add_epi32(r0, half), b1 = _mm256_add_epi32(r1, half);
    const I low0 = _mm256_sub_epi32(_mm256_and_si256(b0, byte), half);
    const I low1 = _mm256_sub_epi32(_mm256_and_si256(b1, byte), half);
    const I top = _mm256_packs_epi32(_mm256_srai_epi32(b0, 8), _mm256_srai_epi32(b1, 8));
    const I packed = _mm256_packs_epi16(top, _mm256_packs_epi32(low0, low1));
    const I bytes = _mm256_permutevar8x32_epi32(packed, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
    const I shuffle = _mm256_broadcastsi128_si256(_mm_load_si128(reinterpret_cast<const __m128i*>(order)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), _mm256_shuffle_epi8(bytes, shuffle));
  }

 private:
  static I broadcast4(const int8_t* s8x4) {
    int32_t b;
    __builtin_memcpy(&b, s8x4, 4);
    return _mm256_set1_epi32(b);
  }
};

}  // namespace

namespace avx2 {
KernelFn fused_kernel(BlockFormat key, BlockFormat value) { return fused_kernel_for<Avx2>(key, value); }

// int4 keys with two digits per query, as AVX512-VNNI's (int8 codes as unsigned bytes would saturate vpmaddubsw's
// int16 pairs); turbo_mse:1..3 keys with two 6-bit digits (Avx2Dot::kLevelDigitBits), as AVX512-VNNI's; kivi keys
// with two 8-bit digits of the scaled query, as AVX512-VNNI's.
KernelFn fast_kernel(BlockFormat key, BlockFormat value) {
  using F = BlockFormat;
  switch (key) {
    case F::int4:
      return fused_kernel_with_keys<Avx2Dot, F::int4, 2>(value);
    case F::turbo1:
      return fused_kernel_with_keys<Avx2Dot, F::turbo1, 2>(value);
    case F::turbo2:
      return fused_kernel_with_keys<Avx2Dot, F::turbo2, 2>(value);
    case F::turbo3:
      return fused_kernel_with_keys<Avx2Dot, F::turbo3, 2>(value);
    case F::kivi2:
      return fused_kernel_with_keys<Avx2Dot, F::kivi2, 2>(value);
    case F::kivi3:
      return fused_kernel_with_keys<Avx2Dot, F::kivi3, 2>(value);
    case F::kivi4:
      return fused_kernel_with_keys<Avx2Dot, F::kivi4, 2>(value);
    default:
      return nullptr;
  }
}
}  // namespace avx2
}  // namespace kvq::detail

#else

namespace kvq::detail::avx2 {
KernelFn fused_kernel(BlockFormat, BlockFormat) { return nullptr; }
KernelFn fast_kernel(BlockFormat, BlockFormat) { return nullptr; }
}  // namespace kvq::detail::avx2

#endif

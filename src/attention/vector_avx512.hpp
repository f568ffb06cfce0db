// The AVX-512 vector traits of fused_kernel.hpp (16 fp32 lanes), shared by the AVX-512 translation units and
// compiled only there. Internal linkage: see kernel_args.hpp.
#pragma once

// GCC 12's AVX-512 intrinsics start from _mm512_undefined_*(), which -Wmaybe-uninitialized and -Wuninitialized flag
// wherever they are inlined (GCC bug 105593).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include <immintrin.h>

#include <cstdint>
#include <limits>

#include "attention/low_bits_table.hpp"

namespace kvq::detail {
namespace {

struct Avx512 {
  static constexpr int W = 16, kAccumulators = 16, kMaxQ = 8;
  static constexpr bool kVnni = false;
  using F = __m512;
  using I = __m512i;

  static F zero() { return _mm512_setzero_ps(); }
  static F set1(float x) { return _mm512_set1_ps(x); }
  static F load(const float* p) { return _mm512_loadu_ps(p); }
  static void store(float* p, F x) { _mm512_storeu_ps(p, x); }
  static F fma(F a, F b, F c) { return _mm512_fmadd_ps(a, b, c); }
  static F fma1(F a, const float* b, F c) { return _mm512_fmadd_ps(a, _mm512_set1_ps(*b), c); }
  static F mul(F a, F b) { return _mm512_mul_ps(a, b); }
  static F add(F a, F b) { return _mm512_add_ps(a, b); }
  static F sub(F a, F b) { return _mm512_sub_ps(a, b); }
  static F max(F a, F b) { return _mm512_max_ps(a, b); }
  static F load_f16(const uint8_t* p) {
    return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)));
  }
  static I load_i(const uint8_t* p) { return _mm512_loadu_si512(p); }
  // Sign to bit 31, exponent and mantissa to bits 27..13 (bits 30..28 and 12..0 cleared): the fp32 bits of h 2^-112.
  static void f16_split(const uint8_t* p, F& even, F& odd) {
    const I x = _mm512_loadu_si512(p), mask = _mm512_set1_epi32(static_cast<int>(0x8FFFE000u));
    even = _mm512_castsi512_ps(_mm512_and_si512(_mm512_srai_epi32(_mm512_slli_epi32(x, 16), 3), mask));
    odd = _mm512_castsi512_ps(_mm512_and_si512(_mm512_srai_epi32(x, 3), mask));
  }

  // Element J of a lane (Bits wide, two's complement) as a float. Codes of at most 4 bits: shifted down and looked
  // up by vpermps, which reads only the low 4 bits of each index, in a table whose entry i holds the value of i's
  // low Bits bits (two operations, where shifting up, back down and converting takes three, all on Intel's port 0
  // beside an FMA). Wider codes: shifted to the top, shifted back arithmetically, converted.
  template <int Bits, int J, bool Signed = true>
  static F element(I x) {
    if constexpr (Bits <= 4) {
      return _mm512_permutexvar_ps(shr<J * Bits>(x), low_bits_table<Bits, Signed>());
    } else {
      const I top = (J + 1) * Bits == 32 ? x : _mm512_slli_epi32(x, 32 - (J + 1) * Bits);
      return _mm512_cvtepi32_ps(Signed ? _mm512_srai_epi32(top, 32 - Bits) : _mm512_srli_epi32(top, 32 - Bits));
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
    static constexpr auto kTable = low_bits_values<Bits, Signed, 16>();
    return _mm512_load_ps(kTable.value);
  }
  // The top three bits of each lane (a kivi:3 code, joined there by kivi3_code), unsigned, converted.
  static F top3(I x) { return _mm512_cvtepi32_ps(_mm512_srli_epi32(x, 29)); }

  // Lane-code decoding (turbo_mse): logical shifts, a bit select and a 16-entry table lookup by the low 4 bits.
  template <int N>
  static I shr(I x) {
    return N == 0 ? x : _mm512_srli_epi32(x, N);
  }
  template <int N>
  static I shl(I x) {
    return N == 0 ? x : _mm512_slli_epi32(x, N);
  }
  static I select_bits(I a, I b, uint32_t mask) {  // a where mask is set, else b
    return _mm512_ternarylogic_epi32(_mm512_set1_epi32(static_cast<int>(mask)), a, b, 0xCA);
  }
  using Table = F;
  static Table load_table(const float* t16) { return _mm512_loadu_ps(t16); }
  static F lookup(const Table& t, I idx) { return _mm512_permutexvar_ps(idx, t); }
  // Sign bits (turbo_prod): a lane mask of bit R, and a broadcast added under it (the add pipes, not the FMA pipes).
  using Mask = __mmask16;
  template <int R>
  static Mask test_bit(I x) {
    return _mm512_test_epi32_mask(x, _mm512_set1_epi32(static_cast<int>(1u << R)));
  }
  static F add_masked(F acc, Mask k, const float* b) { return _mm512_mask_add_ps(acc, k, acc, _mm512_set1_ps(*b)); }

  static float hmax(F x) { return _mm512_reduce_max_ps(x); }
  static float hsum(F x) { return _mm512_reduce_add_ps(x); }
  static float first(F x) { return _mm512_cvtss_f32(x); }

  // Cephes' expf: x = n ln2 + r, |r| <= ln2 / 2, a degree-7 polynomial for e^r, times 2^n.
  static F exp(F x) {
    const __mmask16 tiny = _mm512_cmp_ps_mask(x, _mm512_set1_ps(-87.3365f), _CMP_LT_OQ);
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.3365f)), _mm512_set1_ps(88.0f));
    const F n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                     _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    F r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
    F p = _mm512_set1_ps(1.9875691500e-4f);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
    p = _mm512_add_ps(_mm512_fmadd_ps(p, _mm512_mul_ps(r, r), r), _mm512_set1_ps(1.0f));
    return _mm512_maskz_mov_ps(static_cast<__mmask16>(~tiny), _mm512_scalef_ps(p, n));
  }

  static F mask_tail(F x, int n) {
    const __mmask16 keep = n <= 0 ? 0 : n >= 16 ? 0xFFFF : static_cast<__mmask16>((1u << n) - 1);
    return _mm512_mask_blend_ps(keep, _mm512_set1_ps(-std::numeric_limits<float>::infinity()), x);
  }

  // 16 vectors v[t] -> lane t = sum of v[t]: four levels of halving, each pairing two vectors' halves.
  static F transpose_sum(const float* v) {
    F w[8], x[4], y[2];
    for (int k = 0; k < 8; ++k) {  // [P(2k) 8 lanes | P(2k+1) 8 lanes]
      const F a = load(v + 32 * k), b = load(v + 32 * k + 16);
      w[k] = _mm512_add_ps(_mm512_shuffle_f32x4(a, b, 0x44), _mm512_shuffle_f32x4(a, b, 0xEE));
    }
    for (int k = 0; k < 4; ++k)  // 128-bit block j: 4 lanes of token 4k + j
      x[k] = _mm512_add_ps(_mm512_shuffle_f32x4(w[2 * k], w[2 * k + 1], 0x88),
                           _mm512_shuffle_f32x4(w[2 * k], w[2 * k + 1], 0xDD));
    for (int k = 0; k < 2; ++k)  // block j: 2 lanes of token 8k + j, 2 of token 8k + 4 + j
      y[k] = _mm512_add_ps(_mm512_shuffle_ps(x[2 * k], x[2 * k + 1], 0x44),
                           _mm512_shuffle_ps(x[2 * k], x[2 * k + 1], 0xEE));
    // block j: tokens j, 4 + j, 8 + j, 12 + j
    const F z = _mm512_add_ps(_mm512_shuffle_ps(y[0], y[1], 0x88), _mm512_shuffle_ps(y[0], y[1], 0xDD));
    return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), z);
  }

  static void prefetch(const uint8_t* p) { _mm_prefetch(reinterpret_cast<const char*>(p), _MM_HINT_T1); }
};

}  // namespace
}  // namespace kvq::detail

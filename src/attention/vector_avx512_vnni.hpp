// The AVX512-VNNI vector traits of fused_kernel.hpp: the AVX-512 ones and the integer operations of int keys by
// 8-bit dot products. Shared by the VNNI and BF16 translation units and compiled only there. Internal linkage: see
// kernel_args.hpp.
#pragma once

#include "attention/vector_avx512.hpp"

namespace kvq::detail {
namespace {

struct Avx512Vnni : Avx512 {
  static constexpr bool kVnni = true;

  static I zero_i() { return _mm512_setzero_si512(); }
  static I xor_i(I x, uint32_t k) { return _mm512_xor_si512(x, _mm512_set1_epi32(static_cast<int>(k))); }
  static I and_i(I x, uint32_t k) { return _mm512_and_si512(x, _mm512_set1_epi32(static_cast<int>(k))); }
  static I srl4(I x) { return _mm512_srli_epi32(x, 4); }
  static I sll8(I x) { return _mm512_slli_epi32(x, 8); }
  static I add_i(I x, I y) { return _mm512_add_epi32(x, y); }
  static I sub_i(I x, const int32_t* k) { return _mm512_sub_epi32(x, _mm512_set1_epi32(*k)); }
  static F cvt(I x) { return _mm512_cvtepi32_ps(x); }
  // acc += per 32-bit lane, the 4 products of its u8 bytes with the 4 s8 at s8x4. GCC 12 hoists the broadcast into
  // a register (a vpbroadcastd per dot product); an asm form with the broadcast in the memory operand ({1to16})
  // measured no faster.
  static I dpbusd(I acc, I u8, const int8_t* s8x4) {
    int32_t b;
    __builtin_memcpy(&b, s8x4, 4);
    return _mm512_dpbusd_epi32(acc, u8, _mm512_set1_epi32(b));
  }
  static I dpbusd2(I acc, I u0, const int8_t* s0, I u1, const int8_t* s1) {
    return dpbusd(dpbusd(acc, u0, s0), u1, s1);
  }

  // turbo_mse keys (fused_kernel.hpp, key_scores_turbo_int): 8-bit query digits against full-range level bytes (the
  // products sum in int32); the 16 level bytes in every 128-bit lane, looked up by each byte's low 4 bits.
  static constexpr int kLevelDigitBits = 8;
  static I load_bytes16(const uint8_t* p) {
    return _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)));
  }
  static I shuffle_bytes(I table, I idx) { return _mm512_shuffle_epi8(table, idx); }

  // kivi keys (key_scores_kivi_int): |x| (the sign bit cleared), and 16 channels of w as two 8-bit digits of
  // v = w inv rounded to nearest (ties to even), inv = 1 / S: out[0..15] the top digits (v + 128) >> 8 and out[16..31]
  // the low ones, v's low byte as a signed byte (vpmovdb truncates), each placed by the shuffle order (byte p takes
  // channel order[p]).
  static F abs(F x) { return _mm512_abs_ps(x); }
  static void kivi_digits(const float* w, float inv, const uint8_t* order, int8_t* out) {
    const I r = _mm512_cvtps_epi32(_mm512_mul_ps(_mm512_loadu_ps(w), _mm512_set1_ps(inv)));
    const I top = _mm512_srai_epi32(_mm512_add_epi32(r, _mm512_set1_epi32(128)), 8);
    const __m256i bytes = _mm256_set_m128i(_mm512_cvtepi32_epi8(r), _mm512_cvtepi32_epi8(top));
    const __m256i shuffle = _mm256_broadcastsi128_si256(_mm_load_si128(reinterpret_cast<const __m128i*>(order)));
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out), _mm256_shuffle_epi8(bytes, shuffle));
  }
};

}  // namespace
}  // namespace kvq::detail

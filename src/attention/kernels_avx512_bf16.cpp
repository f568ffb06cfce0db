// The fast kernels for AVX-512 with VNNI and BF16: int4 values summed by bf16 dot products (fused_kernel.hpp,
// values_int4_bf16), with int4 or int8 keys scored as in kernels_avx512_vnni.cpp's fast kernels, or f16 keys as in
// kernels_avx512.cpp; kivi values summed alike (values_kivi_bf16) with kivi keys scored as in
// kernels_avx512_vnni.cpp's fast kernels; turbo_mse values alike (values_turbo_bf16) with turbo_mse or int4 keys
// scored as there (turbo_mse:4 keys exact). This file alone is compiled with those flags. It has no exact kernels:
// select_page_kernel falls back to avx512vnni's, and to its fast ones for the other pairs.
#include "attention/kernel_args.hpp"

#if defined(__x86_64__)
#include "attention/fused_kernel.hpp"
#include "attention/vector_avx512_vnni.hpp"

namespace kvq::detail {
namespace {

struct Avx512Bf16 : Avx512Vnni {
  // 16 tokens in the pair order of values_int4_bf16 (E = 8: per 8 tokens 0 4 1 5 2 6 3 7) and values_kivi_bf16 (E =
  // 16 for kivi:2 and kivi:3's 2-bit tiles: 0 8 1 9 .. 7 15; E = 8 for kivi:4).
  template <int E>
  static F tile_pairs(F x) {
    static_assert(E == 8 || E == 16, "tiles of 8 or 16 tokens");
    if constexpr (E == 8) {
      return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7, 8, 12, 9, 13, 10, 14, 11, 15), x);
    } else {
      return _mm512_permutexvar_ps(_mm512_setr_epi32(0, 8, 1, 9, 2, 10, 3, 11, 4, 12, 5, 13, 6, 14, 7, 15), x);
    }
  }
  // 32 bf16, rounded to nearest: lo's 16 lanes, then hi's.
  static I to_bf16(F lo, F hi) { return reinterpret_cast<I>(_mm512_cvtne2ps_pbh(hi, lo)); }
  static void store_i(uint32_t* p, I x) { _mm512_storeu_si512(p, x); }
  static I bf16_ones() { return _mm512_set1_epi32(0x3F803F80); }
  // turbo_mse values: the 16 levels as bf16 (to nearest) in 16-bit lanes 0..15, looked up by 16-bit lanes' indices.
  static I bf16_table(const float* t16) {
    return reinterpret_cast<I>(_mm512_cvtne2ps_pbh(_mm512_setzero_ps(), _mm512_loadu_ps(t16)));
  }
  static I lookup16(I table, I idx) { return _mm512_permutexvar_epi16(idx, table); }
  // (x & mask) ^ flip as two operations beside the dot products: GCC would join them into a vpternlogd, which on
  // Zen 4 takes a slot of the FMA pipes that the dot products use.
  static I and_xor(I x, uint32_t mask, uint32_t flip) {
    I masked = _mm512_and_si512(x, _mm512_set1_epi32(static_cast<int>(mask)));
    asm("" : "+v"(masked));
    return _mm512_xor_si512(masked, _mm512_set1_epi32(static_cast<int>(flip)));
  }
  // acc + per lane the dot product of its two bf16 in a with those in b (products exact, fp32 adds).
  static F dpbf16(F acc, I a, I b) {
    return _mm512_dpbf16_ps(acc, reinterpret_cast<__m512bh>(a), reinterpret_cast<__m512bh>(b));
  }
  // The same with b one pair broadcast from memory: in the instruction's memory operand ({1to16}), where GCC 12
  // would keep a vpbroadcastd per dot product.
  static F dpbf16_1(F acc, I a, const uint32_t* pair) {
    asm("vdpbf16ps %[pair]%{1to16%}, %[a], %[acc]" : [acc] "+v"(acc) : [a] "v"(a), [pair] "m"(*pair));
    return acc;
  }
};

}  // namespace

namespace avx512bf16 {
namespace {
// kivi values by bf16 dot products with kivi keys K scored by two digits per query.
template <BlockFormat K>
KernelFn kivi_values(BlockFormat value) {
  using F = BlockFormat;
  return value == F::kivi2   ? attend<Avx512Bf16, K, F::kivi2, 2, true>
         : value == F::kivi3 ? attend<Avx512Bf16, K, F::kivi3, 2, true>
                             : attend<Avx512Bf16, K, F::kivi4, 2, true>;
}
// turbo_mse values by bf16 dot products with keys K (KeyDigits: 2 for the fast integer scores, 3 exact).
template <BlockFormat K, int KeyDigits>
KernelFn turbo_values(BlockFormat value) {
  using F = BlockFormat;
  return value == F::turbo1   ? attend<Avx512Bf16, K, F::turbo1, KeyDigits, true>
         : value == F::turbo2 ? attend<Avx512Bf16, K, F::turbo2, KeyDigits, true>
         : value == F::turbo3 ? attend<Avx512Bf16, K, F::turbo3, KeyDigits, true>
                              : attend<Avx512Bf16, K, F::turbo4, KeyDigits, true>;
}
}  // namespace

// int4 values with the fast int keys (two digits per query) or f16 keys; kivi values with the fast kivi keys;
// turbo_mse values with turbo_mse or int4 keys; every other pair is avx512vnni's.
KernelFn fast_kernel(BlockFormat key, BlockFormat value) {
  using F = BlockFormat;
  if (is_kivi(value)) {  // with kivi keys, whose scores are avx512vnni's fast ones
    switch (key) {
      case F::kivi2:
        return kivi_values<F::kivi2>(value);
      case F::kivi3:
        return kivi_values<F::kivi3>(value);
      case F::kivi4:
        return kivi_values<F::kivi4>(value);
      default:
        return nullptr;
    }
  }
  if (is_turbo(value)) {  // with turbo_mse keys (1..3 by two digits per query, 4 exact) or int4 keys
    switch (key) {
      case F::turbo1:
        return turbo_values<F::turbo1, 2>(value);
      case F::turbo2:
        return turbo_values<F::turbo2, 2>(value);
      case F::turbo3:
        return turbo_values<F::turbo3, 2>(value);
      case F::turbo4:
        return turbo_values<F::turbo4, 3>(value);
      case F::int4:
        return turbo_values<F::int4, 2>(value);
      default:
        return nullptr;
    }
  }
  if (value != BlockFormat::int4) return nullptr;
  if (key == BlockFormat::f16) return attend<Avx512Bf16, BlockFormat::f16, BlockFormat::int4, 3, true>;
  if (key == BlockFormat::int4) return attend<Avx512Bf16, BlockFormat::int4, BlockFormat::int4, 2, true>;
  if (key == BlockFormat::int8) return attend<Avx512Bf16, BlockFormat::int8, BlockFormat::int4, 2, true>;
  return nullptr;
}
}  // namespace avx512bf16
}  // namespace kvq::detail

#else

namespace kvq::detail::avx512bf16 {
KernelFn fast_kernel(BlockFormat, BlockFormat) { return nullptr; }
}  // namespace kvq::detail::avx512bf16

#endif

// Byte layouts of every codec's block, in one header shared by the C++ kernels and (later) the CUDA kernels.
//
// A block holds T tokens of one head. Blocks are structure-of-arrays: each section (codes, scales, norms, ...)
// starts at a 16-byte aligned offset inside the block, so that SIMD loads of a section never straddle it.
// Blocks themselves carry no alignment promise: multi-byte fields are read with memcpy (or aligned loads where the
// cache guarantees 64-byte aligned blocks). All multi-byte fields are little-endian; fp16 means IEEE binary16.
// Each layout gives its size formula, its bits per element, and a static_assert at d = 128, T = 64.
#pragma once

#include <cstddef>

namespace kvq::layout {

constexpr size_t align16(size_t n) { return (n + 15) & ~size_t{15}; }

// ---- f32 / f16 / bf16 ------------------------------------------------------------------------------------------
// [T x d values], token-major. 32 / 16 / 16 bits per element.
struct Float {
  size_t d, T, width;  // width: 4 or 2 bytes
  constexpr size_t block_bytes() const { return T * d * width; }
};
static_assert(Float{128, 64, 2}.block_bytes() == 16384);

// ---- int8 / int4 (group absmax) ----------------------------------------------------------------------------------
// Rotated space x' = R x, per-channel scale lambda_c (codec state, default 1), x''_c = x'_c / lambda_c. Per token
// and group of G consecutive channels: s = max|x''| / qmax in fp16 (nearest, up where needed), q = round(x'' / s)
// clamped to [-qmax, qmax] (qmax 127 / 7). Reconstruction (rotated space): lambda_c * s * q.
//   [codes: T tokens x d, token-major. int8: one two's-complement byte per element. int4: q + 8 (offset-by-8,
//    1..15) in a nibble, element 2i of a token in the low nibble of its byte i (the bitpack.hpp convention)]
//   [scales: T tokens x d/G groups, fp16, token-major]
// Bits per element: bits + 16/G. d=128: int4 G=16/32/64 -> 5 / 4.5 / 4.25, int8 G=16/32/64 -> 9 / 8.5 / 8.25.
struct IntGroup {
  size_t d, T, bits, G;  // bits: 4 or 8; G divides d
  constexpr size_t token_code_bytes() const { return d * bits / 8; }
  constexpr size_t groups() const { return d / G; }  // per token
  constexpr size_t scales_offset() const { return align16(T * token_code_bytes()); }
  constexpr size_t block_bytes() const { return scales_offset() + 2 * T * groups(); }
};
static_assert(IntGroup{128, 64, 4, 32}.block_bytes() == 4608);  // 4.5 bits per element
static_assert(IntGroup{128, 64, 4, 16}.block_bytes() == 5120);  // 5
static_assert(IntGroup{128, 64, 8, 32}.block_bytes() == 8704);  // 8.5


// ---- kivi ------------------------------------------------------------------------------------------------------
// Asymmetric b-bit codes (b = 2 or 4) with an fp16 minimum m and scale s: x ~ m + s * q, q in [0, 2^b - 1].
// Keys: one (m, s) per channel over the tokens of the block. Values: one (m, s) per token and group of G channels.
//   [codes: T tokens x d, token-major, b-bit indices packed LSB-first (bitpack.hpp: element 4i+j of a token at
//    bits 2j..2j+1 of its byte i for b = 2, element 2i in the low nibble for b = 4)]
//   [mins: P fp16]  [scales: P fp16]   with P = d (keys, channel order) or T x d/G (values, token-major)
// Bits per element: keys b + 32/T (d=128, T=64: kivi:2 2.5, kivi:4 4.5); values b + 32/G (G=32: 3 and 5).
struct Kivi {
  size_t d, T, bits, G;  // G: the value group size (keys ignore it)
  bool key;
  constexpr size_t token_code_bytes() const { return d * bits / 8; }
  constexpr size_t param_count() const { return key ? d : T * (d / G); }
  constexpr size_t mins_offset() const { return align16(T * token_code_bytes()); }
  constexpr size_t scales_offset() const { return mins_offset() + align16(2 * param_count()); }
  constexpr size_t block_bytes() const { return scales_offset() + 2 * param_count(); }
};
static_assert(Kivi{128, 64, 2, 32, true}.block_bytes() == 2560);   // 2.5 bits per element
static_assert(Kivi{128, 64, 2, 32, false}.block_bytes() == 3072);  // 3
static_assert(Kivi{128, 64, 4, 32, false}.block_bytes() == 5120);  // 5


// ---- turbo_mse / turbo_prod / qjl / turbo_rvq ------------------------------------------------------------------


// ---- vecinfer --------------------------------------------------------------------------------------------------


}  // namespace kvq::layout

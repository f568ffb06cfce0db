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
//   [codes]
//     int8: T tokens x d, token-major, one two's-complement byte per element.
//     int4: q in two's-complement nibbles (q & 15; a shift left then an arithmetic shift right of the lane gives
//       it back), arranged for the attention kernels in 64-byte tiles of 16 little-endian 32-bit lanes of 8 nibbles
//       each (nibble j at bits 4j..4j+3 of its lane):
//       keys, "tokens in lanes": tile (a, k) holds tokens 16a..16a+15 x channels 8k..8k+7, lane l = token 16a + l,
//         nibble j = channel 8k + j; tile (a, k) at byte 64 (a d/8 + k). One 64-byte load: 16 tokens x 8 channels.
//       values, "channels in lanes": tile (a, k) holds tokens 8a..8a+7 x channels 16k..16k+15, lane l = channel
//         16k + l, nibble j = token 8a + j; tile (a, k) at byte 64 (a d/16 + k). One load: 8 tokens x 16 channels.
//       The tiles cover T rounded up to 16 (keys) or 8 (values) tokens; the padding tokens are zero bytes.
//   [scales: fp16, in tiles of 16 tokens: [T/16 rounded up][d/G groups][16 tokens] (scores and weights of 16
//    tokens of one group are one vector); padding tokens 0]
// Bits per element (T a multiple of 16): bits + 16/G. d=128: int4 G=16/32/64 -> 5 / 4.5 / 4.25, int8 G=16/32/64 ->
// 9 / 8.5 / 8.25.
struct IntGroup {
  size_t d, T, bits, G;  // bits: 4 or 8; G divides d
  bool key;              // int4 codes are laid out differently for keys and values
  constexpr size_t groups() const { return d / G; }  // per token
  constexpr size_t scale_tokens() const { return (T + 15) / 16 * 16; }
  constexpr size_t code_tokens() const { return bits == 8 ? T : key ? scale_tokens() : (T + 7) / 8 * 8; }
  constexpr size_t scales_offset() const { return align16(code_tokens() * d * bits / 8); }
  constexpr size_t block_bytes() const { return scales_offset() + 2 * scale_tokens() * groups(); }
  /// The byte holding the code of token t, channel c (int4: the nibble at bit code_shift(t, c)).
  constexpr size_t code_byte(size_t t, size_t c) const {
    if (bits == 8) return t * d + c;
    if (key) return 64 * (t / 16 * (d / 8) + c / 8) + 4 * (t % 16) + c % 8 / 2;
    return 64 * (t / 8 * (d / 16) + c / 16) + 4 * (c % 16) + t % 8 / 2;
  }
  constexpr unsigned code_shift(size_t t, size_t c) const {
    return bits == 8 ? 0 : 4 * static_cast<unsigned>(key ? c % 2 : t % 2);
  }
  /// The int4 code in the nibble of `byte` at bit `shift`: -8..7 (the codec writes -7..7).
  static constexpr int int4_code(unsigned byte, unsigned shift) { return static_cast<int>(((byte >> shift) & 15) ^ 8) - 8; }
  /// The byte offset of the fp16 scale of token t, group g.
  constexpr size_t scale_byte(size_t t, size_t g) const {
    return scales_offset() + 2 * ((t / 16 * groups() + g) * 16 + t % 16);
  }
};
static_assert(IntGroup{128, 64, 4, 32, true}.block_bytes() == 4608);   // 4.5 bits per element
static_assert(IntGroup{128, 64, 4, 32, false}.block_bytes() == 4608);  // 4.5
static_assert(IntGroup{128, 64, 4, 16, true}.block_bytes() == 5120);   // 5
static_assert(IntGroup{128, 64, 8, 32, true}.block_bytes() == 8704);   // 8.5


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

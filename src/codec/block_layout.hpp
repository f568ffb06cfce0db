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
//   [codes: q in two's complement (a byte, or a nibble q & 15), arranged for the attention kernels in 64-byte tiles
//    of 16 little-endian 32-bit lanes of E = 32 / bits elements each (element j at bits j bits .. (j + 1) bits - 1;
//    a shift left then an arithmetic shift right of the lane gives it back):
//     keys, "tokens in lanes": tile (a, k) holds tokens 16a..16a+15 x channels Ek..Ek+E-1, lane l = token 16a + l,
//       element j = channel Ek + j; tile (a, k) at byte 64 (a d/E + k). One 64-byte load: 16 tokens x E channels.
//     values, "channels in lanes": tile (a, k) holds tokens Ea..Ea+E-1 x channels 16k..16k+15, lane l = channel
//       16k + l, element j = token Ea + j; tile (a, k) at byte 64 (a d/16 + k). One load: E tokens x 16 channels.
//     The tiles cover T rounded up to 16 (keys) or E (values) tokens; the padding tokens are zero bytes.]
//   [scales: fp16, in tiles of 16 tokens: [T/16 rounded up][d/G groups][16 tokens] (scores and weights of 16
//    tokens of one group are one vector); padding tokens 0]
// Bits per element (T a multiple of 16): bits + 16/G. d=128: int4 G=16/32/64 -> 5 / 4.5 / 4.25, int8 G=16/32/64 ->
// 9 / 8.5 / 8.25.
struct IntGroup {
  size_t d, T, bits, G;  // bits: 4 or 8 (kivi's code planes also 1 and 2); G divides d
  bool key;              // keys and values are tiled differently
  constexpr size_t groups() const { return d / G; }  // per token
  constexpr size_t lane_elements() const { return 32 / bits; }  // E
  constexpr size_t scale_tokens() const { return (T + 15) / 16 * 16; }
  constexpr size_t code_tokens() const {
    return key ? scale_tokens() : (T + lane_elements() - 1) / lane_elements() * lane_elements();
  }
  constexpr size_t scales_offset() const { return align16(code_tokens() * d * bits / 8); }
  constexpr size_t block_bytes() const { return scales_offset() + 2 * scale_tokens() * groups(); }
  /// The byte holding the code of token t, channel c (int4: the nibble at bit code_shift(t, c)).
  constexpr size_t code_byte(size_t t, size_t c) const {
    const size_t E = lane_elements();
    if (key) return 64 * (t / 16 * (d / E) + c / E) + 4 * (t % 16) + c % E * bits / 8;
    return 64 * (t / E * (d / 16) + c / 16) + 4 * (c % 16) + t % E * bits / 8;
  }
  constexpr unsigned code_shift(size_t t, size_t c) const {
    return static_cast<unsigned>((key ? c : t) % lane_elements() * bits % 8);
  }
  /// The code stored at bit `shift` of `byte`: -8..7 (int4) or -128..127 (int8); the codec writes +-qmax.
  constexpr int code(unsigned byte, unsigned shift) const {
    const unsigned mask = (1u << bits) - 1, sign = 1u << (bits - 1);
    return static_cast<int>(((byte >> shift) & mask) ^ sign) - static_cast<int>(sign);
  }
  /// The byte offset of the fp16 scale of token t, group g.
  constexpr size_t scale_byte(size_t t, size_t g) const {
    return scales_offset() + 2 * ((t / 16 * groups() + g) * 16 + t % 16);
  }
};
static_assert(IntGroup{128, 64, 4, 32, true}.block_bytes() == 4608);   // 4.5 bits per element
static_assert(IntGroup{128, 64, 4, 32, false}.block_bytes() == 4608);  // 4.5
static_assert(IntGroup{128, 64, 4, 16, true}.block_bytes() == 5120);   // 5
static_assert(IntGroup{128, 64, 8, 32, true}.block_bytes() == 8704);   // 8.5
static_assert(IntGroup{128, 64, 8, 32, false}.block_bytes() == 8704);  // 8.5


// ---- kivi ------------------------------------------------------------------------------------------------------
// Asymmetric b-bit codes (b = 2, 3 or 4) with an fp16 minimum m and scale s: x ~ m + s * q, q in [0, 2^b - 1].
// Keys: one (m, s) per channel over the tokens of the block. Values: one (m, s) per token and group of G channels.
//   [codes: unsigned b-bit q in the 64-byte tiles of IntGroup, E = 32 / b codes a 32-bit lane (element j at bits
//    j b .. (j + 1) b - 1; a shift left then a logical shift right gives it back): keys "tokens in lanes" (16
//    tokens x E channels a tile), values "channels in lanes" (E tokens x 16 channels a tile); the tiles cover T
//    rounded up to 16 (keys) or E (values) tokens, the padding codes zero.
//    b = 3: two planes one after the other, each in those tiles: the low two bits of q as kivi:2's codes (E = 16),
//    then the high bit as a 1-bit code (E = 32: keys 16 tokens x 32 channels a tile, so d a multiple of 32; values
//    32 tokens x 16 channels), both planes covering T rounded up to 16 (keys) or 32 (values) tokens.]
//   [mins: P fp16]  [scales: P fp16]   keys: P = d, in channel order; values: P = d/G x T rounded up to 16, in tiles
//    of 16 tokens like IntGroup's scales ([T/16][d/G groups][16 tokens]: the minima or scales of 16 tokens of one
//    group are one vector), the padding zero.
// Bits per element (T a multiple of 16, and of 32 for kivi:3 values): keys b + 32/T (d=128, T=64: kivi:2 2.5,
// kivi:3 3.5, kivi:4 4.5); values b + 32/G (G=32: 3, 4 and 5).
struct Kivi {
  size_t d, T, bits, G;  // G: the value group size (keys ignore it)
  bool key;
  constexpr size_t planes() const { return bits == 3 ? 2 : 1; }
  /// The bits of plane p's codes (b = 3: 2 then 1).
  constexpr size_t plane_bits(size_t p) const { return bits == 3 ? 2 - p : bits; }
  constexpr IntGroup plane(size_t p) const { return IntGroup{d, T, plane_bits(p), G, key}; }
  constexpr size_t lane_elements() const { return 32 / plane_bits(planes() - 1); }  // E of the last plane
  constexpr size_t param_tokens() const { return (T + 15) / 16 * 16; }
  constexpr size_t code_tokens() const {
    return key ? param_tokens() : (T + lane_elements() - 1) / lane_elements() * lane_elements();
  }
  /// The byte where plane p starts (a multiple of 64).
  constexpr size_t plane_offset(size_t p) const { return p == 0 ? 0 : code_tokens() * d * plane_bits(0) / 8; }
  constexpr size_t param_count() const { return key ? d : param_tokens() * (d / G); }
  constexpr size_t mins_offset() const { return align16(code_tokens() * d * bits / 8); }
  constexpr size_t scales_offset() const { return mins_offset() + align16(2 * param_count()); }
  constexpr size_t block_bytes() const { return scales_offset() + 2 * param_count(); }
  /// The byte holding the code of token t, channel c, at bit code_shift(t, c) (b = 2, 4: one plane).
  constexpr size_t code_byte(size_t t, size_t c) const { return plane(0).code_byte(t, c); }
  constexpr unsigned code_shift(size_t t, size_t c) const { return plane(0).code_shift(t, c); }
  /// The code stored at bit `shift` of `byte`: 0 .. 2^b - 1 (b = 2, 4).
  constexpr unsigned code(unsigned byte, unsigned shift) const { return (byte >> shift) & ((1u << bits) - 1); }
  /// The code of token t, channel c, read from its planes: 0 .. 2^b - 1.
  constexpr unsigned read_code(const unsigned char* block, size_t t, size_t c) const {
    unsigned q = 0;
    for (size_t p = 0, low = 0; p < planes(); low += plane_bits(p), ++p) {
      const IntGroup l = plane(p);
      q |= ((block[plane_offset(p) + l.code_byte(t, c)] >> l.code_shift(t, c)) & ((1u << l.bits) - 1)) << low;
    }
    return q;
  }
  /// Sets the bits of code q of token t, channel c in a zeroed code section.
  constexpr void write_code(unsigned char* block, size_t t, size_t c, unsigned q) const {
    for (size_t p = 0, low = 0; p < planes(); low += plane_bits(p), ++p) {
      const IntGroup l = plane(p);
      block[plane_offset(p) + l.code_byte(t, c)] |=
          static_cast<unsigned char>(((q >> low) & ((1u << l.bits) - 1)) << l.code_shift(t, c));
    }
  }
  /// The number of the (m, s) pair of token t, channel c: c (keys), or its place in the value tiles.
  constexpr size_t param(size_t t, size_t c) const {
    return key ? c : (t / 16 * (d / G) + c / G) * 16 + t % 16;
  }
};
static_assert(Kivi{128, 64, 2, 32, true}.block_bytes() == 2560);   // 2.5 bits per element
static_assert(Kivi{128, 64, 3, 32, true}.block_bytes() == 3584);   // 3.5
static_assert(Kivi{128, 64, 2, 32, false}.block_bytes() == 3072);  // 3
static_assert(Kivi{128, 64, 3, 32, false}.block_bytes() == 4096);  // 4
static_assert(Kivi{128, 64, 4, 32, false}.block_bytes() == 5120);  // 5
static_assert(Kivi{128, 64, 3, 32, true}.plane_offset(1) == 2048);


// ---- turbo_mse / turbo_prod / qjl / turbo_rvq ------------------------------------------------------------------
// turbo_mse and turbo_prod indices lie in 64-byte lane tiles (LaneCodes), qjl and turbo_prod sign bits too
// (SignTiles); turbo_rvq's indices are packed per token in the bitpack.hpp order (3-bit: 8 indices in 3 bytes), d a
// multiple of 16, so every token's codes fill whole bytes. c is the Lloyd–Max codebook of a sphere coordinate in R^d (lloyd_max.hpp),
// R the codec's rotation, S its m x d Gaussian sketch, and sign bit i is set when (S v)_i >= 0.

// turbo_mse:b   [codes: LaneCodes] [norms: T x fp16 ||x_t||]
//   x_t = ||x_t|| R^T c[idx_t]; b + 16/d bits per element (d a multiple of 32 for keys, T of 32 for values).
//
// LaneCodes: b-bit indices (b = 1..4) in 64-byte tiles of 16 little-endian 32-bit lanes, so that the fused kernels
// load 16 tokens (keys, one lane per token) or 16 channels (values, one lane per channel) at once. A "chunk" of 32
// elements of a lane (keys: channels 32k..32k+31 of one token; values: tokens 32a..32a+31 of one channel) takes b
// lanes, one in each of b consecutive tiles, and is read as four nibble lanes of 8 elements each: element e = 8v + j
// at bits 4j..4j+3 of nibble lane v, as idx = lo | hi << 2 (b <= 3) or the whole nibble (b = 4).
//   b = 4: tiles 0..3 are nibble lanes 0..3.
//   b = 2, 3: tile 0 holds the low 2 bits of elements 8v + j for v = 0, 1 at bits 2 (2j + v); tile 1 those of
//     v = 2, 3 at bits 2 (2j + v - 2). Nibble lane v is (tile v/2 >> 2 (v % 2)) & 0x33333333.
//   b = 1, 3: the last tile holds the high bit (b = 3) or the only bit (b = 1, idx = hi) of element 8v + j at bit
//     4j + (v + 2) % 4, so that one shift and a mask 0x44444444 move it to bit 4j + 2 of nibble lane v.
// Keys: tile (a, k, p) for tokens 16a..16a+15, channels 32k..32k+31, part p < b at byte 64 (b (a D/32 + k) + p),
// D = d rounded up to 32. Values: tile (a, k, p) for tokens 32a..32a+31, channels 16k..16k+15 at byte
// 64 (b (a d/16 + k) + p). The tiles cover T rounded up to 16 (keys) or 32 (values) tokens; the padding is zero.
struct LaneCodes {
  size_t d, T, bits;
  bool key;
  constexpr size_t code_tokens() const { return key ? (T + 15) / 16 * 16 : (T + 31) / 32 * 32; }
  constexpr size_t code_channels() const { return key ? (d + 31) / 32 * 32 : d; }
  constexpr size_t bytes() const { return code_tokens() * code_channels() * bits / 8; }
  /// Where part p of the index of token t, channel c lies: bit `shift` of byte `byte`, `width` bits wide. Part 0 is
  /// the low 2 bits (b = 2, 3), the nibble (b = 4) or the bit (b = 1); part 1 is the high bit (b = 3).
  struct Place {
    size_t byte;
    unsigned shift, width;
  };
  constexpr size_t parts() const { return bits == 3 ? 2 : 1; }
  constexpr Place place(size_t t, size_t c, size_t part) const {
    const size_t lane = key ? t % 16 : c % 16, e = key ? c % 32 : t % 32, v = e / 8, j = e % 8;
    const size_t tile0 = key ? bits * (t / 16 * (code_channels() / 32) + c / 32) : bits * (t / 32 * (d / 16) + c / 16);
    size_t tile = tile0, bit = 0;
    unsigned width = 0;
    if (bits == 4) {
      tile += v, bit = 4 * j, width = 4;
    } else if (bits != 1 && part == 0) {
      tile += v / 2, bit = 2 * (2 * j + v % 2), width = 2;
    } else {
      tile += bits - 1, bit = 4 * j + (v + 2) % 4, width = 1;
    }
    return {64 * tile + 4 * lane + bit / 8, static_cast<unsigned>(bit % 8), width};
  }
};

struct TurboMse {
  size_t d, T, bits;
  bool key = true;
  constexpr LaneCodes codes() const { return {d, T, bits, key}; }
  constexpr size_t norms_offset() const { return align16(codes().bytes()); }
  constexpr size_t block_bytes() const { return norms_offset() + 2 * T; }
};
static_assert(TurboMse{128, 64, 3}.block_bytes() == 64 * 48 + 64 * 2);  // 3.125 bits per element

// SignTiles: the sign bits of m sketch rows per token (qjl, turbo_prod), in 64-byte tiles of 16 little-endian
// 32-bit lanes, so that the fused kernels test one bit of 16 tokens (keys) or 16 rows (values) at once:
//   keys, "tokens in lanes": tile (a, k) holds tokens 16a..16a+15 x rows 32k..32k+31, bit r of lane l set when row
//     32k + r of token 16a + l is >= 0; at byte 64 (a M/32 + k), M = m rounded up to 32; the tiles cover T rounded
//     up to 16 tokens.
//   values, "rows in lanes": tile (a, k) holds tokens 32a..32a+31 x rows 16k..16k+15, bit j of lane l set when row
//     16k + l of token 32a + j is >= 0; at byte 64 (a M/16 + k), M = m rounded up to 16; the tiles cover T rounded
//     up to 32 tokens.
//   The padding rows and tokens are zero bits.
struct SignTiles {
  size_t m, T;
  bool key;
  constexpr size_t rows() const { return key ? (m + 31) / 32 * 32 : (m + 15) / 16 * 16; }  // M
  constexpr size_t tokens() const { return key ? (T + 15) / 16 * 16 : (T + 31) / 32 * 32; }
  constexpr size_t bytes() const { return tokens() * rows() / 8; }
  /// Row r of token t: bit shift(t, r) of byte byte(t, r), from the section's start.
  constexpr size_t byte(size_t t, size_t r) const {
    if (key) return 64 * (t / 16 * (rows() / 32) + r / 32) + 4 * (t % 16) + r % 32 / 8;
    return 64 * (t / 32 * (rows() / 16) + r / 16) + 4 * (r % 16) + t % 32 / 8;
  }
  constexpr unsigned shift(size_t t, size_t r) const { return static_cast<unsigned>(key ? r % 8 : t % 8); }
};

// qjl:m   [signs: SignTiles, "tokens in lanes" (keys) whatever the role] [norms: T x fp16 ||k_t||]
//   <q, k_t> ~= sqrt(pi/2)/m ||k_t|| <S q, sign(S k_t)>; (M + 16)/d bits per element (T a multiple of 16).
struct Qjl {
  size_t d, T, m;
  constexpr SignTiles signs() const { return {m, T, true}; }
  constexpr size_t norms_offset() const { return align16(signs().bytes()); }
  constexpr size_t block_bytes() const { return norms_offset() + 2 * T; }
};
static_assert(Qjl{128, 64, 128}.block_bytes() == 64 * 16 + 64 * 2);  // 1.125 bits per element

// turbo_prod:b   [turbo_mse:(b-1) codes (LaneCodes)] [norms: T x fp16 ||x_t||] [signs: SignTiles of sign(S r_t)]
//                [residual norms: T x fp16 ||r_t||]
//   x^mse_t = ||x_t|| R^T c[idx_t] (as decoded), r_t = x_t - x^mse_t, m = d;
//   x_t ~= x^mse_t + sqrt(pi/2)/m ||r_t|| S^T sign(S r_t); (b-1) + 1 + 32/d bits per element.
struct TurboProd {
  size_t d, T, bits, m;
  bool key = true;
  constexpr TurboMse mse() const { return {d, T, bits - 1, key}; }
  constexpr SignTiles signs() const { return {m, T, key}; }
  constexpr size_t signs_offset() const { return align16(mse().block_bytes()); }
  constexpr size_t residual_norms_offset() const { return align16(signs_offset() + signs().bytes()); }
  constexpr size_t block_bytes() const { return residual_norms_offset() + 2 * T; }
};
static_assert(TurboProd{128, 64, 3, 128}.block_bytes() == 64 * 32 + 128 + 64 * 16 + 128);  // 3.25 bits per element
static_assert(TurboProd{128, 64, 3, 128, false}.block_bytes() == 64 * 32 + 128 + 64 * 16 + 128);

// turbo_rvq:b   [stage-1 codes: T x b*d/8] [stage-2 codes: T x b*d/8] [norms: T x fp16 ||x_t||]
//   x_t = ||x_t|| R^T (c[i1_t] + c2[i2_t]), c2 the Lloyd–Max codebook of the stage-1 residual; 2b + 16/d bits
//   per element.
struct TurboRvq {
  size_t d, T, bits;
  constexpr size_t code_bytes() const { return (bits * d + 7) / 8; }  // per token and stage
  constexpr size_t stage2_offset() const { return align16(T * code_bytes()); }
  constexpr size_t norms_offset() const { return align16(stage2_offset() + T * code_bytes()); }
  constexpr size_t block_bytes() const { return norms_offset() + 2 * T; }
};
static_assert(TurboRvq{128, 64, 2}.block_bytes() == 2 * 64 * 32 + 64 * 2);  // 4.125 bits per element


// ---- vecinfer --------------------------------------------------------------------------------------------------
//   [codes: T rows of row_bytes(); row t holds token t's d/s codeword indices, c bits each, LSB-first
//    (bitpack.hpp), index j coding channels [j*s, (j+1)*s) of the smoothed, rotated vector; zero bits pad a row
//    to whole bytes]
//   [norm=1 only, at norms_offset(): T fp16 factors gamma_t = |x_t|^2 / <x_t, x^_t> (capped at 2; 0 if <x_t, x^_t> <= 0)]
// The codebook (2^c x s floats) and the smoothing factors lambda (d floats) are trained state of the codec, shared
// by every block, and are not stored in blocks. Reconstruction:
//   x = gamma_t * lambda ⊙ R^T [cb[idx_0], ..., cb[idx_{d/s-1}]]      (gamma_t = 1 without norm=1).
// Bits per element c/s when (d/s)*c is a multiple of 8 (any power-of-two d): vecinfer:8/4 -> 2.0,
// vecinfer:10/4 -> 2.5, vecinfer:12/8 -> 1.5, vecinfer:8/8 -> 1.0; norm=1 adds 16/d (0.125 at d = 128).
struct VecInfer {
  size_t d, T, s, c;  // s: sub-vector length (4 or 8), c: bits per codeword (8..12)
  bool norm = false;  // per-token inner-product correction stored
  constexpr size_t row_bytes() const { return (d / s * c + 7) / 8; }
  constexpr size_t norms_offset() const { return align16(T * row_bytes()); }
  constexpr size_t block_bytes() const { return norm ? norms_offset() + 2 * T : T * row_bytes(); }
};
static_assert(VecInfer{128, 64, 4, 8}.block_bytes() == 2048);         // 2 bits per element
static_assert(VecInfer{128, 64, 8, 12}.block_bytes() == 1536);        // 1.5
static_assert(VecInfer{128, 64, 4, 8, true}.block_bytes() == 2176);   // 2.125

}  // namespace kvq::layout

// How the decode kernel (decode_kernel.cuh) reads each codec's block (src/codec/block_layout.hpp) into tensor-core
// fragments (fragment_ops.cuh), for keys and for values.
//
// A warp works through a sequence's tokens in chunks of C tokens (32; 64 where a codec's 16-token lanes need it).
// Lane = 4 n + i. Scores: S = Q K^T as C / 8 tiles of 8 tokens; token (C / 8) n + jj of the chunk is column n of
// tile jj, so lane (n, i) decodes tokens (C / 8) n .. (C / 8) n + C / 8 - 1 (one 16-byte load of 4 consecutive
// 32-bit lanes of a tokens-in-lanes tile) and holds the scores of its query row n for its run of C / 4 tokens
// (C / 4) i + {jj, C / 8 + jj}. The reduction order of k inside a step is free, so each codec maps the k of its
// B fragments to channels as its decode produces them (`channel`), and the query fragments follow that map. Values:
// O = P V as value steps of 16 tokens, each lane supplying its own run of C / 4 tokens (`token_at`: which of them
// sits at k = 2i, 2i+1, 2i+8, 2i+9) and 8-channel tiles whose columns map to channels by `channel`.
//
// The codes of a chunk come as 16-byte pieces: `piece(k)` is the byte offset of this lane's k-th piece in the
// block's first chunk (chunk cc adds cc * chunk_bytes, the codes of C tokens); the kernel streams them into the
// lane's own shared-memory slots (slot k of lane l at codes[32 k + l], codes the stage's first slot), or, for codecs
// whose lanes share pieces (turbo_mse), into the codec's `slots` at `copy_slot(k, l)` by the lanes that
// `lane_copies` (`code_slots`, `lane_slot` below); where a lane's pieces lie at fixed steps from its first, from one
// address (`piece_source`). Per-chunk
// parameters (scales, minima, norms) are `ranges` of the block copied once per warp into shared memory (prm[r]).
// Codecs with kBulk (f16/bf16) instead take the chunk's rows (chunk_bytes at cc * chunk_bytes) by the copy engine,
// in 8 units placed for conflict-free reads (float_stage.cuh); their fragments read that placement.
//
// Codes become exact fp16 integers without conversions (the 2^10 mantissa trick: 0x6400 | u is 1024 + u), with a
// per-group or per-token factor applied in fp32 to the score tiles (keys) or in fp16 to the decoded value (values,
// whose error budget is the output's, not the softmax's). Queries and softmax weights are fp32 split into hi + lo
// operands (rows n and n + 8 of A), so scores and sums keep fp32 accuracy.
#pragma once

#include <cstdint>

#include "codec/signed_byte_levels.hpp"
#include "cuda/float_stage.cuh"
#include "cuda/fragment_ops.cuh"

namespace kvq::cuda::detail {

/// Run-time parameters of one codec's blocks.
struct CodecArgs {
  int T = 0;           ///< tokens per block
  int group = 0;       ///< int8/int4: channels per scale; kivi values: channels per (min, scale)
  int group_shift = 0; ///< int8/int4 keys: log2(group / 16), the k steps of 16 channels per scale
  int group_log2 = 0;  ///< log2(group)
  int groups = 0;      ///< d / group
  uint32_t sec0 = 0;   ///< int: scales; kivi: minima; turbo_mse, turbo_prod, turbo_rvq, qjl: norms (byte offset)
  uint32_t sec1 = 0;   ///< kivi: scales; turbo_prod: signs; turbo_rvq: stage-2 codes
  uint32_t sec2 = 0;   ///< turbo_prod: residual norms
  const void* table = nullptr;  ///< vecinfer's codebook, turbo_rvq's level tables (codec_table)
  uint32_t table_bytes = 0;     ///< what of it each block copies into shared memory (a multiple of 16; 0: none)
  /// turbo_mse: the 16 nibble levels * 2^12 as fp16: low bytes of levels 0-3, 4-7, high bytes of 0-3, 4-7, then
  /// the same for levels 8-15 (read by b = 4 alone: the nibbles of b <= 3 stay below 8)
  /// (exact: the codecs round their levels to fp16 precision, FloatCodebook)
  uint32_t table_hi[8] = {};
  /// turbo_mse keys' integer path: the 16 nibble levels as signed bytes l_j ~ level_j / level_unit (byte j % 4 of
  /// word j / 4; |level_j - level_unit l_j| <= level_unit / 2, level_unit = max_j |level_j| / 127)
  uint32_t levels_i8[4] = {};
  float level_unit = 0;
};

/// The slot of a codec's table (CodecArgs::table) in shared memory among the pointers `prm` the traits receive
/// (slots below it: the chunk's parameter ranges).
constexpr int kTableSlot = 3;

constexpr uint32_t kHalf1032 = 0x64086408u;  // {1032, 1032}: 1024 + the offset of int4 codes
constexpr uint32_t kHalf1152 = 0x64806480u;  // {1152, 1152}: 1024 + the offset of int8 codes
constexpr uint32_t kHalfSixteenth = 0x2C002C00u;  // {1/16, 1/16}
constexpr uint32_t kHalfMinus72 = 0xD480D480u;    // {-72, -72}

KVQ_HD constexpr int log2_of(int x) { return x <= 1 ? 0 : 1 + log2_of(x / 2); }

/// The 4 pieces of one 16-byte shared-memory slot as words.
KVQ_HD uint32_t word(const uint4& p, int j) { return j == 0 ? p.x : j == 1 ? p.y : j == 2 ? p.z : p.w; }

/// An fp16 of a parameter section (16-byte aligned in shared memory): 8 halves per uint4.
KVQ_HD uint4 load16(const uint8_t* p) { return *reinterpret_cast<const uint4*>(p); }

/// The fp16 parameters of lane i's run of C / 4 tokens (C / 4) i .. (C / 4) i + C / 4 - 1 of one group, from a
/// chunk's [C/16][groups][16] tiles (groups = 1, gr = 0: a plain per-token array), 8 tokens a uint4.
template <int C>
KVQ_HD void run_halves(const uint8_t* prm, int groups, int i, int gr, uint4 (&r)[C / 32]) {
  const int t0 = C / 4 * i;
  const uint8_t* p = prm + 2 * (((t0 >> 4) * groups + gr) * 16 + (t0 & 15));
KVQ_UNROLL
  for (int x = 0; x < C / 32; ++x) r[x] = load16(p + 16 * x);
}
/// Token u of a lane's run (run_halves) as fp32.
template <int N>
KVQ_HD float run_at(const uint4 (&r)[N], int u) {
  return half_to_float(word(r[u >> 3], (u & 7) >> 1), u & 1);
}

/// Half j (0..7) of a uint4 as fp32.
KVQ_HD float half_at(const uint4& p, int j) { return half_to_float(word(p, j >> 1), j & 1); }

/// {h_a, h_b} from two uint4 of 8 halves: half a of p and half b of q (a, b of equal parity).
KVQ_HD uint32_t half_pair(const uint4& p, const uint4& q, int a, int b) {
  return prmt(word(p, a >> 1), word(q, b >> 1), a & 1 ? 0x7632u : 0x5410u);
}

// int4 lanes: 8 two's-complement nibbles, element j at bits 4j. Pair x (0..3) holds elements (x, x + 4) as exact
// fp16: nibble ^ 8 = code + 8 in the mantissa of 1024 (bit positions 4x%8 of each 16-bit half), then minus 1032, or
// times 1/16 minus 72 for the nibbles at bits 4..7.
KVQ_HD uint32_t int4_pair(uint32_t w, int x) {
  const uint32_t src = x < 2 ? w : w >> 8;
  if ((x & 1) == 0) return h2_sub(and_xor<0x000F000Fu, kHalf1032>(src), kHalf1032);
  return h2_fma(and_xor<0x00F000F0u, 0x64806480u>(src), kHalfSixteenth, kHalfMinus72);
}
// int8 lanes: 4 two's-complement bytes. Pair x (0, 1) holds bytes (x, x + 2).
KVQ_HD uint32_t int8_pair(uint32_t w, int x) {
  const uint32_t src = x == 0 ? w : w >> 8;
  return h2_sub(and_xor<0x00FF00FFu, kHalf1152>(src), kHalf1152);
}
// 2-bit lanes (kivi): 16 unsigned codes, element j at bits 2j. Pair x (0..7) holds elements (x, x + 8).
KVQ_HD uint32_t u2_pair(uint32_t w, int x) {
  const uint32_t src = x < 4 ? w : w >> 8;
  constexpr uint32_t kScale[4] = {0x3C003C00u, 0x34003400u, 0x2C002C00u, 0x24002400u};   // 4^-(x % 4)
  constexpr uint32_t kOffset[4] = {0xE400E400u, 0xDC00DC00u, 0xD400D400u, 0xCC00CC00u};  // -1024 4^-(x % 4)
  uint32_t h;
  switch (x & 3) {
    case 0: h = and_or<0x00030003u, 0x64006400u>(src); break;
    case 1: h = and_or<0x000C000Cu, 0x64006400u>(src); break;
    case 2: h = and_or<0x00300030u, 0x64006400u>(src); break;
    default: h = and_or<0x00C000C0u, 0x64006400u>(src); break;
  }
  return h2_fma(h, kScale[x & 3], kOffset[x & 3]);
}
// 4-bit lanes (kivi:4): 8 unsigned codes, element j at bits 4j. Pair x (0..3) holds elements (x, x + 4): the code in
// the mantissa of 1024 minus 1024, or times 1/16 minus 64 for the nibbles at bits 4..7.
KVQ_HD uint32_t u4_pair(uint32_t w, int x) {
  const uint32_t src = x < 2 ? w : w >> 8;
  if ((x & 1) == 0) return h2_sub(and_or<0x000F000Fu, 0x64006400u>(src), 0x64006400u);
  return h2_fma(and_or<0x00F000F0u, 0x64006400u>(src), kHalfSixteenth, 0xD400D400u);
}
/// The unsigned b-bit pair x of a kivi lane: elements (x, x + 16 / b).
template <int kBits>
KVQ_HD uint32_t kivi_pair(uint32_t w, int x) {
  if constexpr (kBits == 2) return u2_pair(w, x);
  else return u4_pair(w, x);
}
// kivi:3: its codes' low two bits are a 2-bit lane word (16 elements), their high bits the 16-bit half `half` of a
// word of the 1-bit plane (element e at bit e of the half). kivi3_high spreads that half to element e < 8 at bit e
// and element 8 + e at bit 16 + e, so that pair x's high bits lie at bit x of each 16-bit half; u3_pair adds them to
// u2_pair's fp16 pair as 2 x {2.0 or 0} (0x4000: fp16 2.0, one bit), exact (codes 0..7).
KVQ_HD uint32_t kivi3_high(uint32_t w, int half) { return prmt(w, 0u, half != 0 ? 0x4342u : 0x4140u); }
KVQ_HD uint32_t u3_pair(uint32_t low, uint32_t high, int x) {
  return h2_fma((high << (14 - x)) & 0x40004000u, 0x40004000u, u2_pair(low, x));
}
/// kivi:3's high bits of the byte fragments of the integer path: from the lane word's half (element e at bit e),
/// element 4j + e at bit 8j + e (byte j holds the bits of elements 4j .. 4j + 3), formed once per lane word.
KVQ_HD uint32_t kivi3_high_bytes(uint32_t w, int half) {
  const uint32_t h = half != 0 ? w >> 16 : w & 0xFFFFu;
  return (h & 0xFu) | (h & 0xF0u) << 4 | (h & 0xF00u) << 8 | (h & 0xF000u) << 12;
}
/// Element 4j + e's high bit of kivi3_high_bytes at bit 2 of byte j (4 x the bit: the code's value).
KVQ_HD uint32_t kivi3_byte_high(uint32_t bytes, int e) {
  return (e <= 2 ? bytes << (2 - e) : bytes >> (e - 2)) & 0x04040404u;
}

// LaneCodes (turbo_mse:b): nibble lane v (0..3) of a 32-element chunk, index j at bits 4j .. 4j + 3, from the lane
// word of the tile holding its low bits (b = 2, 3: tile v / 2; b = 4: tile v, the nibbles themselves) and the lane
// word of the 1-bit tile (b = 1, 3: the last one; its bit 4j + (v + 2) % 4 goes to bit 4j + 2).
template <int kBits>
KVQ_HD uint32_t lane_nibbles(uint32_t low_plane, uint32_t bit_plane, int v) {
  if constexpr (kBits == 4) return low_plane;
  const uint32_t low = kBits == 1 ? 0u : (low_plane >> (2 * (v & 1))) & 0x33333333u;
  if constexpr (kBits == 2) return low;
  const int rot = (34 - ((v + 2) & 3)) & 31;  // 0, 31, 2, 1
  return low | (rotl(bit_plane, rot) & 0x44444444u);
}
/// The LaneCodes tile (of a chunk's b) holding nibble lane v's low bits (b = 3 also reads the 1-bit tile b - 1).
template <int kBits>
KVQ_HD constexpr int lane_code_tile(int v) {
  return kBits == 4 ? v : kBits == 1 ? 0 : v >> 1;
}

/// The 16-byte shared-memory slots of a chunk's lane pieces (Shape: <D, C> for keys, <D, DP, C> for values), and the
/// slot that a lane's piece k fills: the codec's own where its lanes share pieces, else slot 32 k + lane.
template <class T, int... Shape>
constexpr int code_slots() {
  if constexpr (requires { T::template slots<Shape...>(); }) return T::template slots<Shape...>();
  else return 32 * T::template pieces<Shape...>();
}
template <class T>
inline constexpr bool kSharesPieces = requires { T::copy_slot(0, 0); };
template <class T>
KVQ_HD constexpr int lane_slot(int k, int lane) {
  if constexpr (kSharesPieces<T>) return T::copy_slot(k, lane);
  else return 32 * k + lane;
}
/// Whether a lane's pieces lie at the same steps from its first for every lane (the codec's kFixedSteps: int, kivi
/// and turbo_mse, whose `piece` adds the step last, so that the difference of two pieces folds to a constant).
template <class T>
inline constexpr bool kFixedPieceSteps = requires { requires T::kFixedSteps; };
/// The source of the lane's piece k in a chunk's codes: where the steps are fixed (and kOneAddress), its first piece
/// plus the step, so that the copies take one address and immediate offsets (no offset per piece held or recomputed
/// in the chunk loop).
template <class T, bool kOneAddress, int N>
KVQ_HD const uint8_t* piece_source(const uint8_t* chunk, const int (&piece)[N], int k) {
  if constexpr (kOneAddress && kFixedPieceSteps<T>) return chunk + piece[0] + (piece[k] - piece[0]);
  else return chunk + piece[k];
}
/// Whether the lane copies its pieces (all of them or none): where lanes share pieces, only the first slots / pieces
/// lanes do (one a slot of each piece k), and the offsets of the others are not read. A test of the lane, not a
/// sentinel offset, so that the offsets stay non-negative (no sign extension, no select per piece).
template <class T, int... Shape>
inline constexpr int kCopyLanes = code_slots<T, Shape...>() / T::template pieces<Shape...>();
template <class T, int... Shape>
KVQ_HD constexpr bool lane_copies(int lane) {
  if constexpr (kSharesPieces<T>) return lane < kCopyLanes<T, Shape...>;
  else return true;
}

/// Which of lane i's run of C / 4 tokens a value codec puts at k = 2i, 2i + 1, 2i + 8, 2i + 9 (e = 0..3) of value
/// step vs: V::token_at, or V::token_at<C> where that depends on the chunk size.
template <class V, int C>
KVQ_HD constexpr int value_token(int vs, int e) {
  if constexpr (requires { V::template token_at<C>(0, 0); }) return V::template token_at<C>(vs, e);
  else return V::token_at(vs, e);
}

// Table lookup of 4 indices (the low 4 nibbles of nib, each below 8) into fp16 levels (CodecArgs::table_hi's
// layout): {level[n0], level[n1]}, {level[n2], level[n3]}.
KVQ_HD void lookup4(uint32_t nib, const uint32_t (&t)[8], uint32_t& p01, uint32_t& p23) {
  const uint32_t lo = prmt(t[0], t[1], nib & 0xffffu), hi = prmt(t[2], t[3], nib & 0xffffu);
  p01 = prmt(lo, hi, 0x5140u);
  p23 = prmt(lo, hi, 0x7362u);
}
// The same for indices 0..15: both halves of the table looked up with the low 3 bits, then byte j taken from the
// upper half (selector j + 4) where nibble j's bit 3 is set.
KVQ_HD void lookup16(uint32_t nib, const uint32_t (&t)[8], uint32_t& p01, uint32_t& p23) {
  const uint32_t sel = nib & 0x7777u, upper = ((nib >> 1) & 0x4444u) | 0x3210u;
  const uint32_t lo = prmt(prmt(t[0], t[1], sel), prmt(t[4], t[5], sel), upper);
  const uint32_t hi = prmt(prmt(t[2], t[3], sel), prmt(t[6], t[7], sel), upper);
  p01 = prmt(lo, hi, 0x5140u);
  p23 = prmt(lo, hi, 0x7362u);
}
template <int kBits>
KVQ_HD void lookup(uint32_t nib, const uint32_t (&t)[8], uint32_t& p01, uint32_t& p23) {
  if constexpr (kBits == 4) lookup16(nib, t, p01, p23);
  else lookup4(nib, t, p01, p23);
}
/// The signed-byte levels (CodecArgs::levels_i8) of the low 4 nibbles of nib (each below 8): byte j = l[nibble j].
KVQ_HD uint32_t lookup_i8(uint32_t nib, const uint32_t (&l)[4]) { return prmt(l[0], l[1], nib & 0xffffu); }

/// The channel of the value column `col` of value tile j for the codecs with channels-in-lanes tiles of 16
/// channels: 16-byte loads of 4 consecutive channels, 4 of them (e) in 4 tiles; tile j = 4r + e covers the 32
/// channels 32r .. 32r + 31 (one scale group when groups hold 16, 32 or 64 channels).
KVQ_HD constexpr int lane_tile_channel(int j, int col) {
  return 32 * (j >> 2) + 16 * (col >> 2) + 4 * (col & 3) + (j & 3);
}
/// The 16-channel tile (of the block) of a lane's value piece r for the part starting at channel pc.
KVQ_HD int lane_tile_k16(int pc, int r, int n) { return (pc + 32 * r + 16 * (n >> 2)) >> 4; }

// Keys whose scores need no per-group factor (f16/bf16, kivi): a group's hi and lo products are summed as they are.
struct UnscaledKeyGroups {
  template <int D, int C>
  KVQ_HD static void scale_group(const uint8_t* const*, const CodecArgs&, int, int, const float (&acc)[C / 8][4],
                                 float (&s)[C / 8][2]) {
KVQ_UNROLL
    for (int jj = 0; jj < C / 8; ++jj) {
      s[jj][0] += acc[jj][0] + acc[jj][2];
      s[jj][1] += acc[jj][1] + acc[jj][3];
    }
  }
};

// ---- f16 / bf16: [T x d] token-major ---------------------------------------------------------------------------
// The chunk's rows come by the copy engine (kBulk: the kernel copies the C x d keys and the C x d values in the
// units of FloatStage), and the fragments read them where FloatStage puts them. Keys: lane (n, i) reads 16 bytes of
// token (C/8) n + jj (channels 8 (4m + i) ..), two k steps. Values: ldmatrix.trans of token rows, tile j = channels
// 8j .. 8j + 7 of the part, row r of each matrix from unit r. Chunks of 16 tokens: these pairs stream the most bytes
// for their arithmetic, and small stages let 12 warps share an SM.
template <bool kBf16Codes>
struct FloatTraits {
  struct Key : UnscaledKeyGroups {
    static constexpr bool kBf16 = kBf16Codes, kSplitB = false, kChunkA = false, kDense = false, kBulk = true;
    static constexpr bool kGroups = false;  // one factor per token, after all k steps
    static constexpr int kChunk = 16, kRanges = 0;
    template <int D, int C>
    static constexpr int pieces() {
      return 0;
    }
    template <int D, int C>
    static constexpr uint32_t chunk_bytes() {
      return 2 * C * D;
    }
    template <int D, int C>
    KVQ_HD static int piece(const CodecArgs&, int, int) {
      return 0;
    }
    template <int D, int C>
    KVQ_HD static void range(const CodecArgs&, int, int, uint32_t&, uint32_t&) {}
    template <int D>
    KVQ_HD static constexpr int channel(int ks, int k) {
      return 8 * (4 * (ks >> 1) + ((k & 7) >> 1)) + 4 * (ks & 1) + (k & 1) + 2 * (k >> 3);
    }
    /// The stage byte offset of the 16 bytes that lane (n, i) reads for tile jj at k steps ks, ks + 1 (ks even).
    template <int D, int C>
    KVQ_HD static constexpr uint32_t column(int lane, int jj, int ks) {
      return FloatStage<D, C>::at(C / 8 * (lane >> 2) + jj, 4 * (ks >> 1) + (lane & 3));
    }
    /// codes: the chunk's C x D values in FloatStage's units.
    template <int D, int C>
    KVQ_HD static void bfrags(const uint4* codes, int ks, const CodecArgs&, int lane, uint32_t (&b)[C / 8][2]) {
KVQ_UNROLL
      for (int jj = 0; jj < C / 8; ++jj) {
        const uint4 p = codes[column<D, C>(lane, jj, ks) / 16];
        b[jj][0] = ks & 1 ? p.z : p.x;
        b[jj][1] = ks & 1 ? p.w : p.y;
      }
    }
  };

  struct Value {
    static constexpr bool kBf16 = kBf16Codes, kDense = false, kBulk = true;
    static constexpr int kChunk = 16, kRanges = 0;
    template <int D, int DP, int C>
    static constexpr int pieces() {
      static_assert(C == 16 || C == 32, "f16/bf16 values: chunks of 16 or 32 tokens");
      return 0;
    }
    template <int D, int C>
    static constexpr uint32_t chunk_bytes() {
      return 2 * C * D;
    }
    template <int D, int DP, int C>
    KVQ_HD static int piece(const CodecArgs&, int, int, int) {
      return 0;
    }
    template <int D, int DP, int C>
    KVQ_HD static void range(const CodecArgs&, int, int, uint32_t&, uint32_t&) {}
    KVQ_HD static constexpr int channel(int j, int col) { return 8 * j + col; }
    /// Lane i's tokens of a step's matrix (k = 8h .. 8h + 7: local 2 vs + h and C / 8 + 2 vs + h) lie in distinct
    /// units of FloatStage: the chunk's tokens (C / 8) r + 2 vs + h, r = 2i, 2i + 1.
    template <int C>
    KVQ_HD static constexpr int token_at(int vs, int e) {
      return C / 8 * (e & 1) + 2 * vs + (e >> 1);
    }
    template <int C>
    KVQ_HD static void weights(const uint8_t* const*, int, float (&w)[C / 4]) {
KVQ_UNROLL
      for (int t = 0; t < C / 4; ++t) w[t] = 1.0f;
    }
    /// The 16 bytes of channels pc + 8j .. + 7 of the chunk's token t.
    template <int D, int C>
    KVQ_HD static const uint8_t* row(const uint4* codes, int t, int j, int pc) {
      return reinterpret_cast<const uint8_t*>(codes) + FloatStage<D, C>::at(t, (pc >> 3) + j);
    }
    /// The chunk token at row r of matrix m (= 2 vs + h: the tokens of k = 8h .. 8h + 7 of value step vs; k = 2i' +
    /// e is lane i''s local token token_at(vs, 2h + e)): row m of unit r.
    template <int C>
    KVQ_HD static constexpr int row_token(int m, int r) {
      return C / 8 * r + m;
    }
    /// Tile j for every value step: ldmatrix.trans of the token rows (x4: two steps, x2: one).
    template <int D, int DP, int C>
    KVQ_HD static void bfrags(const uint4* codes, const uint8_t* const*, const CodecArgs&, int lane, int j, int pc,
                              uint32_t (&b)[C / 16][2]) {
#if defined(__CUDA_ARCH__)
      const int m = lane >> 3, r = lane & 7;
      if constexpr (C == 32)
        ldmatrix_x4_trans(row<D, C>(codes, row_token<C>(m, r), j, pc), b[0][0], b[0][1], b[1][0], b[1][1]);
      else
        ldmatrix_x2_trans(row<D, C>(codes, row_token<C>(m & 1, r), j, pc), b[0][0], b[0][1]);
#else
      for (int m = 0; m < 2 * (C / 16); ++m) {
        uint32_t w = 0;
        for (int e = 0; e < 2; ++e) {
          const int r = 2 * (lane & 3) + e;  // the row this lane receives, from lane 8m + r's address
          const uint8_t* p = row<D, C>(codes, row_token<C>(m, r), j, pc) + 2 * (lane >> 2);
          w |= static_cast<uint32_t>(p[0] | p[1] << 8) << (16 * e);
        }
        b[m >> 1][m & 1] = w;
      }
#endif
    }
  };
};

// Keys in tokens-in-lanes tiles of E-element lane words (IntGroup, Kivi). Piece m (C / 32) + h: tokens (C / 8) n +
// 4h .. + 3 of the lane word 4m + i (channels E (4m + i) .. + E - 1). A lane word feeds E / 4 k steps; step ks takes
// its pairs 2 (ks % (E / 4)) and 2 (ks % (E / 4)) + 1, pair x holding elements (x, x + E / 2).
template <int E>
struct LaneWordKeys {
  static constexpr int kSteps = E / 4;  // k steps per lane word
  static constexpr bool kFixedSteps = true;
  template <int D, int C>
  static constexpr int pieces() {
    static_assert(C == 32 || C == 64, "lane-word keys: chunks of 32 or 64 tokens");
    return D / E / 4 * (C / 32);
  }
  /// Its piece 0 (first token t; tokens t + 4h share t's 16-token tile), then k's step (h = k % (C / 32), lane
  /// word 4 (k / (C / 32)) + i).
  template <int D, int C>
  KVQ_HD static int piece(const CodecArgs&, int lane, int k) {
    const int t = C / 8 * (lane >> 2);
    return 64 * ((t >> 4) * (D / E) + (lane & 3)) + 4 * (t & 15) + 256 * (k / (C / 32)) + 16 * (k % (C / 32));
  }
  template <int D>
  KVQ_HD static constexpr int channel(int ks, int k) {
    return E * (4 * (ks / kSteps) + ((k & 7) >> 1)) + 2 * (ks % kSteps) + (k >> 3) + E / 2 * (k & 1);
  }
  /// The B fragments of k step ks for the chunk's C / 8 tiles (tile 4h + x: word x of piece h), codes decoded by
  /// Pair(word, x).
  template <int C, uint32_t (*Pair)(uint32_t, int)>
  KVQ_HD static void decode(const uint4* codes, int ks, int lane, uint32_t (&b)[C / 8][2]) {
    const int x0 = 2 * (ks % kSteps);
KVQ_UNROLL
    for (int h = 0; h < C / 32; ++h) {
      const uint4 p = codes[32 * ((ks / kSteps) * (C / 32) + h) + lane];
KVQ_UNROLL
      for (int x = 0; x < 4; ++x) {
        b[4 * h + x][0] = Pair(word(p, x), x0);
        b[4 * h + x][1] = Pair(word(p, x), x0 + 1);
      }
    }
  }
};

/// Adds each score tile times the per-token factor of its tokens (scores (C / 4) i + {jj, C / 8 + jj} of lane i;
/// `run`: the lane's run_halves) times `unit`.
template <int C>
KVQ_HD void scale_tiles(const uint4 (&run)[C / 32], float unit, const float (&acc)[C / 8][4], float (&s)[C / 8][2]) {
KVQ_UNROLL
  for (int jj = 0; jj < C / 8; ++jj) {
    s[jj][0] = fmaf(run_at(run, jj) * unit, acc[jj][0] + acc[jj][2], s[jj][0]);
    s[jj][1] = fmaf(run_at(run, C / 8 + jj) * unit, acc[jj][1] + acc[jj][3], s[jj][1]);
  }
}

// Codecs with one fp16 norm per token (turbo_mse, qjl): the chunk's norms (section sec0) are their one parameter
// range, for keys and for values.
template <int C>
KVQ_HD void token_norm_range(const CodecArgs& a, int cc, uint32_t& offset, uint32_t& bytes) {
  bytes = 2u * C;
  offset = a.sec0 + static_cast<uint32_t>(cc) * bytes;
}
struct TokenNormKeys {
  template <int D, int C>
  KVQ_HD static void range(const CodecArgs& a, int cc, int, uint32_t& offset, uint32_t& bytes) {
    token_norm_range<C>(a, cc, offset, bytes);
  }
};
// Their values: the softmax weights take norm * 2^-12 (the decoded levels or signs are stored times 2^12).
struct TokenNormValues {
  template <int D, int DP, int C>
  KVQ_HD static void range(const CodecArgs& a, int cc, int, uint32_t& offset, uint32_t& bytes) {
    token_norm_range<C>(a, cc, offset, bytes);
  }
  /// The lane's tokens 8i .. 8i + 7 (chunks of 32 tokens).
  template <int C>
  KVQ_HD static void weights(const uint8_t* const* prm, int lane, float (&w)[C / 4]) {
    const uint4 nr = load16(prm[0] + 16 * (lane & 3));
KVQ_UNROLL
    for (int t = 0; t < C / 4; ++t) w[t] = half_at(nr, t) * 0x1p-12f;
  }
};

// ---- int8 / int4 (IntGroup): keys tokens-in-lanes, values channels-in-lanes, fp16 scales in 16-token tiles -----
// The scale of a key group multiplies its score tile in fp32 (the k steps of a group accumulate apart); the scale of
// a value multiplies the decoded fp16 code (rounded once). Key groups must hold a multiple of 32 (int4 on the fp16
// path) or 16 (int8, and int4 on the integer path) channels, value groups a multiple of 16 (DecodePlan checks).
template <int kBits>
struct IntTraits {
  static constexpr int E = 32 / kBits;  // elements per 32-bit lane

  struct Key : LaneWordKeys<E> {
    static constexpr bool kBf16 = false, kSplitB = false, kChunkA = false, kDense = kBits == 4, kBulk = false;
    static constexpr int kChunk = 32, kRanges = 1;
    template <int D, int C>
    static constexpr uint32_t chunk_bytes() {
      return C * D * kBits / 8;
    }
    /// The chunk's scale tiles: [C/16][D/G][16] fp16.
    template <int D, int C>
    KVQ_HD static void range(const CodecArgs& a, int cc, int, uint32_t& offset, uint32_t& bytes) {
      bytes = 2u * static_cast<uint32_t>(C * a.groups);
      offset = a.sec0 + static_cast<uint32_t>(cc) * bytes;
    }
    static constexpr bool kGroups = true;  // a scale per group of 2^group_shift k steps
    static constexpr int kMinGroupShift = kBits == 4 ? 1 : 0;  // int4: a lane word feeds two k steps
    template <int D, int C>
    KVQ_HD static void bfrags(const uint4* codes, int ks, const CodecArgs&, int lane, uint32_t (&b)[C / 8][2]) {
      if constexpr (kBits == 4) LaneWordKeys<E>::template decode<C, int4_pair>(codes, ks, lane, b);
      else LaneWordKeys<E>::template decode<C, int8_pair>(codes, ks, lane, b);
    }
    template <int D, int C>
    KVQ_HD static void scale_group(const uint8_t* const* prm, const CodecArgs& a, int lane, int gr,
                                   const float (&acc)[C / 8][4], float (&s)[C / 8][2]) {
      uint4 sc[C / 32];
      run_halves<C>(prm[0], a.groups, lane & 3, gr, sc);
      scale_tiles<C>(sc, 1.0f, acc, s);
    }

    // The integer path (KVQ_ATTENTION=fast; decode_kernel.cuh, int_scores): k steps of 32 channels by
    // mma.m16n8k32 on signed bytes, the query as two 8-bit digits (rows n and n + 8 of A). int8 codes enter as
    // they are; an int4 nibble q enters as the high half of a byte, 16 q exactly (no offset to subtract), so the
    // products carry a factor 2^kIntFactorLog2 that the row's scale takes back.
    static constexpr bool kIntScores = true;
    static constexpr int kIntFactorLog2 = kBits == 4 ? 4 : 0;
    /// The channel of k (0..31) in k32 step ks: int4 one lane word per lane (its even channels at k = 4i + j,
    /// its odd ones at 16 + 4i + j), int8 two (lane words 8 ks + i and 8 ks + 4 + i: channels 32 ks + k).
    template <int D>
    KVQ_HD static constexpr int channel32(int ks, int k) {
      if constexpr (kBits == 4) return 32 * ks + 8 * ((k & 15) >> 2) + 2 * (k & 3) + (k >> 4);
      else return 32 * ks + k;
    }
    /// The signed-byte B fragments of k32 step ks for the chunk's C / 8 tiles (tile 4h + x: word x of piece h).
    template <int D, int C>
    KVQ_HD static void int_bfrags(const uint4* codes, int ks, const CodecArgs&, int lane, uint32_t (&b)[C / 8][2]) {
KVQ_UNROLL
      for (int h = 0; h < C / 32; ++h) {
        if constexpr (kBits == 4) {
          const uint4 p = codes[32 * (ks * (C / 32) + h) + lane];
KVQ_UNROLL
          for (int x = 0; x < 4; ++x) {
            b[4 * h + x][0] = (word(p, x) << 4) & 0xF0F0F0F0u;  // nibbles 0, 2, 4, 6 times 16
            b[4 * h + x][1] = word(p, x) & 0xF0F0F0F0u;         // nibbles 1, 3, 5, 7 times 16
          }
        } else {
          const uint4 p0 = codes[32 * (2 * ks * (C / 32) + h) + lane];
          const uint4 p1 = codes[32 * ((2 * ks + 1) * (C / 32) + h) + lane];
KVQ_UNROLL
          for (int x = 0; x < 4; ++x) {
            b[4 * h + x][0] = word(p0, x);
            b[4 * h + x][1] = word(p1, x);
          }
        }
      }
    }
    /// Adds group gr's integer tiles to the scores: per token 256 P0 + P1 (rows n, n + 8: the query's two digits)
    /// joined in int32 (|.| <= 64 x 32512 x 127 < 2^31), converted once and times the token's fp16 scale.
    template <int D, int C>
    KVQ_HD static void scale_int_group(const uint8_t* const* prm, const CodecArgs& a, int lane, int gr,
                                       const int (&acc)[C / 8][4], float (&s)[C / 8][2]) {
      uint4 sc[C / 32];
      run_halves<C>(prm[0], a.groups, lane & 3, gr, sc);
KVQ_UNROLL
      for (int jj = 0; jj < C / 8; ++jj) {
        s[jj][0] = fmaf(run_at(sc, jj), static_cast<float>(acc[jj][0] * 256 + acc[jj][2]), s[jj][0]);
        s[jj][1] = fmaf(run_at(sc, C / 8 + jj), static_cast<float>(acc[jj][1] * 256 + acc[jj][3]), s[jj][1]);
      }
    }
  };

  struct Value {
    static constexpr bool kBf16 = false, kDense = kBits == 4, kBulk = false;  // int4: 128 registers suffice
    static constexpr int kChunk = 32, kRanges = 1;
    static constexpr int kPiecesPerTile = kBits == 4 ? 1 : 2;  // pieces of 4 channels x 8 tokens
    static constexpr bool kFixedSteps = true;
    /// Piece r * kPiecesPerTile + h: channels lane_tile_channel(4r + e, n) of tokens 8i .. 8i + 7 (int8: 8i + 4h ..).
    template <int D, int DP, int C>
    static constexpr int pieces() {
      static_assert(C == 32, "int values: chunks of 32 tokens");
      return DP / 32 * kPiecesPerTile;
    }
    template <int D, int C>
    static constexpr uint32_t chunk_bytes() {
      return C * D * kBits / 8;
    }
    /// Its piece 0, then k's step: tile r lies 2 r 16-channel tiles on, int8's piece h = 1 a lane word (D / 16
    /// 64-byte rows) on.
    template <int D, int DP, int C>
    KVQ_HD static int piece(const CodecArgs&, int lane, int k, int pc) {
      const int n = lane >> 2, i = lane & 3;
      return 64 * (8 * i / E * (D / 16) + lane_tile_k16(pc, 0, n)) + 16 * (n & 3) +
             64 * (D / 16) * (k % kPiecesPerTile) + 128 * (k / kPiecesPerTile);
    }
    template <int D, int DP, int C>
    KVQ_HD static void range(const CodecArgs& a, int cc, int, uint32_t& offset, uint32_t& bytes) {
      bytes = 2u * static_cast<uint32_t>(C * a.groups);
      offset = a.sec0 + static_cast<uint32_t>(cc) * bytes;
    }
    KVQ_HD static constexpr int channel(int j, int col) { return lane_tile_channel(j, col); }
    KVQ_HD static constexpr int token_at(int vs, int e) {
      if constexpr (kBits == 4) return 2 * vs + (e >> 1) + 4 * (e & 1);  // pairs (0,4) (1,5) | (2,6) (3,7)
      else return 4 * vs + (e >> 1) + 2 * (e & 1);                       // pairs (0,2) (1,3) | (4,6) (5,7)
    }
    template <int C>
    KVQ_HD static void weights(const uint8_t* const*, int, float (&w)[C / 4]) {
KVQ_UNROLL
      for (int t = 0; t < C / 4; ++t) w[t] = 1.0f;
    }
    template <int D, int DP, int C>
    KVQ_HD static void bfrags(const uint4* codes, const uint8_t* const* prm, const CodecArgs& a, int lane, int j,
                              int pc, uint32_t (&b)[C / 16][2]) {
      const int n = lane >> 2;
      uint4 run[1];
      run_halves<C>(prm[0], a.groups, lane & 3, (pc + 32 * (j >> 2) + 16 * (n >> 2)) >> a.group_log2, run);
      code_bfrags<C>(codes, a, lane, j, b);
KVQ_UNROLL
      for (int vs = 0; vs < C / 16; ++vs)
KVQ_UNROLL
        for (int h = 0; h < 2; ++h) b[vs][h] = h2_mul(b[vs][h], token_pair(run[0], vs, h));
    }
    /// The codes of tile j as exact fp16, unscaled: b[vs][h] holds the lane's tokens token_at(vs, 2h), (vs, 2h + 1).
    template <int C>
    KVQ_HD static void code_bfrags(const uint4* codes, const CodecArgs&, int lane, int j, uint32_t (&b)[C / 16][2]) {
      const int r = j >> 2, e = j & 3;
KVQ_UNROLL
      for (int vs = 0; vs < C / 16; ++vs) {
        if constexpr (kBits == 4) {
          const uint32_t w = word(codes[32 * r + lane], e);
          b[vs][0] = int4_pair(w, 2 * vs);
          b[vs][1] = int4_pair(w, 2 * vs + 1);
        } else {
          const uint32_t w = word(codes[32 * (2 * r + vs) + lane], e);
          b[vs][0] = int8_pair(w, 0);
          b[vs][1] = int8_pair(w, 1);
        }
      }
    }

    // The fast path (KVQ_ATTENTION=fast; decode_kernel.cuh, accumulate_values_fast): int4 values in groups of 32 or
    // 64 channels, whose 32-channel blocks share a scale per token, take the scales into the weights (one fp16
    // product p s per token and block: kFastBlockScales) and their codes unscaled. The weights come without the
    // kernel's 2^12 (kFastWeightLog2 = 0): p <= 1, so p s stays below fp16's maximum for every fp16 scale. int8
    // values keep the exact path: the weights' fp16 rounding (2^-10) is not a tenth of int8's own error.
    static constexpr bool kFastValues = kBits == 4, kFastBlockScales = true;
    static constexpr int kFastWeightLog2 = 0;
    KVQ_HD static bool fast_values(const CodecArgs& a) { return a.group_log2 >= 5; }
    /// The B fragments of the weights for the 32 channels pc + 32 r ..: pw[vs][h] = {p s, p s} of the tokens of
    /// code_bfrags' b[vs][h], from the weights as fp16 pairs in the same order (ph).
    template <int C>
    KVQ_HD static void fast_weights(const uint8_t* const* prm, const CodecArgs& a, int lane, int pc, int r,
                                    const uint32_t (&ph)[C / 16][2], uint32_t (&pw)[C / 16][2]) {
      uint4 run[1];
      run_halves<C>(prm[0], a.groups, lane & 3, (pc + 32 * r) >> a.group_log2, run);
KVQ_UNROLL
      for (int vs = 0; vs < C / 16; ++vs)
KVQ_UNROLL
        for (int h = 0; h < 2; ++h) pw[vs][h] = h2_mul(ph[vs][h], token_pair(run[0], vs, h));
    }

   private:
    /// The scales of the tokens token_at(vs, 2h), token_at(vs, 2h + 1) from the lane's run of 8.
    KVQ_HD static uint32_t token_pair(const uint4& run, int vs, int h) {
      return half_pair(run, run, token_at(vs, 2 * h), token_at(vs, 2 * h + 1));
    }
  };
};

// ---- kivi:2 / kivi:3 / kivi:4 (Kivi): unsigned b-bit codes in IntGroup's tiles (E = 32 / b per lane) ----------
// Keys: x_c = m_c + s_c u per channel of the block, so the score is <q o s, u> + <q, m>: the query fragments are
// rebuilt per chunk (q o s, split hi + lo) and the constant added to the tile. Values: one (m, s) per token and
// group, applied to the decoded fp16 code (fma, rounded once), or on the fast value path moved onto the weights.
// kivi:3 reads its codes' low two bits as kivi:2's (the lanes' pieces, E = 16) and their high bits from the block's
// second plane (CodecArgs::sec2, layout::Kivi::plane_offset(1)): the chunk's part of that plane is one more
// parameter range (keys: 16-token x 32-channel tiles, values: 32-token x 16-channel tiles, C D / 8 bytes a chunk),
// each lane word's high bits a 16-bit half of one of its words; a code is the 2-bit code plus 4 x the high bit.
template <int kBits>
struct KiviTraits {
  static_assert(kBits >= 2 && kBits <= 4, "kivi:2, kivi:3 and kivi:4 have kernels");
  static constexpr bool kHigh = kBits == 3;           // kivi:3: the high bits' plane
  static constexpr int kLowBits = kHigh ? 2 : kBits;  // of the lanes' codes
  static constexpr int E = 32 / kLowBits;             // codes per 32-bit lane

  /// kivi:3: the range of the chunk's part of the high plane (C tokens x D channels, a bit each).
  template <int D, int C>
  KVQ_HD static void high_range(const CodecArgs& a, int cc, uint32_t& offset, uint32_t& bytes) {
    bytes = static_cast<uint32_t>(C * D / 8);
    offset = a.sec2 + static_cast<uint32_t>(cc) * bytes;
  }

  struct Key : UnscaledKeyGroups, LaneWordKeys<E> {
    static constexpr bool kBf16 = false, kSplitB = false, kChunkA = true, kDense = false, kBulk = false;
    static constexpr bool kHighPlane = kHigh;  // decode_kernel.cuh's has_high_plane
    static constexpr int kChunk = 32, kRanges = kHigh ? 2 : 1;
    template <int D, int C>
    static constexpr uint32_t chunk_bytes() {
      return C * D * kLowBits / 8;
    }
    /// The block's minima and scales (d fp16 each, the scales 16-byte aligned after the minima); kivi:3: then the
    /// chunk's high bits (prm[1]).
    template <int D, int C>
    KVQ_HD static void range(const CodecArgs& a, int cc, int r, uint32_t& offset, uint32_t& bytes) {
      if (kHigh && r == 1) {
        high_range<D, C>(a, cc, offset, bytes);
        return;
      }
      offset = a.sec0;
      bytes = a.sec1 - a.sec0 + 2 * D;
    }
    static constexpr bool kGroups = false;  // one factor per token, after all k steps
    template <int D, int C>
      requires(!kHigh)
    KVQ_HD static void bfrags(const uint4* codes, int ks, const CodecArgs&, int lane, uint32_t (&b)[C / 8][2]) {
      LaneWordKeys<E>::template decode<C, kivi_pair<kBits>>(codes, ks, lane, b);
    }
    /// kivi:3: the high-plane words of the 4 tokens of the lane's piece (m, h) (lane word 4m + i of tokens
    /// (C / 8) n + 4h .. + 3; its 32-channel tile 2m + i / 2, the lane word's half i % 2), from prm[1]: tiles
    /// [C / 16][D / 32] of 16 tokens x 32 channels.
    template <int D, int C>
    KVQ_HD static uint4 high_words(const uint8_t* const* prm, int lane, int m, int h) {
      const int t = C / 8 * (lane >> 2) + 4 * h;
      return load16(prm[1] + 64 * ((t >> 4) * (D / 32) + 2 * m + ((lane & 3) >> 1)) + 4 * (t & 15));
    }
    /// kivi:3: calls f(4h + x, p, hw, x) for the chunk's C / 8 tiles of lane word m, p its piece h and hw the high
    /// words beside it (high_words(m, h)): bfrags and int_bfrags decode word x of each. f takes word x itself: so
    /// the SASS is that of the loop written out in each (given the words, nvcc orders int_bfrags' ors otherwise).
    template <int D, int C, class Fn>
    KVQ_HD static void for_high_tiles(const uint4* codes, const uint8_t* const* prm, int m, int lane, Fn&& f) {
KVQ_UNROLL
      for (int h = 0; h < C / 32; ++h) {
        const uint4 p = codes[32 * (m * (C / 32) + h) + lane];
        const uint4 hw = high_words<D, C>(prm, lane, m, h);
KVQ_UNROLL
        for (int x = 0; x < 4; ++x) f(4 * h + x, p, hw, x);
      }
    }
    /// kivi:3: LaneWordKeys::decode with each pair's high bits from the high plane.
    template <int D, int C>
      requires(kHigh)
    KVQ_HD static void bfrags(const uint4* codes, const uint8_t* const* prm, int ks, const CodecArgs&, int lane,
                              uint32_t (&b)[C / 8][2]) {
      constexpr int kSteps = LaneWordKeys<E>::kSteps;
      const int x0 = 2 * (ks % kSteps), half = lane & 1;
      for_high_tiles<D, C>(codes, prm, ks / kSteps, lane, [&](int t, const uint4& p, const uint4& hw, int x) {
        const uint32_t high = kivi3_high(word(hw, x), half);
        b[t][0] = u3_pair(word(p, x), high, x0);
        b[t][1] = u3_pair(word(p, x), high, x0 + 1);
      });
    }
    /// The fp16 scales (sv) and minima (mv) of lane word m's E channels, E (4 m + (lane & 3)) .., from the block's
    /// ranges: what prepare and int_prepare multiply the query by.
    KVQ_HD static void lane_word_ranges(const uint8_t* const* prm, const CodecArgs& a, int m, int lane,
                                        uint4 (&sv)[E / 8], uint4 (&mv)[E / 8]) {
      const uint8_t* mins = prm[0];
      const uint8_t* scales = prm[0] + (a.sec1 - a.sec0);
      const int c0 = E * (4 * m + (lane & 3));
KVQ_UNROLL
      for (int x = 0; x < E / 8; ++x) {
        sv[x] = load16(scales + 2 * c0 + 16 * x);
        mv[x] = load16(mins + 2 * c0 + 16 * x);
      }
    }
    /// The chunk's query fragments q o s into atab[32 ks + lane]; returns this lane's part of <q, m> (row n).
    /// qf: the queries' fp32 values at the fragment's k (2i, 2i+1, 2i+8, 2i+9) per (k step, lane).
    template <int D>
    KVQ_HD static float prepare(const uint8_t* const* prm, const CodecArgs& a, int lane, const float4* qf,
                                uint4* atab) {
      constexpr int kSteps = LaneWordKeys<E>::kSteps;
      float cst = 0;
KVQ_UNROLL
      for (int m = 0; m < D / E / 4; ++m) {
        uint4 sv[E / 8], mv[E / 8];
        lane_word_ranges(prm, a, m, lane, sv, mv);
KVQ_UNROLL
        for (int sg = 0; sg < kSteps; ++sg) {
          const int ks = kSteps * m + sg;
          const float4 q = qf[32 * ks + lane];
          // the lane word's channels 2sg, 2sg + E/2, 2sg + 1, 2sg + E/2 + 1 (k = 2i, 2i+1, 2i+8, 2i+9)
          const int e[4] = {2 * sg, 2 * sg + E / 2, 2 * sg + 1, 2 * sg + E / 2 + 1};
          cst = fmaf(q.x, run_at(mv, e[0]), cst);
          cst = fmaf(q.y, run_at(mv, e[1]), cst);
          cst = fmaf(q.z, run_at(mv, e[2]), cst);
          cst = fmaf(q.w, run_at(mv, e[3]), cst);
          atab[32 * ks + lane] = split_fragment<false>(q.x * run_at(sv, e[0]), q.y * run_at(sv, e[1]),
                                                       q.z * run_at(sv, e[2]), q.w * run_at(sv, e[3]));
        }
      }
      return cst;
    }

    // The integer path (KVQ_ATTENTION=fast; decode_kernel.cuh, int_scores and the kernel's per-block step): the
    // scores are f (s_max <u, w> + <x', m>) for the query row's x = f x', f = S of query_digits.hpp (x' =
    // x / f, |x'_c| <= 32512, built once per kernel block: int_query_values) and the block's s_max = max_c |s_c|.
    // Per block and query row the digits of w_c = x'_c s_c / s_max (|w_c| <= 32512) fill rows n (D0) and n + 8
    // (D1) of A (w = 256 D0 + D1), the codes enter mma.m16n8k32 as the bytes they are (0 .. 2^b - 1), and per token
    // 256 P0 + P1 = sum_c w_c u_c joins exactly in int32 (|.| <= 32512 x 15 x 256 < 2^27), times s_max plus
    // <x', m> in fp32; the row's f multiplies the scores in the softmax update.
    static constexpr bool kIntScores = true;
    static constexpr bool kIntBlockDigits = true;  // A: the block's digits (int_prepare), not the kernel block's
    static constexpr int kIntFactorLog2 = 0;
    static constexpr int kIntSteps = E / 8;  // k32 steps per lane word (kivi:2: 2, kivi:4: 1)
    /// The channel of k (0..31) in k32 step ks: lane i's word 4 (ks / kIntSteps) + i, its elements (E / 4) j +
    /// 2 (ks % kIntSteps) at k = 4i + j and those + 1 at k = 16 + 4i + j (kivi:4: channels 32 ks + 8i + 2j (+ 1);
    /// kivi:2: 64 (ks / 2) + 16i + 4j + 2 (ks % 2) (+ 1)).
    template <int D>
    KVQ_HD static constexpr int channel32(int ks, int k) {
      return E * (4 * (ks / kIntSteps) + ((k & 15) >> 2)) + E / 4 * (k & 3) + 2 * (ks % kIntSteps) + (k >> 4);
    }
    /// The byte B fragments of k32 step ks for the chunk's C / 8 tiles (tile 4h + x: word x of piece h): elements
    /// (E / 4) j + e of the lane word as byte j, e = 2 (ks % kIntSteps) (b0) and e + 1 (b1): one shift and mask each.
    template <int D, int C>
      requires(!kHigh)
    KVQ_HD static void int_bfrags(const uint4* codes, int ks, const CodecArgs&, int lane, uint32_t (&b)[C / 8][2]) {
      constexpr uint32_t kMask = kBits == 2 ? 0x03030303u : 0x0F0F0F0Fu;
      const int e = 2 * (ks % kIntSteps);
KVQ_UNROLL
      for (int h = 0; h < C / 32; ++h) {
        const uint4 p = codes[32 * ((ks / kIntSteps) * (C / 32) + h) + lane];
KVQ_UNROLL
        for (int x = 0; x < 4; ++x) {
          b[4 * h + x][0] = (word(p, x) >> (kBits * e)) & kMask;
          b[4 * h + x][1] = (word(p, x) >> (kBits * (e + 1))) & kMask;
        }
      }
    }
    /// kivi:3: the 2-bit codes' bytes plus 4 x their high bits (kivi3_byte_high), codes 0..7.
    template <int D, int C>
      requires(kHigh)
    KVQ_HD static void int_bfrags(const uint4* codes, const uint8_t* const* prm, int ks, const CodecArgs&, int lane,
                                  uint32_t (&b)[C / 8][2]) {
      const int e = 2 * (ks % kIntSteps), half = lane & 1;
      for_high_tiles<D, C>(codes, prm, ks / kIntSteps, lane, [&](int t, const uint4& p, const uint4& hw, int x) {
        const uint32_t high = kivi3_high_bytes(word(hw, x), half);
        b[t][0] = ((word(p, x) >> (2 * e)) & 0x03030303u) | kivi3_byte_high(high, e);
        b[t][1] = ((word(p, x) >> (2 * (e + 1))) & 0x03030303u) | kivi3_byte_high(high, e + 1);
      });
    }
    /// Adds the integer tiles to the scores: per token 256 P0 + P1 (rows n, n + 8), exact in int32, as fp32 (the
    /// kernel takes s_max and <x', m> in after the last group).
    template <int D, int C>
    KVQ_HD static void scale_int_group(const uint8_t* const*, const CodecArgs&, int, int, const int (&acc)[C / 8][4],
                                       float (&s)[C / 8][2]) {
KVQ_UNROLL
      for (int jj = 0; jj < C / 8; ++jj) {
        s[jj][0] += static_cast<float>(acc[jj][0] * 256 + acc[jj][2]);
        s[jj][1] += static_cast<float>(acc[jj][1] * 256 + acc[jj][3]);
      }
    }
    /// This lane's part of the block's max_c |s_c| as an fp16 pair (lane l: channels 8 l' .. 8 l' + 7, l' = l mod
    /// D / 8, without a branch; sign bits cleared: the kernel takes the larger half and its maximum over the warp).
    template <int D>
    KVQ_HD static uint32_t scale_max(const uint8_t* const* prm, const CodecArgs& a, int lane) {
      static_assert(D / 8 <= 32, "a lane's 8 scales");
      const uint4 sv = load16(prm[0] + (a.sec1 - a.sec0) + 16 * (lane % (D / 8)));
      return h2_abs_max(h2_abs_max(sv.x, sv.y), h2_abs_max(sv.z, sv.w));
    }
    /// The parts int_prepare splits a row's lane words into (two where a row has an even number of them, so that
    /// with G <= 4 the lanes of rows 4..7 can form half of rows 0..3's table: block_digits).
    template <int D>
    KVQ_HD static constexpr int int_parts() {
      return D / E / 4 % 2 == 0 ? 2 : 1;
    }
    /// Part `part` of the block's digit table for row-lane rl (query row rl >> 2, quad lane rl & 3; int_parts<D>()
    /// parts of its lane words): A fragments of w = x' s / s_max (sigma = 1 / s_max, 0 where every scale is 0) into
    /// atab[32 ks + rl] for the part's k32 steps; returns that part's <x', m> over rl's channels (one fp32 chain).
    /// xt: x' of the query rows as int_query_values lays them out ([KD / 32][2][32]: k = 4i + j, then k = 16 + 4i +
    /// j). v = x'_c (s_c sigma) rounds to an integer in the low bits of 1.5 2^23 + 128 + v (the fp32 add rounds to
    /// nearest even; |v| <= 32512 (1 + 2^-22)): bytes 1 and 0 of 128 + v are D0 and D1 ^ 0x80.
    template <int D>
    KVQ_HD static float int_prepare(const uint8_t* const* prm, const CodecArgs& a, int rl, int part, const float4* xt,
                                    float sigma, uint4* atab) {
      constexpr int kWords = D / E / 4 / int_parts<D>();  // lane words per part
      float cst = 0;
KVQ_UNROLL
      for (int mm = 0; mm < kWords; ++mm) {
        const int m = kWords * part + mm;
        uint4 sv[E / 8], mv[E / 8];
        lane_word_ranges(prm, a, m, rl, sv, mv);
KVQ_UNROLL
        for (int sg = 0; sg < kIntSteps; ++sg) {
          const int ks = kIntSteps * m + sg;
          uint32_t w[4];
KVQ_UNROLL
          for (int r = 0; r < 2; ++r) {
            const float4 q = xt[32 * (2 * ks + r) + rl];
            const float qx[4] = {q.x, q.y, q.z, q.w};
            uint32_t u[4];
KVQ_UNROLL
            for (int j = 0; j < 4; ++j) {
              const int e = E / 4 * j + 2 * sg + r;
              cst = fmaf(qx[j], run_at(mv, e), cst);
              u[j] = float_bits(fmaf(qx[j], run_at(sv, e) * sigma, 0x1.8p23f + 128.0f));
            }
            const uint32_t t01 = prmt(u[0], u[1], 0x5140u), t23 = prmt(u[2], u[3], 0x5140u);
            w[2 * r] = prmt(t01, t23, 0x7632u);                // D0: bytes 1
            w[2 * r + 1] = prmt(t01, t23, 0x5410u) ^ 0x80808080u;  // D1: bytes 0
          }
          atab[32 * ks + rl] = make_uint4(w[0], w[1], w[2], w[3]);
        }
      }
      return cst;
    }
  };

  struct Value {
    static constexpr bool kBf16 = false, kDense = false, kBulk = false;
    static constexpr bool kHighPlane = kHigh;
    static constexpr int kChunk = 4 * E, kRanges = kHigh ? 3 : 2;  // a lane word holds the lane's C / 4 tokens
    static constexpr bool kFixedSteps = true;
    /// Piece r: channels lane_tile_channel(4r + e, n) of the lane's E tokens (C / 4) i .. (C / 4) i + E - 1.
    template <int D, int DP, int C>
    static constexpr int pieces() {
      static_assert(C == kChunk, "kivi values: chunks of 4 lane words of tokens (kivi:2: 64, kivi:4: 32)");
      return DP / 32;
    }
    template <int D, int C>
    static constexpr uint32_t chunk_bytes() {
      return C * D * kLowBits / 8;
    }
    /// Its piece 0, then k's step (tile k: 2 k 16-channel tiles on).
    template <int D, int DP, int C>
    KVQ_HD static int piece(const CodecArgs&, int lane, int k, int pc) {
      const int n = lane >> 2, a = lane & 3;
      return 64 * (a * (D / 16) + lane_tile_k16(pc, 0, n)) + 16 * (n & 3) + 128 * k;
    }
    /// The chunk's minima (r = 0) and scales (r = 1): [C/16][D/G][16] fp16 each; kivi:3: then its high bits (r = 2).
    template <int D, int DP, int C>
    KVQ_HD static void range(const CodecArgs& a, int cc, int r, uint32_t& offset, uint32_t& bytes) {
      if (kHigh && r == 2) {
        high_range<D, C>(a, cc, offset, bytes);
        return;
      }
      bytes = 2u * static_cast<uint32_t>(C * a.groups);
      offset = (r == 0 ? a.sec0 : a.sec1) + static_cast<uint32_t>(cc) * bytes;
    }
    KVQ_HD static constexpr int channel(int j, int col) { return lane_tile_channel(j, col); }
    /// Pair x of the lane word holds tokens (x, x + E / 2): value step vs takes pairs 2vs and 2vs + 1.
    KVQ_HD static constexpr int token_at(int vs, int e) { return 2 * vs + (e >> 1) + E / 2 * (e & 1); }
    template <int C>
    KVQ_HD static void weights(const uint8_t* const*, int, float (&w)[C / 4]) {
KVQ_UNROLL
      for (int t = 0; t < C / 4; ++t) w[t] = 1.0f;
    }
    template <int D, int DP, int C>
    KVQ_HD static void bfrags(const uint4* codes, const uint8_t* const* prm, const CodecArgs& a, int lane, int j,
                              int pc, uint32_t (&b)[C / 16][2]) {
      const int n = lane >> 2, i = lane & 3;
      const int gr = (pc + 32 * (j >> 2) + 16 * (n >> 2)) >> a.group_log2;
      uint4 m[C / 32], s[C / 32];
      run_halves<C>(prm[0], a.groups, i, gr, m);
      run_halves<C>(prm[1], a.groups, i, gr, s);
      if constexpr (kHigh) code_bfrags<D, C>(codes, prm, a, lane, j, pc, b);
      else code_bfrags<C>(codes, a, lane, j, b);
KVQ_UNROLL
      for (int vs = 0; vs < C / 16; ++vs)
KVQ_UNROLL
        for (int h = 0; h < 2; ++h) b[vs][h] = h2_fma(b[vs][h], token_pair(s, vs, h), token_pair(m, vs, h));
    }
    /// The codes u of tile j as exact fp16 integers: b[vs][h] holds pair 2 vs + h of the lane word, the lane's
    /// tokens token_at(vs, 2h), token_at(vs, 2h + 1).
    template <int C>
      requires(!kHigh)
    KVQ_HD static void code_bfrags(const uint4* codes, const CodecArgs&, int lane, int j, uint32_t (&b)[C / 16][2]) {
      const uint32_t w = word(codes[32 * (j >> 2) + lane], j & 3);
KVQ_UNROLL
      for (int vs = 0; vs < C / 16; ++vs)
KVQ_UNROLL
        for (int h = 0; h < 2; ++h) b[vs][h] = kivi_pair<kBits>(w, 2 * vs + h);
    }
    /// kivi:3: the same with the high bits of the lane word (channel lane_tile_channel(j, n) of the part starting at
    /// pc, the lane's tokens (C / 4) i ..) from prm[2]: tiles [C / 32][D / 16] of 32 tokens x 16 channels, the lane's
    /// 16 tokens the half i % 2 of word 4 (n % 4) + j % 4 of tile (i / 2, lane_tile_k16(pc, j / 4, n)).
    template <int D, int C>
      requires(kHigh)
    KVQ_HD static void code_bfrags(const uint4* codes, const uint8_t* const* prm, const CodecArgs&, int lane, int j,
                                   int pc, uint32_t (&b)[C / 16][2]) {
      const int n = lane >> 2, i = lane & 3;
      const uint32_t w = word(codes[32 * (j >> 2) + lane], j & 3);
      const uint32_t hw = *reinterpret_cast<const uint32_t*>(
          prm[2] + 64 * ((i >> 1) * (D / 16) + lane_tile_k16(pc, j >> 2, n)) + 16 * (n & 3) + 4 * (j & 3));
      const uint32_t high = kivi3_high(hw, i & 1);
KVQ_UNROLL
      for (int vs = 0; vs < C / 16; ++vs)
KVQ_UNROLL
        for (int h = 0; h < 2; ++h) b[vs][h] = u3_pair(w, high, 2 * vs + h);
    }

    // The fast path (KVQ_ATTENTION=fast; decode_kernel.cuh, accumulate_values_fast): sum_t p_t v_tc =
    // sum_t (p_t s_t,g) u_tc + sum_t p_t m_t,g. The scales go into the weights (one fp16 product p s per token and
    // 32-channel block: groups of 32 channels or more), the codes enter unscaled, and the minima's term, one number
    // per group and query row, comes from one more mma per value step (kFastOffsets): A = the minima of group n in
    // row n (offset_afrags), B = the weights p, the same fp16 operand that the block products start from. The
    // weights come without the kernel's 2^12 (p <= 1: p s stays below fp16's maximum).
    static constexpr bool kFastValues = true, kFastBlockScales = true, kFastOffsets = true;
    static constexpr int kFastWeightLog2 = 0;
    KVQ_HD static bool fast_values(const CodecArgs& a) { return a.group_log2 >= 5; }
    /// The B fragments of the weights for the 32 channels pc + 32 r ..: pw[vs][h] = p s of the tokens of
    /// code_bfrags' b[vs][h], from the weights as fp16 pairs in the same order (ph).
    template <int C>
    KVQ_HD static void fast_weights(const uint8_t* const* prm, const CodecArgs& a, int lane, int pc, int r,
                                    const uint32_t (&ph)[C / 16][2], uint32_t (&pw)[C / 16][2]) {
      uint4 s[C / 32];
      run_halves<C>(prm[1], a.groups, lane & 3, (pc + 32 * r) >> a.group_log2, s);
KVQ_UNROLL
      for (int vs = 0; vs < C / 16; ++vs)
KVQ_UNROLL
        for (int h = 0; h < 2; ++h) pw[vs][h] = h2_mul(ph[vs][h], token_pair(s, vs, h));
    }
    /// The A fragments of the minima (rows n + 8 zero): row n holds group offset_group(n) of the part starting at
    /// channel pc, am[vs][h] its minima of the lane's tokens token_at(vs, 2h), token_at(vs, 2h + 1).
    template <int C>
    KVQ_HD static void offset_afrags(const uint8_t* const* prm, const CodecArgs& a, int lane, int pc,
                                     uint32_t (&am)[C / 16][2]) {
      const int gr = (pc >> a.group_log2) + (lane >> 2);  // rows past the part's groups: any group, never read
      uint4 m[C / 32];
      run_halves<C>(prm[0], a.groups, lane & 3, gr < a.groups ? gr : a.groups - 1, m);
KVQ_UNROLL
      for (int vs = 0; vs < C / 16; ++vs)
KVQ_UNROLL
        for (int h = 0; h < 2; ++h) am[vs][h] = token_pair(m, vs, h);
    }
    /// The row of offset_afrags that holds the group of channel pc + c (c < DP).
    KVQ_HD static int offset_row(const CodecArgs& a, int pc, int c) {
      return ((pc + c) >> a.group_log2) - (pc >> a.group_log2);
    }

   private:
    /// {token x, token x + E / 2} of a lane's run (run_halves) as fp16: pair x = 2 vs + h.
    template <int N>
    KVQ_HD static uint32_t token_pair(const uint4 (&r)[N], int vs, int h) {
      const int x = 2 * vs + h, y = x + E / 2;
      return half_pair(r[x >> 3], r[y >> 3], x & 7, y & 7);
    }
  };
};

// ---- turbo_mse:b (TurboMse, LaneCodes; b = 1..4): y = ||x|| c[idx] ----------------------------------------------
// Indices become fp16 levels (times 2^12) by byte-permute table lookups, exact: the codecs round their levels to
// fp16 precision (FloatCodebook), so keys take one product per k step like the int codes. The norm (times 2^-12) scales the score tile (keys) or the
// softmax weight (values). A lane reads nibble lane i of every 32-element chunk from its low-bits tile
// lane_code_tile(i) and, for b = 1 and 3, the 1-bit tile.
template <int kBits>
struct TurboMseTraits {
  static_assert(kBits >= 1 && kBits <= 4, "turbo_mse:1..4");

  /// Nibble lane (lane & 3) of a chunk from the words of its pieces.
  KVQ_HD static uint32_t nibbles(const uint4& low, const uint4& bit, int x, int lane) {
    return lane_nibbles<kBits>(word(low, x), word(bit, x), lane & 3);
  }
  // The lanes of a quad n (lane = 4 n + v) read the same rows of their tiles (b = 3: each 2-bit tile for two of them,
  // the 1-bit tile for all four), so a region of a chunk (keys: 32 channels x C tokens' 8 quads of 4 tokens; values:
  // a pair of 16-channel tiles) holds each quad's row of each of its b tiles once, as the codes lie (128 b bytes):
  // tile u of quad n at slot b n + u, which lane b n + u copies (lanes from 8 b on copy nothing: lane_copies). A
  // quarter warp (quads 2m, 2m + 1) then reads distinct slots on distinct banks, and the low-bits slot is lane >> 2,
  // lane >> 1 and lane for b = 1, 2, 4 (b = 4: the lane's own, as without sharing). A lane's pieces lie at the same
  // steps from its first for every lane (piece_source: one address per lane, the steps as immediate offsets).
  static constexpr int kRegionSlots = 8 * kBits;
  KVQ_HD static constexpr int region_copy_slot(int r, int lane) { return kRegionSlots * r + lane; }
  /// Region r's slots of the lane's low-bits tile and of the 1-bit tile (read where b = 1, 3).
  KVQ_HD static constexpr int low_slot(int r, int lane) {
    if constexpr (kBits == 3) return kRegionSlots * r + 3 * (lane >> 2) + ((lane >> 1) & 1);
    else return kRegionSlots * r + (lane >> (kBits == 4 ? 0 : kBits == 2 ? 1 : 2));
  }
  KVQ_HD static constexpr int bit_slot(int r, int lane) { return kRegionSlots * r + kBits * (lane >> 2) + kBits - 1; }

  struct Key : TokenNormKeys {
    static constexpr bool kBf16 = false, kSplitB = false, kChunkA = false, kDense = false, kBulk = false;
    static constexpr bool kFixedSteps = true;
    static constexpr int kChunk = 32, kRanges = 1;
    /// Region k = kk (C / 32) + h: tokens (C / 8) n + 4h .. + 3 of the 32-channel chunk kk.
    template <int D, int C>
    static constexpr int pieces() {
      static_assert(C == 32 || C == 64, "turbo_mse keys: chunks of 32 or 64 tokens");
      return D / 32 * (C / 32);
    }
    template <int D, int C>
    static constexpr int slots() {
      return kRegionSlots * pieces<D, C>();
    }
    KVQ_HD static constexpr int copy_slot(int k, int lane) { return region_copy_slot(k, lane); }
    template <int D, int C>
    static constexpr uint32_t chunk_bytes() {
      return C * D * kBits / 8;
    }
    /// Lane b n + u's row of tile u in region k (read for lanes below 8 b): its row in region 0 (first token t =
    /// (C / 8) n) plus k's step (tokens t + 4h share t's 16-token tile).
    template <int D, int C>
    KVQ_HD static int piece(const CodecArgs&, int lane, int k) {
      const int h = k % (C / 32), kk = k / (C / 32);
      const int t = C / 8 * (lane / kBits);
      return 64 * (kBits * (t >> 4) * (D / 32) + lane % kBits) + 4 * (t & 15) + 64 * kBits * kk + 16 * h;
    }
    template <int D>
    KVQ_HD static constexpr int channel(int ks, int k) {
      return 32 * (ks >> 1) + 8 * ((k & 7) >> 1) + 4 * (ks & 1) + (k & 1) + 2 * (k >> 3);
    }
    static constexpr bool kGroups = false;  // one factor per token, after all k steps
    template <int D, int C>
    KVQ_HD static void bfrags(const uint4* codes, int ks, const CodecArgs& a, int lane, uint32_t (&b)[C / 8][2]) {
      decode<C>(codes, ks, a.table_hi, lane, b);
    }
    template <int D, int C>
    KVQ_HD static void scale_group(const uint8_t* const* prm, const CodecArgs&, int lane, int,
                                   const float (&acc)[C / 8][4], float (&s)[C / 8][2]) {
      uint4 nr[C / 32];
      run_halves<C>(prm[0], 1, lane & 3, 0, nr);
      scale_tiles<C>(nr, 0x1p-12f, acc, s);
    }

    // The integer path (KVQ_ATTENTION=fast; decode_kernel.cuh, int_scores) up to kByteLevelMaxBits (4-bit keys
    // keep the fp16 path): k steps of 32 channels by mma.m16n8k32 on signed bytes, the query as two 8-bit digits,
    // the codes' levels as signed bytes l_j (CodecArgs::levels_i8: one byte permute per 4 codes, against two fp16
    // ones per 2 codes) and the token's norm times level_unit after all k steps.
    static constexpr bool kIntScores = kBits <= kByteLevelMaxBits;
    static constexpr int kIntFactorLog2 = 0;
    /// The channel of k (0..31) in k32 step ks: lane i's nibble word holds channels 32 ks + 8i .. 8i + 7, its
    /// low half at k = 4i + j, its high half at 16 + 4i + j.
    template <int D>
    KVQ_HD static constexpr int channel32(int ks, int k) {
      return 32 * ks + 8 * ((k & 15) >> 2) + 4 * (k >> 4) + (k & 3);
    }
    /// The signed-byte B fragments of k32 step ks for the chunk's C / 8 tiles (tile 4h + x: word x of piece h).
    template <int D, int C>
    KVQ_HD static void int_bfrags(const uint4* codes, int ks, const CodecArgs& a, int lane,
                                  uint32_t (&b)[C / 8][2]) {
      static_assert(kIntScores, "the integer path takes turbo_mse:1-3 keys");
KVQ_UNROLL
      for (int h = 0; h < C / 32; ++h) {
        const int r = ks * (C / 32) + h;
        const uint4 low = codes[low_slot(r, lane)], bit = codes[bit_slot(r, lane)];
KVQ_UNROLL
        for (int x = 0; x < 4; ++x) {
          const uint32_t nib = nibbles(low, bit, x, lane);
          b[4 * h + x][0] = lookup_i8(nib, a.levels_i8);
          b[4 * h + x][1] = lookup_i8(nib >> 16, a.levels_i8);
        }
      }
    }
    /// Adds the integer tiles to the scores: per token 256 P0 + P1 (the query's two digits) joined in int32
    /// (|.| <= 256 x 127 x 127 x 257 < 2^31), times the token's fp16 norm times level_unit.
    template <int D, int C>
    KVQ_HD static void scale_int_group(const uint8_t* const* prm, const CodecArgs& a, int lane, int,
                                       const int (&acc)[C / 8][4], float (&s)[C / 8][2]) {
      uint4 nr[C / 32];
      run_halves<C>(prm[0], 1, lane & 3, 0, nr);
KVQ_UNROLL
      for (int jj = 0; jj < C / 8; ++jj) {
        s[jj][0] = fmaf(run_at(nr, jj) * a.level_unit, static_cast<float>(acc[jj][0] * 256 + acc[jj][2]), s[jj][0]);
        s[jj][1] = fmaf(run_at(nr, C / 8 + jj) * a.level_unit, static_cast<float>(acc[jj][1] * 256 + acc[jj][3]),
                        s[jj][1]);
      }
    }

   private:
    /// Indices 8i + 4 (ks & 1) .. + 3 of the channel chunk ks / 2 for the C / 8 tiles (tile 4h + x: word x).
    template <int C>
    KVQ_HD static void decode(const uint4* codes, int ks, const uint32_t (&table)[8], int lane,
                              uint32_t (&b)[C / 8][2]) {
KVQ_UNROLL
      for (int h = 0; h < C / 32; ++h) {
        const int r = (ks >> 1) * (C / 32) + h;
        const uint4 low = codes[low_slot(r, lane)], bit = codes[bit_slot(r, lane)];
KVQ_UNROLL
        for (int x = 0; x < 4; ++x) {
          const uint32_t nib = nibbles(low, bit, x, lane);
          lookup<kBits>(ks & 1 ? nib >> 16 : nib, table, b[4 * h + x][0], b[4 * h + x][1]);
        }
      }
    }
  };

  struct Value : TokenNormValues {
    static constexpr bool kBf16 = false, kDense = false, kBulk = false;
    static constexpr bool kFixedSteps = true;
    static constexpr int kChunk = 32, kRanges = 1;
    /// Region r: channels lane_tile_channel(4r + e, n) of the chunk's 32-token lanes (nibble lane i: tokens 8i ..
    /// 8i + 7).
    template <int D, int DP, int C>
    static constexpr int pieces() {
      static_assert(C == 32, "turbo_mse values: chunks of 32 tokens");
      return DP / 32;
    }
    template <int D, int DP, int C>
    static constexpr int slots() {
      return kRegionSlots * pieces<D, DP, C>();
    }
    KVQ_HD static constexpr int copy_slot(int k, int lane) { return region_copy_slot(k, lane); }
    template <int D, int C>
    static constexpr uint32_t chunk_bytes() {
      return C * D * kBits / 8;
    }
    /// Lane b n + u's row of tile u in region k (read for lanes below 8 b): its row in region 0 plus k's step
    /// (region k lies 2 k 16-channel tiles on).
    template <int D, int DP, int C>
    KVQ_HD static int piece(const CodecArgs&, int lane, int k, int pc) {
      const int n = lane / kBits;
      return 64 * (kBits * lane_tile_k16(pc, 0, n) + lane % kBits) + 16 * (n & 3) + 128 * kBits * k;
    }
    KVQ_HD static constexpr int channel(int j, int col) { return lane_tile_channel(j, col); }
    KVQ_HD static constexpr int token_at(int vs, int e) { return 4 * vs + e; }
    template <int D, int DP, int C>
    KVQ_HD static void bfrags(const uint4* codes, const uint8_t* const*, const CodecArgs& a, int lane, int j, int,
                              uint32_t (&b)[C / 16][2]) {
      code_bfrags<C>(codes, a, lane, j, b);
    }
    template <int C>
    KVQ_HD static void code_bfrags(const uint4* codes, const CodecArgs& a, int lane, int j, uint32_t (&b)[C / 16][2]) {
      const int r = j >> 2, e = j & 3;
      const uint32_t nib = nibbles(codes[low_slot(r, lane)], codes[bit_slot(r, lane)], e, lane);
      lookup<kBits>(nib, a.table_hi, b[0][0], b[0][1]);
      lookup<kBits>(nib >> 16, a.table_hi, b[1][0], b[1][1]);
    }
    // The fast path (decode_kernel.cuh, accumulate_values_fast): the weights p times the token's norm (times 2^-12,
    // value_weights) as one fp16 operand, no lo part: p 2^12 norm 2^-12 <= norm, below fp16's maximum.
    static constexpr bool kFastValues = true, kFastBlockScales = false;
    static constexpr int kFastWeightLog2 = 12;
    KVQ_HD static bool fast_values(const CodecArgs&) { return true; }
  };
  static_assert(kSharesPieces<Key> && kSharesPieces<Value>, "lanes from 8 b on copy nothing");
};

}  // namespace kvq::cuda::detail

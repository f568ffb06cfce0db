// How the decode kernel (decode_kernel.cuh) reads each codec's block (include/kvq/block_layout.hpp) into tensor-core
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
// lane's own shared-memory slots (slot k of lane l at codes[32 k + l], codes the stage's first slot). Per-chunk
// parameters (scales, minima, norms) are `ranges` of the block copied once per warp into shared memory (prm[r]).
// Codecs with kBulk instead take the chunk's codes whole, as they lie in the block (chunk_bytes at cc *
// chunk_bytes), by the copy engine; their fragments read that layout.
//
// Codes become exact fp16 integers without conversions (the 2^10 mantissa trick: 0x6400 | u is 1024 + u), with a
// per-group or per-token factor applied in fp32 to the score tiles (keys) or in fp16 to the decoded value (values,
// whose error budget is the output's, not the softmax's). Queries and softmax weights are fp32 split into hi + lo
// operands (rows n and n + 8 of A), so scores and sums keep fp32 accuracy.
#pragma once

#include <cstdint>

#include "cuda/fragment_ops.cuh"

namespace kvq::cuda::detail {

/// Run-time parameters of one codec's blocks.
struct CodecArgs {
  int T = 0;           ///< tokens per block
  int group = 0;       ///< int8/int4: channels per scale; kivi values: channels per (min, scale)
  int group_shift = 0; ///< int8/int4 keys: log2(group / 16), the k steps of 16 channels per scale
  int group_log2 = 0;  ///< log2(group)
  int groups = 0;      ///< d / group
  uint32_t sec0 = 0;   ///< int: scales; kivi: minima; turbo_mse, turbo_prod, qjl: norms (byte offset in the block)
  uint32_t sec1 = 0;   ///< kivi: scales; turbo_prod: signs
  uint32_t sec2 = 0;   ///< turbo_prod: residual norms
  const void* table = nullptr;  ///< vecinfer: the codebook the kernel copies into the block's shared memory
  uint32_t table_bytes = 0;     ///< its size, a multiple of 16
  uint32_t table_hi[4] = {};  ///< turbo_mse: levels * 2^12 as fp16, low bytes of levels 0-3, 4-7, high bytes 0-3, 4-7
  uint32_t table_lo[4] = {};  ///< the same for the remainders level * 2^12 - hi
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

/// The scales of the lane's run of 8 tokens (C = 32) of one group, from a chunk's [C/16][groups][16] fp16 tiles.
KVQ_HD uint4 run_scales(const uint8_t* prm, int groups, int i, int gr) {
  return load16(prm + 2 * (((i >> 1) * groups + gr) * 16 + 8 * (i & 1)));
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
// 3-bit LaneCodes (turbo_mse): nibble lane v of a 32-element chunk from its 2-bit plane word (tile v / 2) and its
// 1-bit plane word (tile 2): index j at bits 4j .. 4j + 2.
KVQ_HD uint32_t lane3_nibbles(uint32_t low_plane, uint32_t high_plane, int v) {
  const int rot = (34 - ((v + 2) & 3)) & 31;  // 0, 31, 2, 1: moves bit 4j + (v + 2) % 4 to bit 4j + 2
  return ((low_plane >> (2 * (v & 1))) & 0x33333333u) | (rotl(high_plane, rot) & 0x44444444u);
}
// Table lookup of 4 indices (the low 4 nibbles of nib) into fp16 levels: {level[n0], level[n1]}, {level[n2], ...}.
KVQ_HD void lookup4(uint32_t nib, const uint32_t (&t)[4], uint32_t& p01, uint32_t& p23) {
  const uint32_t lo = prmt(t[0], t[1], nib & 0xffffu), hi = prmt(t[2], t[3], nib & 0xffffu);
  p01 = prmt(lo, hi, 0x5140u);
  p23 = prmt(lo, hi, 0x7362u);
}

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
// The chunk's rows come whole (kBulk: the kernel copies the C x d keys and the C x d values with the copy engine,
// as they lie in the block), so the fragments read the block's own layout. Keys: lane (n, i) reads 16 bytes of
// token (C/8) n + jj (channels 8 (4m + i) ..), two k steps. Values: ldmatrix.trans of token rows, tile j = channels
// 8j .. 8j + 7 of the part. Chunks of 16 tokens: these pairs stream the most bytes for their arithmetic, and small
// stages let 12 warps share an SM.
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
    /// codes: the chunk's C x D values.
    template <int D, int C>
    KVQ_HD static void bfrags(const uint4* codes, int ks, const CodecArgs&, int lane, uint32_t (&b)[C / 8][2]) {
KVQ_UNROLL
      for (int jj = 0; jj < C / 8; ++jj) {
        const uint4 p = codes[(C / 8 * (lane >> 2) + jj) * (D / 8) + 4 * (ks >> 1) + (lane & 3)];
        b[jj][0] = ks & 1 ? p.z : p.x;
        b[jj][1] = ks & 1 ? p.w : p.y;
      }
    }
    template <int D, int C>
    KVQ_HD static void bfrags_lo(const uint4*, int, const CodecArgs&, int, uint32_t (&)[C / 8][2]) {}
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
    KVQ_HD static constexpr int token_at(int vs, int q) { return 4 * vs + q; }
    template <int C>
    KVQ_HD static void weights(const uint8_t* const*, int, float (&w)[C / 4]) {
KVQ_UNROLL
      for (int t = 0; t < C / 4; ++t) w[t] = 1.0f;
    }
    /// The 16 bytes of channels pc + 8j .. + 7 of the chunk's token t.
    template <int D>
    KVQ_HD static const uint8_t* row(const uint4* codes, int t, int j, int pc) {
      return reinterpret_cast<const uint8_t*>(codes) + 2 * (t * D + pc + 8 * j);
    }
    /// The chunk token at row r of matrix m (= 2 vs + h: the tokens of k = 8h .. 8h + 7 of value step vs; k = 2i' +
    /// e is lane i''s local token 4vs + 2h + e).
    template <int C>
    KVQ_HD static constexpr int row_token(int m, int r) {
      return C / 4 * (r >> 1) + 4 * (m >> 1) + 2 * (m & 1) + (r & 1);
    }
    /// Tile j for every value step: ldmatrix.trans of the token rows (x4: two steps, x2: one).
    template <int D, int DP, int C>
    KVQ_HD static void bfrags(const uint4* codes, const uint8_t* const*, const CodecArgs&, int lane, int j, int pc,
                              uint32_t (&b)[C / 16][2]) {
#if defined(__CUDA_ARCH__)
      const int m = lane >> 3, r = lane & 7;
      if constexpr (C == 32)
        ldmatrix_x4_trans(row<D>(codes, row_token<C>(m, r), j, pc), b[0][0], b[0][1], b[1][0], b[1][1]);
      else
        ldmatrix_x2_trans(row<D>(codes, row_token<C>(m & 1, r), j, pc), b[0][0], b[0][1]);
#else
      for (int m = 0; m < 2 * (C / 16); ++m) {
        uint32_t w = 0;
        for (int e = 0; e < 2; ++e) {
          const int r = 2 * (lane & 3) + e;  // the row this lane receives, from lane 8m + r's address
          const uint8_t* p = row<D>(codes, row_token<C>(m, r), j, pc) + 2 * (lane >> 2);
          w |= static_cast<uint32_t>(p[0] | p[1] << 8) << (16 * e);
        }
        b[m >> 1][m & 1] = w;
      }
#endif
    }
  };
};

// ---- int8 / int4 (IntGroup): keys tokens-in-lanes, values channels-in-lanes, fp16 scales in 16-token tiles -----
// The scale of a key group multiplies its score tile in fp32 (the k steps of a group accumulate apart); the scale of
// a value multiplies the decoded fp16 code (rounded once). Key groups must hold a multiple of 32 (int4) or 16 (int8)
// channels, value groups a multiple of 16 (DecodePlan checks).
template <int kBits>
struct IntTraits {
  static constexpr int E = 32 / kBits;  // elements per 32-bit lane

  struct Key {
    static constexpr bool kBf16 = false, kSplitB = false, kChunkA = false, kDense = kBits == 4, kBulk = false;
    static constexpr int kChunk = 32, kRanges = 1;
    /// Piece m: tokens 4n .. 4n + 3 of the lane word 4m + i (int4: channels 8 (4m + i) ..; int8: 4 (4m + i) ..).
    template <int D, int C>
    static constexpr int pieces() {
      static_assert(C == 32, "int keys: chunks of 32 tokens");
      return D / E / 4;
    }
    template <int D, int C>
    static constexpr uint32_t chunk_bytes() {
      return C * D * kBits / 8;
    }
    template <int D, int C>
    KVQ_HD static int piece(const CodecArgs&, int lane, int k) {
      const int t = 4 * (lane >> 2);
      return 64 * ((t >> 4) * (D / E) + 4 * k + (lane & 3)) + 4 * (t & 15);
    }
    /// The chunk's scale tiles: [C/16][D/G][16] fp16.
    template <int D, int C>
    KVQ_HD static void range(const CodecArgs& a, int cc, int, uint32_t& offset, uint32_t& bytes) {
      bytes = 2u * static_cast<uint32_t>(C * a.groups);
      offset = a.sec0 + static_cast<uint32_t>(cc) * bytes;
    }
    template <int D>
    KVQ_HD static constexpr int channel(int ks, int k) {
      const int i = (k & 7) >> 1;
      if constexpr (kBits == 4) return 8 * (4 * (ks >> 1) + i) + 2 * (ks & 1) + (k >> 3) + 4 * (k & 1);
      else return 16 * ks + 4 * i + (k >> 3) + 2 * (k & 1);
    }
    static constexpr bool kGroups = true;  // a scale per group of 2^group_shift k steps
    static constexpr int kMinGroupShift = kBits == 4 ? 1 : 0;  // int4: a lane word feeds two k steps
    template <int D, int C>
    KVQ_HD static void bfrags(const uint4* codes, int ks, const CodecArgs&, int lane, uint32_t (&b)[C / 8][2]) {
      const uint4 p = codes[32 * (kBits == 4 ? ks >> 1 : ks) + lane];  // tokens 4n .. 4n + 3: tiles jj
KVQ_UNROLL
      for (int jj = 0; jj < C / 8; ++jj) {
        if constexpr (kBits == 4) {
          b[jj][0] = int4_pair(word(p, jj), 2 * (ks & 1));      // elements (2σ, 2σ + 4)
          b[jj][1] = int4_pair(word(p, jj), 2 * (ks & 1) + 1);  // elements (2σ + 1, 2σ + 5)
        } else {
          b[jj][0] = int8_pair(word(p, jj), 0);  // elements (0, 2)
          b[jj][1] = int8_pair(word(p, jj), 1);  // elements (1, 3)
        }
      }
    }
    template <int D, int C>
    KVQ_HD static void bfrags_lo(const uint4*, int, const CodecArgs&, int, uint32_t (&)[C / 8][2]) {}
    template <int D, int C>
    KVQ_HD static void scale_group(const uint8_t* const* prm, const CodecArgs& a, int lane, int gr,
                                   const float (&acc)[C / 8][4], float (&s)[C / 8][2]) {
      const uint4 sc = run_scales(prm[0], a.groups, lane & 3, gr);
KVQ_UNROLL
      for (int jj = 0; jj < C / 8; ++jj) {
        s[jj][0] = fmaf(half_at(sc, jj), acc[jj][0] + acc[jj][2], s[jj][0]);
        s[jj][1] = fmaf(half_at(sc, 4 + jj), acc[jj][1] + acc[jj][3], s[jj][1]);
      }
    }
  };

  struct Value {
    static constexpr bool kBf16 = false, kDense = kBits == 4, kBulk = false;  // int4: 128 registers suffice
    static constexpr int kChunk = 32, kRanges = 1;
    static constexpr int kPiecesPerTile = kBits == 4 ? 1 : 2;  // pieces of 4 channels x 8 tokens
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
    template <int D, int DP, int C>
    KVQ_HD static int piece(const CodecArgs&, int lane, int k, int pc) {
      const int n = lane >> 2, i = lane & 3;
      const int a = 8 * i / E + (kBits == 8 ? (k & 1) : 0);
      const int r = k / kPiecesPerTile;
      return 64 * (a * (D / 16) + lane_tile_k16(pc, r, n)) + 16 * (n & 3);
    }
    template <int D, int DP, int C>
    KVQ_HD static void range(const CodecArgs& a, int cc, int, uint32_t& offset, uint32_t& bytes) {
      bytes = 2u * static_cast<uint32_t>(C * a.groups);
      offset = a.sec0 + static_cast<uint32_t>(cc) * bytes;
    }
    KVQ_HD static constexpr int channel(int j, int col) { return lane_tile_channel(j, col); }
    KVQ_HD static constexpr int token_at(int vs, int q) {
      if constexpr (kBits == 4) return 2 * vs + (q >> 1) + 4 * (q & 1);  // pairs (0,4) (1,5) | (2,6) (3,7)
      else return 4 * vs + (q >> 1) + 2 * (q & 1);                       // pairs (0,2) (1,3) | (4,6) (5,7)
    }
    template <int C>
    KVQ_HD static void weights(const uint8_t* const*, int, float (&w)[C / 4]) {
KVQ_UNROLL
      for (int t = 0; t < C / 4; ++t) w[t] = 1.0f;
    }
    template <int D, int DP, int C>
    KVQ_HD static void bfrags(const uint4* codes, const uint8_t* const* prm, const CodecArgs& a, int lane, int j,
                              int pc, uint32_t (&b)[C / 16][2]) {
      const int r = j >> 2, e = j & 3, n = lane >> 2;
      const uint4 sc = run_scales(prm[0], a.groups, lane & 3, (pc + 32 * r + 16 * (n >> 2)) >> a.group_log2);
KVQ_UNROLL
      for (int vs = 0; vs < C / 16; ++vs) {
        if constexpr (kBits == 4) {
          const uint32_t w = word(codes[32 * r + lane], e);
          b[vs][0] = h2_mul(int4_pair(w, 2 * vs), half_pair(sc, sc, 2 * vs, 2 * vs + 4));
          b[vs][1] = h2_mul(int4_pair(w, 2 * vs + 1), half_pair(sc, sc, 2 * vs + 1, 2 * vs + 5));
        } else {
          const uint32_t w = word(codes[32 * (2 * r + vs) + lane], e);
          b[vs][0] = h2_mul(int8_pair(w, 0), half_pair(sc, sc, 4 * vs, 4 * vs + 2));
          b[vs][1] = h2_mul(int8_pair(w, 1), half_pair(sc, sc, 4 * vs + 1, 4 * vs + 3));
        }
      }
    }
  };
};

// ---- kivi:2 (Kivi): unsigned 2-bit codes in IntGroup's tiles (16 per lane) -------------------------------------
// Keys: x_c = m_c + s_c u per channel of the block, so the score is <q o s, u> + <q, m>: the query fragments are
// rebuilt per chunk (q o s, split hi + lo) and the constant added to the tile. Values: one (m, s) per token and
// group, applied to the decoded fp16 code (fma, rounded once).
template <int kBits>
struct KiviTraits {
  static_assert(kBits == 2, "kivi:2 has a kernel");

  struct Key : UnscaledKeyGroups {
    static constexpr bool kBf16 = false, kSplitB = false, kChunkA = true, kDense = false, kBulk = false;
    static constexpr int kChunk = 32, kRanges = 1;
    /// Piece m * (C / 32) + h: tokens (C/8) n + 4h .. + 3 of the lane word 4m + i (channels 16 (4m + i) ..).
    template <int D, int C>
    static constexpr int pieces() {
      return D / 64 * (C / 32);
    }
    template <int D, int C>
    static constexpr uint32_t chunk_bytes() {
      return C * D / 4;
    }
    template <int D, int C>
    KVQ_HD static int piece(const CodecArgs&, int lane, int k) {
      const int t = C / 8 * (lane >> 2) + 4 * (k % (C / 32));
      return 64 * ((t >> 4) * (D / 16) + 4 * (k / (C / 32)) + (lane & 3)) + 4 * (t & 15);
    }
    /// The block's minima and scales (d fp16 each, the scales 16-byte aligned after the minima).
    template <int D, int C>
    KVQ_HD static void range(const CodecArgs& a, int, int, uint32_t& offset, uint32_t& bytes) {
      offset = a.sec0;
      bytes = a.sec1 - a.sec0 + 2 * D;
    }
    template <int D>
    KVQ_HD static constexpr int channel(int ks, int k) {
      return 16 * (4 * (ks >> 2) + ((k & 7) >> 1)) + 2 * (ks & 3) + (k >> 3) + 8 * (k & 1);
    }
    static constexpr bool kGroups = false;  // one factor per token, after all k steps
    template <int D, int C>
    KVQ_HD static void bfrags(const uint4* codes, int ks, const CodecArgs&, int lane, uint32_t (&b)[C / 8][2]) {
KVQ_UNROLL
      for (int h = 0; h < C / 32; ++h) {
        const uint4 p = codes[32 * ((ks >> 2) * (C / 32) + h) + lane];  // tokens (C/8) n + 4h ..: tiles 4h ..
KVQ_UNROLL
        for (int x = 0; x < 4; ++x) {
          b[4 * h + x][0] = u2_pair(word(p, x), 2 * (ks & 3));
          b[4 * h + x][1] = u2_pair(word(p, x), 2 * (ks & 3) + 1);
        }
      }
    }
    template <int D, int C>
    KVQ_HD static void bfrags_lo(const uint4*, int, const CodecArgs&, int, uint32_t (&)[C / 8][2]) {}
    /// The chunk's query fragments q o s into atab[32 ks + lane]; returns this lane's part of <q, m> (row n).
    /// qf: the queries' fp32 values at the fragment's k (2i, 2i+1, 2i+8, 2i+9) per (k step, lane).
    template <int D>
    KVQ_HD static float prepare(const uint8_t* const* prm, const CodecArgs& a, int lane, const float4* qf,
                                uint4* atab) {
      const uint8_t* mins = prm[0];
      const uint8_t* scales = prm[0] + (a.sec1 - a.sec0);
      float cst = 0;
KVQ_UNROLL
      for (int m = 0; m < D / 64; ++m) {
        const int c0 = 16 * (4 * m + (lane & 3));
        const uint4 s0 = load16(scales + 2 * c0), s1 = load16(scales + 2 * c0 + 16);
        const uint4 m0 = load16(mins + 2 * c0), m1 = load16(mins + 2 * c0 + 16);
KVQ_UNROLL
        for (int sg = 0; sg < 4; ++sg) {
          const int ks = 4 * m + sg;
          const float4 q = qf[32 * ks + lane];
          // channels c0 + 2sg, + 2sg + 8, + 2sg + 1, + 2sg + 9 (k = 2i, 2i+1, 2i+8, 2i+9)
          const float f0 = half_at(s0, 2 * sg), f1 = half_at(s1, 2 * sg), f2 = half_at(s0, 2 * sg + 1),
                      f3 = half_at(s1, 2 * sg + 1);
          cst = fmaf(q.x, half_at(m0, 2 * sg), cst);
          cst = fmaf(q.y, half_at(m1, 2 * sg), cst);
          cst = fmaf(q.z, half_at(m0, 2 * sg + 1), cst);
          cst = fmaf(q.w, half_at(m1, 2 * sg + 1), cst);
          atab[32 * ks + lane] = split_fragment<false>(q.x * f0, q.y * f1, q.z * f2, q.w * f3);
        }
      }
      return cst;
    }
  };

  struct Value {
    static constexpr bool kBf16 = false, kDense = false, kBulk = false;
    static constexpr int kChunk = 64, kRanges = 2;
    /// Piece r: channels lane_tile_channel(4r + e, n) of the lane's 16 tokens 16i .. 16i + 15.
    template <int D, int DP, int C>
    static constexpr int pieces() {
      static_assert(C == 64, "kivi:2 values: chunks of 64 tokens (16-token lanes)");
      return DP / 32;
    }
    template <int D, int C>
    static constexpr uint32_t chunk_bytes() {
      return C * D / 4;
    }
    template <int D, int DP, int C>
    KVQ_HD static int piece(const CodecArgs&, int lane, int k, int pc) {
      const int n = lane >> 2, a = lane & 3;
      return 64 * (a * (D / 16) + lane_tile_k16(pc, k, n)) + 16 * (n & 3);
    }
    /// The chunk's minima (r = 0) and scales (r = 1): [C/16][D/G][16] fp16 each.
    template <int D, int DP, int C>
    KVQ_HD static void range(const CodecArgs& a, int cc, int r, uint32_t& offset, uint32_t& bytes) {
      bytes = 2u * static_cast<uint32_t>(C * a.groups);
      offset = (r == 0 ? a.sec0 : a.sec1) + static_cast<uint32_t>(cc) * bytes;
    }
    KVQ_HD static constexpr int channel(int j, int col) { return lane_tile_channel(j, col); }
    KVQ_HD static constexpr int token_at(int vs, int q) { return 2 * vs + (q >> 1) + 8 * (q & 1); }
    template <int C>
    KVQ_HD static void weights(const uint8_t* const*, int, float (&w)[C / 4]) {
KVQ_UNROLL
      for (int t = 0; t < C / 4; ++t) w[t] = 1.0f;
    }
    template <int D, int DP, int C>
    KVQ_HD static void bfrags(const uint4* codes, const uint8_t* const* prm, const CodecArgs& a, int lane, int j,
                              int pc, uint32_t (&b)[C / 16][2]) {
      const int r = j >> 2, e = j & 3, n = lane >> 2, i = lane & 3;
      const int groups = a.groups, gr = (pc + 32 * r + 16 * (n >> 2)) >> a.group_log2;
      const uint8_t* mrow = prm[0] + 32 * (i * groups + gr);
      const uint8_t* srow = prm[1] + 32 * (i * groups + gr);
      const uint4 m0 = load16(mrow), m1 = load16(mrow + 16), s0 = load16(srow), s1 = load16(srow + 16);
      const uint32_t w = word(codes[32 * r + lane], e);
      // pair x: tokens (x, x + 8) of the lane's 16
KVQ_UNROLL
      for (int vs = 0; vs < C / 16; ++vs)
KVQ_UNROLL
        for (int h = 0; h < 2; ++h) {
          const int x = 2 * vs + h;
          b[vs][h] = h2_fma(u2_pair(w, x), half_pair(s0, s1, x, x), half_pair(m0, m1, x, x));
        }
    }
  };
};

// ---- turbo_mse:3 (TurboMse, LaneCodes): y = ||x|| c[idx] -------------------------------------------------------
// Indices become fp16 levels (times 2^12) by byte-permute table lookups; keys add the remainders (level * 2^12 -
// hi) as a second product, values take the hi levels. The norm (times 2^-12) scales the score tile (keys) or the
// softmax weight (values).
template <int kBits>
struct TurboMseTraits {
  static_assert(kBits == 3, "turbo_mse:3 has a kernel");

  struct Key {
    static constexpr bool kBf16 = false, kSplitB = true, kChunkA = false, kDense = false, kBulk = false;
    static constexpr int kChunk = 32, kRanges = 1;
    /// Piece 2 kk + h: tokens 4n .. 4n + 3 of the 32-channel chunk kk, the 2-bit plane holding nibble lane i
    /// (h = 0) or the 1-bit plane (h = 1).
    template <int D, int C>
    static constexpr int pieces() {
      static_assert(C == 32, "turbo_mse keys: chunks of 32 tokens");
      return D / 32 * 2;
    }
    template <int D, int C>
    static constexpr uint32_t chunk_bytes() {
      return C * D * 3 / 8;
    }
    template <int D, int C>
    KVQ_HD static int piece(const CodecArgs&, int lane, int k) {
      const int t = 4 * (lane >> 2), part = k & 1 ? 2 : (lane & 3) >> 1;
      return 64 * (3 * ((t >> 4) * (D / 32) + (k >> 1)) + part) + 4 * (t & 15);
    }
    /// The chunk's norms.
    template <int D, int C>
    KVQ_HD static void range(const CodecArgs& a, int cc, int, uint32_t& offset, uint32_t& bytes) {
      bytes = 2u * C;
      offset = a.sec0 + static_cast<uint32_t>(cc) * bytes;
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
    KVQ_HD static void bfrags_lo(const uint4* codes, int ks, const CodecArgs& a, int lane, uint32_t (&b)[C / 8][2]) {
      decode<C>(codes, ks, a.table_lo, lane, b);
    }
    template <int D, int C>
    KVQ_HD static void scale_group(const uint8_t* const* prm, const CodecArgs&, int lane, int,
                                   const float (&acc)[C / 8][4], float (&s)[C / 8][2]) {
      const uint4 nr = load16(prm[0] + 16 * (lane & 3));
KVQ_UNROLL
      for (int jj = 0; jj < C / 8; ++jj) {
        s[jj][0] = fmaf(half_at(nr, jj) * 0x1p-12f, acc[jj][0] + acc[jj][2], s[jj][0]);
        s[jj][1] = fmaf(half_at(nr, 4 + jj) * 0x1p-12f, acc[jj][1] + acc[jj][3], s[jj][1]);
      }
    }

   private:
    template <int C>
    KVQ_HD static void decode(const uint4* codes, int ks, const uint32_t (&table)[4], int lane,
                              uint32_t (&b)[C / 8][2]) {
      const uint4 low = codes[32 * (2 * (ks >> 1)) + lane], high = codes[32 * (2 * (ks >> 1) + 1) + lane];
KVQ_UNROLL
      for (int jj = 0; jj < C / 8; ++jj) {
        const uint32_t nib = lane3_nibbles(word(low, jj), word(high, jj), lane & 3);
        lookup4(ks & 1 ? nib >> 16 : nib, table, b[jj][0], b[jj][1]);
      }
    }
  };

  struct Value {
    static constexpr bool kBf16 = false, kDense = false, kBulk = false;
    static constexpr int kChunk = 32, kRanges = 1;
    /// Piece 2r + h: channels lane_tile_channel(4r + e, n) of the chunk's 32-token lanes, the 2-bit plane holding
    /// nibble lane i (tokens 8i .. 8i + 7; h = 0) or the 1-bit plane (h = 1).
    template <int D, int DP, int C>
    static constexpr int pieces() {
      static_assert(C == 32, "turbo_mse values: chunks of 32 tokens");
      return DP / 32 * 2;
    }
    template <int D, int C>
    static constexpr uint32_t chunk_bytes() {
      return C * D * 3 / 8;
    }
    template <int D, int DP, int C>
    KVQ_HD static int piece(const CodecArgs&, int lane, int k, int pc) {
      const int n = lane >> 2, part = k & 1 ? 2 : (lane & 3) >> 1;
      return 64 * (3 * lane_tile_k16(pc, k >> 1, n) + part) + 16 * (n & 3);
    }
    template <int D, int DP, int C>
    KVQ_HD static void range(const CodecArgs& a, int cc, int, uint32_t& offset, uint32_t& bytes) {
      bytes = 2u * C;
      offset = a.sec0 + static_cast<uint32_t>(cc) * bytes;
    }
    KVQ_HD static constexpr int channel(int j, int col) { return lane_tile_channel(j, col); }
    KVQ_HD static constexpr int token_at(int vs, int q) { return 4 * vs + q; }
    /// norm * 2^-12 of the lane's tokens 8i .. 8i + 7 (the levels are stored times 2^12).
    template <int C>
    KVQ_HD static void weights(const uint8_t* const* prm, int lane, float (&w)[C / 4]) {
      const uint4 nr = load16(prm[0] + 16 * (lane & 3));
KVQ_UNROLL
      for (int t = 0; t < C / 4; ++t) w[t] = half_at(nr, t) * 0x1p-12f;
    }
    template <int D, int DP, int C>
    KVQ_HD static void bfrags(const uint4* codes, const uint8_t* const*, const CodecArgs& a, int lane, int j, int,
                              uint32_t (&b)[C / 16][2]) {
      const int r = j >> 2, e = j & 3;
      const uint32_t nib =
          lane3_nibbles(word(codes[32 * 2 * r + lane], e), word(codes[32 * (2 * r + 1) + lane], e), lane & 3);
      lookup4(nib, a.table_hi, b[0][0], b[0][1]);
      lookup4(nib >> 16, a.table_hi, b[1][0], b[1][1]);
    }
  };
};

}  // namespace kvq::cuda::detail

// vecinfer:c/s in the decode kernel (decode_kernel.cuh): each token row holds d/s codeword indices of c bits (LSB
// first), and the fragments are gathered from the codebook (2^c centroids of s channels): no per-query lookup table,
// whose G x d/s x 2^c fp32 entries would not fit (256 KB at vecinfer:8/4, d = 128, G = 8; 16x that at c = 12), where
// the codebook takes 2^c x s x 4 bytes (keys: fp16 hi + lo, so that scores keep fp32 accuracy) or x 2 (values: fp16,
// the output's error budget). The index rows of a chunk come as a parameter range (C x row bytes, read by any
// lane); no lane slots.
//
// Where the codebook lies (vecinfer_table_in_shared): codebooks of up to 4096 floats (vecinfer:8/4, :10/4: 16 KB
// of keys and 8 KB of values at most) in the block's shared memory (prm[kTableSlot]), copied once per block; larger
// ones (vecinfer:12/8: 128 KB of keys + 64 KB of values) stay in global memory (CodecArgs::table) and are gathered
// by plain loads, cached in L1 and backed by L2, where the whole codebook stays resident (plain rather than __ldg:
// the compiler then narrows a value gather to the word a tile uses and reads the index rows half as often). In
// shared memory they would leave one 4-warp block per SM at d = 128 (214 KB of the 227 KB opt-in) and not fit at
// d = 256 (236 KB); an fp16-only key codebook (64 KB) would cost each score term up to 2^-12 of itself, where
// every other key trait keeps fp32 accuracy. In global memory the kernel keeps its usual 4-warp blocks, 3 per SM;
// the price is a divergent load per gather (about one L1 cycle per distinct 128-byte line instead of 4-8
// shared-memory wavefronts per warp), the L1 misses (the L1 holds what shared memory leaves of its 256 KB), and
// gathers the compiler does not merge between calls as it merges shared-memory ones (keys: hi and lo each load
// the 16-byte entry, 64 per chunk step at d = 128; values: 128 4-byte loads).
//
// Keys: lane i of k step ks takes 4 channels of one codeword (one 16-byte gather: hi and lo words of the 4
// channels), per token of its 4 score columns; norm=1's gamma multiplies the score tile. Values: lane n of value
// tile j takes channel 32 (j / 4) + 4n + j % 4 of the part, so one 8-byte gather per token serves the 4 tiles of a
// 32-channel group; values with norm=1 have no kernel (the host refuses them).
#pragma once

#include <cstdint>

#include "cuda/codec_traits.cuh"

namespace kvq::cuda::detail {

/// Whether vecinfer:c/s's kernels keep its codebook in shared memory (else they gather from global memory).
KVQ_HD constexpr bool vecinfer_table_in_shared(int bits, int sub) { return (1 << bits) * sub <= 4096; }

template <int kBits, int kSub>
struct VecInferTraits {
  static_assert(kBits >= 8 && kBits <= 12 && (kSub == 4 || kSub == 8), "vecinfer: c in 8..12, s = 4 or 8");
  static constexpr int kQuads = kSub / 4;  // 4-channel groups per codeword
  static constexpr bool kSharedTable = vecinfer_table_in_shared(kBits, kSub);

  /// Entry e of the codebook table (T: uint4 for keys, uint2 for values), from shared or from global memory.
  template <class T>
  KVQ_HD static T table_entry(const uint8_t* const* prm, const CodecArgs& a, uint32_t e) {
    if constexpr (kSharedTable) return reinterpret_cast<const T*>(prm[kTableSlot])[e];
    else return static_cast<const T*>(a.table)[e];
  }

  template <int D>
  KVQ_HD static constexpr int row_bytes() {
    return (D / kSub * kBits + 7) / 8;
  }
  /// Index j of a token row (c bits at bit j c, LSB first); reads only the row's own bytes.
  KVQ_HD static uint32_t index(const uint8_t* row, int j) {
    const int b = j * kBits, byte = b >> 3, sh = b & 7;
    uint32_t v = row[byte];
    if constexpr (kBits > 8) {
      v |= static_cast<uint32_t>(row[byte + 1]) << 8;
      if (sh + kBits > 16) v |= static_cast<uint32_t>(row[byte + 2]) << 16;
    }
    return (v >> sh) & ((1u << kBits) - 1);
  }
  /// The index rows of chunk cc (r = 0) and, where the codec stores them, its gammas (r = 1; none when sec1 = 0).
  template <int D, int C>
  KVQ_HD static void rows_range(const CodecArgs& a, int cc, int r, uint32_t& offset, uint32_t& bytes) {
    bytes = r == 0 ? C * row_bytes<D>() : a.sec1 != 0 ? 2u * C : 0u;
    offset = (r == 0 ? 0u : a.sec1) + static_cast<uint32_t>(cc) * bytes;
  }

  struct Key {
    static constexpr bool kBf16 = false, kSplitB = true, kChunkA = false, kDense = false, kBulk = false;
    static constexpr bool kGroups = false;  // one factor per token, after all k steps
    static constexpr int kChunk = 32, kRanges = 2;
    template <int D, int C>
    static constexpr int pieces() {
      static_assert(C == 32, "vecinfer keys: chunks of 32 tokens");
      return 0;
    }
    template <int D, int C>
    static constexpr uint32_t chunk_bytes() {
      return C * row_bytes<D>();
    }
    template <int D, int C>
    KVQ_HD static int piece(const CodecArgs&, int, int) {
      return 0;
    }
    template <int D, int C>
    KVQ_HD static void range(const CodecArgs& a, int cc, int r, uint32_t& offset, uint32_t& bytes) {
      rows_range<D, C>(a, cc, r, offset, bytes);
    }
    /// Lane i's 4-channel group at k step ks: codeword 4 ks + i (s = 4), or half ks % 2 of codeword 4 (ks / 2) + i.
    KVQ_HD static constexpr int quad(int ks, int i) {
      return kSub == 4 ? 4 * ks + i : 8 * (ks >> 1) + 2 * i + (ks & 1);
    }
    template <int D>
    KVQ_HD static constexpr int channel(int ks, int k) {
      return 4 * quad(ks, (k & 7) >> 1) + (k & 1) + 2 * (k >> 3);
    }
    /// The 16-byte table entries (hi c0 c1, hi c2 c3, lo c0 c1, lo c2 c3) of the lane's 4 tokens 4n + jj.
    template <int D, int C>
    KVQ_HD static void gather(const uint8_t* const* prm, const CodecArgs& a, int ks, int lane, uint4 (&e)[C / 8]) {
      const int q = quad(ks, lane & 3);
KVQ_UNROLL
      for (int jj = 0; jj < C / 8; ++jj) {
        const uint8_t* row = prm[0] + (C / 8 * (lane >> 2) + jj) * row_bytes<D>();
        e[jj] = table_entry<uint4>(prm, a, index(row, q / kQuads) * kQuads + q % kQuads);
      }
    }
    template <int D, int C>
    KVQ_HD static void bfrags(const uint4*, const uint8_t* const* prm, int ks, const CodecArgs& a, int lane,
                              uint32_t (&b)[C / 8][2]) {
      uint4 e[C / 8];
      gather<D, C>(prm, a, ks, lane, e);
KVQ_UNROLL
      for (int jj = 0; jj < C / 8; ++jj) {
        b[jj][0] = e[jj].x;
        b[jj][1] = e[jj].y;
      }
    }
    template <int D, int C>
    KVQ_HD static void bfrags_lo(const uint4*, const uint8_t* const* prm, int ks, const CodecArgs& a, int lane,
                                 uint32_t (&b)[C / 8][2]) {
      uint4 e[C / 8];
      gather<D, C>(prm, a, ks, lane, e);
KVQ_UNROLL
      for (int jj = 0; jj < C / 8; ++jj) {
        b[jj][0] = e[jj].z;
        b[jj][1] = e[jj].w;
      }
    }
    /// The tile as it is, or times the gammas of the lane's score columns (tokens 8i .. 8i + 7).
    template <int D, int C>
    KVQ_HD static void scale_group(const uint8_t* const* prm, const CodecArgs& a, int lane, int,
                                   const float (&acc)[C / 8][4], float (&s)[C / 8][2]) {
      const uint4 g = a.sec1 != 0 ? load16(prm[1] + 16 * (lane & 3)) : make_uint4(0, 0, 0, 0);
KVQ_UNROLL
      for (int jj = 0; jj < C / 8; ++jj) {
        const float g0 = a.sec1 != 0 ? half_at(g, jj) : 1.0f, g1 = a.sec1 != 0 ? half_at(g, 4 + jj) : 1.0f;
        s[jj][0] = fmaf(g0, acc[jj][0] + acc[jj][2], s[jj][0]);
        s[jj][1] = fmaf(g1, acc[jj][1] + acc[jj][3], s[jj][1]);
      }
    }
  };

  struct Value {
    static constexpr bool kBf16 = false, kDense = false, kBulk = false;
    static constexpr int kChunk = 32, kRanges = 1;
    template <int D, int DP, int C>
    static constexpr int pieces() {
      static_assert(C == 32, "vecinfer values: chunks of 32 tokens");
      return 0;
    }
    template <int D, int C>
    static constexpr uint32_t chunk_bytes() {
      return C * row_bytes<D>();
    }
    template <int D, int DP, int C>
    KVQ_HD static int piece(const CodecArgs&, int, int, int) {
      return 0;
    }
    template <int D, int DP, int C>
    KVQ_HD static void range(const CodecArgs& a, int cc, int r, uint32_t& offset, uint32_t& bytes) {
      rows_range<D, C>(a, cc, r, offset, bytes);
    }
    KVQ_HD static constexpr int channel(int j, int col) { return 32 * (j >> 2) + 4 * col + (j & 3); }
    KVQ_HD static constexpr int token_at(int vs, int q) { return 4 * vs + q; }
    template <int C>
    KVQ_HD static void weights(const uint8_t* const*, int, float (&w)[C / 4]) {
KVQ_UNROLL
      for (int t = 0; t < C / 4; ++t) w[t] = 1.0f;
    }
    /// Tile j: channel pc + 32 (j / 4) + 4n + j % 4 of the lane's tokens 8i + 4vs + q, from one 8-byte gather
    /// (the 4 channels) per token.
    template <int D, int DP, int C>
    KVQ_HD static void bfrags(const uint4*, const uint8_t* const* prm, const CodecArgs& a, int lane, int j, int pc,
                              uint32_t (&b)[C / 16][2]) {
      const int q = (pc + 32 * (j >> 2)) / 4 + (lane >> 2), e = j & 3;
      const uint32_t sel = e & 1 ? 0x7632u : 0x5410u;
KVQ_UNROLL
      for (int vs = 0; vs < C / 16; ++vs) {
        uint32_t w[4];
KVQ_UNROLL
        for (int x = 0; x < 4; ++x) {
          const uint8_t* row = prm[0] + (C / 4 * (lane & 3) + 4 * vs + x) * row_bytes<D>();
          const uint2 c = table_entry<uint2>(prm, a, index(row, q / kQuads) * kQuads + q % kQuads);
          w[x] = e >> 1 ? c.y : c.x;
        }
        b[vs][0] = prmt(w[0], w[1], sel);
        b[vs][1] = prmt(w[2], w[3], sel);
      }
    }
  };
};

}  // namespace kvq::cuda::detail

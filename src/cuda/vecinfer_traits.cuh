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
// shared-memory wavefronts per warp) and the L1 misses (the L1 holds what shared memory leaves of its 256 KB); per
// chunk at d = 128 (SASS) 32 16-byte key gathers (hi and lo from one load) and 64 4-byte value loads.
//
// By count the kernels are bound by shared-memory wavefronts rather than instructions (vecinfer:8/4, d = 128: about
// 870 wavefronts a chunk with a byte load per index, for 720 instructions): the lanes' rows of one load lie 4 or 8
// rows apart (128-320 bytes: one or two banks), so a byte load per index costs up to 8 wavefronts, and the gathers
// meet random bank conflicts. Hence a lane takes its indices of a token from one window of whole aligned loads
// (index(): 8 or 16 bytes, shared by the chunk's k steps or value tiles), and a gather loads its whole entry once.
//
// Keys: lane i of k step ks takes 4 channels of one codeword (one 16-byte gather: hi and lo words of the 4
// channels), per token of its 4 score columns; its codewords over the k steps are one run of the row (quad D/16 i +
// ks), one window; norm=1's gamma multiplies the score tile. Values: lane n of value tile j takes channel 32 (j / 4)
// + 4n + j % 4 of the part, so one 8-byte gather per token serves the 4 tiles of a 32-channel group, whose 32 / s
// codewords are a run; values with norm=1 have no kernel (the host refuses them).
#pragma once

#include <cstdint>
#include <type_traits>

#include "cuda/codec_traits.cuh"

namespace kvq::cuda::detail {

/// Whether vecinfer:c/s's kernels keep its codebook in shared memory (else they gather from global memory).
KVQ_HD constexpr bool vecinfer_table_in_shared(int bits, int sub) { return (1 << bits) * sub <= 4096; }

template <int kBits, int kSub>
struct VecInferTraits {
  static_assert(kBits >= 8 && kBits <= 12 && (kSub == 4 || kSub == 8), "vecinfer: c in 8..12, s = 4 or 8");
  static constexpr int kQuads = kSub / 4;  // 4-channel groups per codeword
  static constexpr bool kSharedTable = vecinfer_table_in_shared(kBits, kSub);

  /// Entry e of the codebook table (T: uint4 for keys, uint2 for values), from shared or from global memory. A
  /// value entry in shared memory comes by one 8-byte load kept whole: the compiler would split it into the two
  /// words the tiles use, two loads meeting the bank conflicts of one (the load needs no ordering: the codebook is
  /// not written after the block copied it).
  template <class T>
  KVQ_HD static T table_entry(const uint8_t* const* prm, const CodecArgs& a, uint32_t e) {
    if constexpr (kSharedTable) {
      const T* t = reinterpret_cast<const T*>(prm[kTableSlot]) + e;
#if defined(__CUDA_ARCH__)
      if constexpr (std::is_same_v<T, uint2>) {
        uint2 v;
        asm("ld.shared.v2.u32 {%0, %1}, [%2];" : "=r"(v.x), "=r"(v.y) : "r"(smem_addr(t)));
        return v;
      } else
#endif
        return *t;
    } else {
      return static_cast<const T*>(a.table)[e];
    }
  }

  template <int D>
  KVQ_HD static constexpr int row_bytes() {
    return (D / kSub * kBits + 7) / 8;
  }
  /// The widest aligned load of a token row (rows of row_bytes from a 16-byte aligned range).
  template <int D>
  KVQ_HD static constexpr int row_align() {
    return row_bytes<D>() % 16 == 0 ? 16 : row_bytes<D>() % 8 == 0 ? 8 : 4;
  }
  /// The words of the window that holds a run of L indices from index j0 (a multiple of L): the fewest, in whole
  /// aligned loads, for every such run of the row (window_at: where the window starts).
  template <int D, int L>
  KVQ_HD static constexpr int window_words() {
    constexpr int A = row_align<D>(), R = row_bytes<D>();
    for (int nw = A / 4; 4 * nw <= R; nw += A / 4) {
      bool fits = true;
      for (int j0 = 0; j0 < D / kSub; j0 += L) {
        const int floor_a = j0 * kBits / 8 / A * A, at = floor_a < R - 4 * nw ? floor_a : R - 4 * nw;
        fits = fits && j0 * kBits - 8 * at + L * kBits <= 32 * nw;
      }
      if (fits) return nw;
    }
    return 0;
  }
  /// The byte where the window of the run from index j0 starts: aligned and inside the row.
  template <int D, int L>
  KVQ_HD static int window_at(int j0) {
    constexpr int A = row_align<D>(), last = row_bytes<D>() - 4 * window_words<D, L>();
    const int at = j0 * kBits / 8 / A * A;
    return at < last ? at : last;
  }
  /// Index j of a token row (c bits at bit j c, LSB first) from the window of its run that starts at byte at: the
  /// window comes by whole aligned loads (the same for a lane's calls of a chunk: loaded once), and the index is
  /// shifted out of the pair of words that holds it.
  template <int D, int L>
  KVQ_HD static uint32_t index(const uint8_t* row, int at, int j) {
    constexpr int A = row_align<D>(), NW = window_words<D, L>();
    static_assert(NW > 0, "vecinfer: a run of indices fits no window of the row");
    uint32_t x[NW + 1];
KVQ_UNROLL
    for (int p = 0; p < NW; p += A / 4) {
      const uint8_t* w = row + at + 4 * p;
      if constexpr (A == 16) {
        const uint4 v = load16(w);
        x[p] = v.x, x[p + 1] = v.y, x[p + 2] = v.z, x[p + 3] = v.w;
      } else if constexpr (A == 8) {
        const uint2 v = *reinterpret_cast<const uint2*>(w);
        x[p] = v.x, x[p + 1] = v.y;
      } else {
        x[p] = *reinterpret_cast<const uint32_t*>(w);
      }
    }
    x[NW] = 0;
    const int bit = j * kBits - 8 * at, k = bit >> 5;
    uint32_t lo = x[0], hi = x[1];
KVQ_UNROLL
    for (int w = 1; w < NW; ++w) {
      lo = k == w ? x[w] : lo;
      hi = k == w ? x[w + 1] : hi;
    }
    return static_cast<uint32_t>(((static_cast<uint64_t>(hi) << 32) | lo) >> (bit & 31)) & ((1u << kBits) - 1);
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
    /// Lane i's 4-channel group at k step ks: quad D/16 i + ks, so that a lane's indices are one run of the row
    /// (codewords R i .. R i + R - 1, R = D / 16 / kQuads: index ks / kQuads, part ks % kQuads).
    template <int D>
    KVQ_HD static constexpr int quad(int ks, int i) {
      return D / 16 * i + ks;
    }
    template <int D>
    KVQ_HD static constexpr int channel(int ks, int k) {
      return 4 * quad<D>(ks, (k & 7) >> 1) + (k & 1) + 2 * (k >> 3);
    }
    /// The 16-byte table entries (hi c0 c1, hi c2 c3, lo c0 c1, lo c2 c3) of the lane's 4 tokens 4n + jj.
    template <int D, int C>
    KVQ_HD static void gather(const uint8_t* const* prm, const CodecArgs& a, int ks, int lane, uint4 (&e)[C / 8]) {
      constexpr int R = D / 16 / kQuads;
      const int i = lane & 3, at = window_at<D, R>(R * i);
KVQ_UNROLL
      for (int jj = 0; jj < C / 8; ++jj) {
        const uint8_t* row = prm[0] + (C / 8 * (lane >> 2) + jj) * row_bytes<D>();
        e[jj] = table_entry<uint4>(prm, a, index<D, R>(row, at, R * i + ks / kQuads) * kQuads + ks % kQuads);
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
    KVQ_HD static constexpr int token_at(int vs, int e) { return 4 * vs + e; }
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
      // quad 8 g + n: index L g + n / kQuads of the run of L = 8 / kQuads from L g, part n % kQuads
      constexpr int L = 8 / kQuads;
      const int g = (pc + 32 * (j >> 2)) / 32, n = lane >> 2, e = j & 3, at = window_at<D, L>(L * g);
      const uint32_t sel = e & 1 ? 0x7632u : 0x5410u;
KVQ_UNROLL
      for (int vs = 0; vs < C / 16; ++vs) {
        uint32_t w[4];
KVQ_UNROLL
        for (int x = 0; x < 4; ++x) {
          const uint8_t* row = prm[0] + (C / 4 * (lane & 3) + 4 * vs + x) * row_bytes<D>();
          const uint2 c =
              table_entry<uint2>(prm, a, index<D, L>(row, at, L * g + n / kQuads) * kQuads + n % kQuads);
          w[x] = e >> 1 ? c.y : c.x;
        }
        b[vs][0] = prmt(w[0], w[1], sel);
        b[vs][1] = prmt(w[2], w[3], sel);
      }
    }
  };
};

}  // namespace kvq::cuda::detail

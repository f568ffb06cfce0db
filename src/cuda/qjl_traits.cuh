// qjl:m in the decode kernel (decode_kernel.cuh; codec_traits.cuh has the fragment conventions): the sign bits of
// SignTiles ("tokens in lanes", whatever the role: a 32-bit word holds rows 32k .. 32k + 31 of one token) become
// exact +-1 fp16 operands with one shift and one LOP3 per pair of signs. The codec space is the m sketch rows; the
// sketch factor sqrt(pi/2)/m is folded into the query map (keys) or the output map (values), so the kernel applies
// only the token's norm: to the score tile (keys) or to the softmax weight (values).
#pragma once

#include <cstdint>

#include "cuda/codec_traits.cuh"

namespace kvq::cuda::detail {

/// {+-s, +-s'} from bits b and b + 16 of w (b <= 15), as fp16 halves of magnitude `one`: + where the bit is set.
template <uint32_t kOne>
KVQ_HD uint32_t sign_pair(uint32_t w, int b) {
  return and_xor<0x80008000u, kOne | 0x80008000u>(w << (15 - b));
}
constexpr uint32_t kHalfOne = 0x3C003C00u;   // {1, 1}
constexpr uint32_t kHalf4096 = 0x6C006C00u;  // {4096, 4096}

/// Key fragments of sign bits: a lane's 16-byte slot holds the words of 4 consecutive tokens (tiles jj) of one
/// 32-row tile; k step x of the slot takes, per token, bits (o + 2x, o + 2x + 16) for b0 (k = 2i, 2i + 1) and
/// (o + 2x + 1, o + 2x + 17) for b1 (k = 2i + 8, 2i + 9), the lane's bits already shifted down by o.
template <int C>
KVQ_HD void sign_key_frags(const uint4& p, int shift, int x, uint32_t (&b)[C / 8][2]) {
  static_assert(C == 32, "sign keys: chunks of 32 tokens");
KVQ_UNROLL
  for (int jj = 0; jj < C / 8; ++jj) {
    const uint32_t w = word(p, jj) >> shift;
    b[jj][0] = sign_pair<kHalfOne>(w, 2 * x);
    b[jj][1] = sign_pair<kHalfOne>(w, 2 * x + 1);
  }
}

/// Where the sign key fragments of m rows read (M = m, a multiple of 64): lane i of a k-step group takes L = 32
/// rows (one whole tile word, M >= 128: slot p holds tile 4p + i, 8 k steps) or L = 16 (M = 64: tile i / 2, bits
/// 8 (i % 2) .. + 7 and + 16 .. + 23, 4 k steps).
template <int M>
struct SignKeyMap {
  static_assert(M % 64 == 0 && M >= 64, "sign keys: a multiple of 64 rows");
  static constexpr int L = M >= 128 ? 32 : 16;  // rows per lane and slot
  static constexpr int kSteps = L / 4;          // k steps per slot
  static constexpr int kSlots = M / (4 * L);
  KVQ_HD static constexpr int tile(int p, int i) { return (4 * L * p + L * i) / 32; }
  KVQ_HD static constexpr int shift(int i) { return L == 16 ? 8 * (i & 1) : 0; }
  /// The row of k (0..15) at k step ks.
  KVQ_HD static constexpr int row(int ks, int k) {
    const int i = (k & 7) >> 1, p = ks / kSteps, x = ks % kSteps;
    return 32 * tile(p, i) + shift(i) + 2 * x + 16 * (k & 1) + (k >> 3);
  }
  /// The byte offset, in the chunk's tiles (C = 32 tokens: two 16-token rows of M / 32 tiles), of lane's slot p.
  KVQ_HD static constexpr int slot(int lane, int p) {
    const int t = 4 * (lane >> 2);
    return 64 * ((t >> 4) * (M / 32) + tile(p, lane & 3)) + 4 * (t & 15);
  }
  template <int C>
  KVQ_HD static void bfrags(const uint4* slots, int ks, int lane, uint32_t (&b)[C / 8][2]) {
    sign_key_frags<C>(slots[32 * (ks / kSteps) + lane], shift(lane & 3), ks % kSteps, b);
  }
};

/// kRows: the sketch rows m, 0 for m = d.
template <int kRows>
struct QjlTraits {
  template <int D>
  KVQ_HD static constexpr int rows() {
    return kRows > 0 ? kRows : D;
  }

  struct Key : TokenNormKeys {
    static constexpr bool kBf16 = false, kSplitB = false, kChunkA = false, kDense = false, kBulk = false;
    static constexpr bool kGroups = false;  // one factor per token, after all k steps
    static constexpr int kChunk = 32, kRanges = 1;
    template <int D>
    KVQ_HD static constexpr int space() {
      return rows<D>();
    }
    template <int D, int C>
    static constexpr int pieces() {
      static_assert(C == 32, "qjl keys: chunks of 32 tokens");
      return SignKeyMap<rows<D>()>::kSlots;
    }
    template <int D, int C>
    static constexpr uint32_t chunk_bytes() {
      return C * rows<D>() / 8;
    }
    template <int D, int C>
    KVQ_HD static int piece(const CodecArgs&, int lane, int k) {
      return SignKeyMap<rows<D>()>::slot(lane, k);
    }
    template <int D>
    KVQ_HD static constexpr int channel(int ks, int k) {
      return SignKeyMap<rows<D>()>::row(ks, k);
    }
    template <int D, int C>
    KVQ_HD static void bfrags(const uint4* codes, int ks, const CodecArgs&, int lane, uint32_t (&b)[C / 8][2]) {
      SignKeyMap<rows<D>()>::template bfrags<C>(codes, ks, lane, b);
    }
    /// The norms of the lane's score columns (tokens 8i .. 8i + 7) times the tile.
    template <int D, int C>
    KVQ_HD static void scale_group(const uint8_t* const* prm, const CodecArgs&, int lane, int,
                                   const float (&acc)[C / 8][4], float (&s)[C / 8][2]) {
      uint4 nr[C / 32];
      run_halves<C>(prm[0], 1, lane & 3, 0, nr);
      scale_tiles<C>(nr, 1.0f, acc, s);
    }
  };

  // Values: the tiles are still tokens in lanes, so lane (n, i) copies the words of its tokens 8i .. 8i + 7 (two
  // slots per 32-row tile, shared by the 8 lanes n) and takes bits 4n .. 4n + 3 of each: value tile j, column n is
  // row 32 (j / 4) + 4n + j % 4 of the part. Signs are +-4096 (the weights carry norm * 2^-12). The value space is
  // the m rows, summed in parts of 128 by warps of their own where m > 128.
  struct Value : TokenNormValues {
    static constexpr bool kBf16 = false, kDense = false, kBulk = false;
    static constexpr int kChunk = 32, kRanges = 1;
    template <int D>
    KVQ_HD static constexpr int space() {
      return rows<D>();
    }
    /// Slot 2R + h: tokens 8i + 4h .. + 3 of the part's 32-row tile R.
    template <int D, int DP, int C>
    static constexpr int pieces() {
      static_assert(C == 32, "qjl values: chunks of 32 tokens");
      return DP / 16;
    }
    template <int D, int C>
    static constexpr uint32_t chunk_bytes() {
      return C * rows<D>() / 8;
    }
    template <int D, int DP, int C>
    KVQ_HD static int piece(const CodecArgs&, int lane, int k, int pc) {
      const int t = 8 * (lane & 3) + 4 * (k & 1);
      return 64 * ((t >> 4) * (rows<D>() / 32) + pc / 32 + (k >> 1)) + 4 * (t & 15);
    }
    KVQ_HD static constexpr int channel(int j, int col) { return 32 * (j >> 2) + 4 * col + (j & 3); }
    KVQ_HD static constexpr int token_at(int vs, int e) { return 4 * vs + e; }
    template <int D, int DP, int C>
    KVQ_HD static void bfrags(const uint4* codes, const uint8_t* const*, const CodecArgs&, int lane, int j, int,
                              uint32_t (&b)[C / 16][2]) {
      const int n = lane >> 2, e = j & 3;
      const uint32_t half = n >= 4 ? 0x7632u : 0x5410u;  // the half words holding bits 4n ..
KVQ_UNROLL
      for (int vs = 0; vs < C / 16; ++vs) {
        const uint4 p = codes[32 * (2 * (j >> 2) + vs) + lane];  // tokens 8i + 4vs .. + 3
        b[vs][0] = sign_pair<kHalf4096>(prmt(p.x, p.y, half) >> (4 * (n & 3)), e);
        b[vs][1] = sign_pair<kHalf4096>(prmt(p.z, p.w, half) >> (4 * (n & 3)), e);
      }
    }
  };
};

}  // namespace kvq::cuda::detail

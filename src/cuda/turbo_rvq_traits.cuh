// turbo_rvq:b in the decode kernel (decode_kernel.cuh; codec_traits.cuh has the fragment conventions). Its block
// holds token-major rows (layout::TurboRvq: token t's d b-bit indices packed LSB first, stage 1 then stage 2),
// which neither the tokens-in-lanes key fragments nor the channels-in-lanes value fragments read as 16-byte lane
// pieces, so a chunk's stage-1 rows, stage-2 rows and norms come as the chunk's parameter ranges (C x b d / 8
// bytes each: every byte copied once per warp, readable by every lane) and each lane extracts its indices from
// the rows in shared memory: a b-bit field run becomes a word of 4 indices in nibbles 0..3 (masks and shifts, no
// per-index work) and the byte-permute lookups of turbo_mse (CodecArgs::table_hi's layout, one table per stage in
// the block's shared memory, prm[kTableSlot]) turn it into fp16 levels times 2^12, exact (FloatCodebook).
//
// Keys: the two stages are two products on the same query fragments (kSplitB: stage 1 in bfrags, stage 2 in
// bfrags_lo), so scores keep fp32 accuracy (c1 + c2 is not an fp16 number); the norm times 2^-12 scales the score
// tile. Lane (n, i) reads, of each of its tokens 4n + jj, the quarter i of the row (channels (d/4) i ..) in loads
// of up to 16 bytes. Values: value tile j, column n is channel 64 (j / 8) + 8n + field(j % 8): lane n reads the
// 8-index run (b bytes) of those channels for each of its 8 tokens and adds the two stages' levels in fp16 (one
// rounding: the output's error budget); the norm times 2^-12 goes into the softmax weight.
#pragma once

#include <cstdint>

#include "cuda/codec_traits.cuh"

namespace kvq::cuda::detail {

/// 32 bits at bit offset `bit` (compile-time after unrolling) of a little-endian word array.
template <int N>
KVQ_HD uint32_t bits_at(const uint32_t (&w)[N], int bit) {
  const int x = bit >> 5, sh = bit & 31;
  if (sh == 0) return w[x];
#if defined(__CUDA_ARCH__)
  return __funnelshift_r(w[x], w[x + 1], static_cast<unsigned>(sh));
#else
  return w[x] >> sh | w[x + 1] << (32 - sh);
#endif
}

/// 3-bit fields f0..f7 at bits 3k of g (bits above 23 ignored) as nibble words: f0, f1, f2, f4 (even = true) or f3,
/// f5, f6, f7 in nibbles 0..3.
KVQ_HD uint32_t spread3(uint32_t g, bool even) {
  if (even) return (g & 0x7007u) | ((g << 1) & 0x70u) | ((g << 2) & 0x700u);
  return (((g << 3) & 0x7007000u) | ((g << 1) & 0x70000u) | ((g << 2) & 0x700000u)) >> 12;
}
/// The field spread3 puts in nibble q: f0, f1, f2, f4 (odd = 0) or f3, f5, f6, f7.
KVQ_HD constexpr int spread3_field(int odd, int e) { return odd ? (e == 0 ? 3 : 4 + e) : (e == 3 ? 4 : e); }
/// Bits 0..3 of y into nibbles 0..3.
KVQ_HD uint32_t spread1(uint32_t y) {
  const uint32_t t = (y | (y << 6)) & 0x0303u;
  return (t | (t << 3)) & 0x1111u;
}

template <int kBits>
struct TurboRvqTraits {
  static_assert(kBits >= 1 && kBits <= 4, "turbo_rvq:1..4");

  template <int D>
  KVQ_HD static constexpr int row_bytes() {
    return kBits * D / 8;
  }
  /// r = 0: the chunk's stage-1 rows; r = 1: its stage-2 rows (sec1); r = 2: its norms (sec0).
  template <int D, int C>
  KVQ_HD static void sections(const CodecArgs& a, int cc, int r, uint32_t& offset, uint32_t& bytes) {
    bytes = r == 2 ? 2u * C : static_cast<uint32_t>(C * row_bytes<D>());
    offset = (r == 0 ? 0u : r == 1 ? a.sec1 : a.sec0) + static_cast<uint32_t>(cc) * bytes;
  }
  /// Stage s's level table (CodecArgs::table_hi's layout) from the block's shared memory: 8 words per stage.
  KVQ_HD static void stage_table(const uint8_t* const* prm, int s, uint32_t (&t)[8]) {
    const uint4* p = reinterpret_cast<const uint4*>(prm[kTableSlot]) + 2 * s;
    const uint4 lo = p[0];
    t[0] = lo.x, t[1] = lo.y, t[2] = lo.z, t[3] = lo.w;
    if constexpr (kBits == 4) {  // levels 8..15
      const uint4 hi = p[1];
      t[4] = hi.x, t[5] = hi.y, t[6] = hi.z, t[7] = hi.w;
    } else {
      t[4] = t[5] = t[6] = t[7] = 0;
    }
  }

  // ---- keys: the quarter of a row that lane i reads (d/4 fields, Q bytes) as words, and its k steps ----------
  template <int D>
  static constexpr int kQuarterBytes = kBits * D / 32;
  template <int D>
  static constexpr int kQuarterWords = (kQuarterBytes<D> + 3) / 4 + 1;  // one zero word beyond: bits_at reads it

  /// The Q bytes at p (Q-aligned in shared memory) as words.
  template <int D>
  KVQ_HD static void load_quarter(const uint8_t* p, uint32_t (&w)[kQuarterWords<D>]) {
    constexpr int Q = kQuarterBytes<D>;
    for (int x = 0; x < kQuarterWords<D>; ++x) w[x] = 0;
    if constexpr (Q % 16 == 0) {
      KVQ_UNROLL
      for (int x = 0; x < Q / 16; ++x) {
        const uint4 v = load16(p + 16 * x);
        w[4 * x] = v.x, w[4 * x + 1] = v.y, w[4 * x + 2] = v.z, w[4 * x + 3] = v.w;
      }
    } else if constexpr (Q % 8 == 0) {
      KVQ_UNROLL
      for (int x = 0; x < Q / 8; ++x) {
        const uint2 v = *reinterpret_cast<const uint2*>(p + 8 * x);
        w[2 * x] = v.x, w[2 * x + 1] = v.y;
      }
    } else if constexpr (Q % 4 == 0) {
      KVQ_UNROLL
      for (int x = 0; x < Q / 4; ++x) w[x] = reinterpret_cast<const uint32_t*>(p)[x];
    } else {  // d = 64, b = 1 or 3: 2 or 6 bytes, 2-aligned
      KVQ_UNROLL
      for (int x = 0; x < Q / 2; ++x)
        w[x / 2] |= static_cast<uint32_t>(reinterpret_cast<const uint16_t*>(p)[x]) << (16 * (x & 1));
    }
  }
  /// Indices of k step ks in nibbles 0..3 (nibble q: k = 2i + (q & 1) + 8 (q / 2)), from the lane's quarter.
  template <int D>
  KVQ_HD static uint32_t key_nibbles(const uint32_t (&w)[kQuarterWords<D>], int ks) {
    if constexpr (kBits == 4) return w[ks >> 1] >> (16 * (ks & 1));
    else if constexpr (kBits == 2) return ((w[ks >> 2] >> (2 * (ks & 1))) & 0x33333333u) >> (16 * ((ks >> 1) & 1));
    else if constexpr (kBits == 1) return ((w[ks >> 3] >> (ks & 3)) & 0x11111111u) >> (16 * ((ks >> 2) & 1));
    else return spread3(bits_at(w, 24 * (ks >> 1)), (ks & 1) == 0);
  }
  /// The field (of the lane's quarter) at nibble e of k step ks.
  KVQ_HD static constexpr int key_field(int ks, int e) {
    if constexpr (kBits == 4) return 4 * ks + e;
    else if constexpr (kBits == 2) return 16 * (ks >> 2) + 8 * ((ks >> 1) & 1) + 2 * e + (ks & 1);
    else if constexpr (kBits == 1) return 32 * (ks >> 3) + 16 * ((ks >> 2) & 1) + 4 * e + (ks & 3);
    else return 8 * (ks >> 1) + spread3_field(ks & 1, e);
  }

  struct Key {
    static constexpr bool kBf16 = false, kSplitB = true, kChunkA = false, kDense = false, kBulk = false;
    static constexpr bool kGroups = false;  // one factor per token, after all k steps
    static constexpr int kChunk = 32, kRanges = 3;
    template <int D, int C>
    static constexpr int pieces() {
      static_assert(C == 32, "turbo_rvq keys: chunks of 32 tokens");
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
      sections<D, C>(a, cc, r, offset, bytes);
    }
    template <int D>
    KVQ_HD static constexpr int channel(int ks, int k) {
      return D / 4 * ((k & 7) >> 1) + key_field(ks, (k & 1) + 2 * (k >> 3));
    }
    /// Stage 1's levels; bfrags_lo: stage 2's, on the same query fragments.
    template <int D, int C>
    KVQ_HD static void bfrags(const uint4*, const uint8_t* const* prm, int ks, const CodecArgs&, int lane,
                              uint32_t (&b)[C / 8][2]) {
      stage_frags<D, C>(prm, 0, ks, lane, b);
    }
    template <int D, int C>
    KVQ_HD static void bfrags_lo(const uint4*, const uint8_t* const* prm, int ks, const CodecArgs&, int lane,
                                 uint32_t (&b)[C / 8][2]) {
      stage_frags<D, C>(prm, 1, ks, lane, b);
    }
    template <int D, int C>
    KVQ_HD static void scale_group(const uint8_t* const* prm, const CodecArgs&, int lane, int,
                                   const float (&acc)[C / 8][4], float (&s)[C / 8][2]) {
      uint4 nr[C / 32];
      run_halves<C>(prm[2], 1, lane & 3, 0, nr);
      scale_tiles<C>(nr, 0x1p-12f, acc, s);
    }

   private:
    /// Tile jj: token (C/8) n + jj, quarter i of its stage-s row.
    template <int D, int C>
    KVQ_HD static void stage_frags(const uint8_t* const* prm, int s, int ks, int lane, uint32_t (&b)[C / 8][2]) {
      uint32_t t[8];
      stage_table(prm, s, t);
      KVQ_UNROLL
      for (int jj = 0; jj < C / 8; ++jj) {
        uint32_t w[kQuarterWords<D>];
        load_quarter<D>(prm[s] + (C / 8 * (lane >> 2) + jj) * row_bytes<D>() + (lane & 3) * kQuarterBytes<D>, w);
        lookup<kBits>(key_nibbles<D>(w, ks), t, b[jj][0], b[jj][1]);
      }
    }
  };

  // ---- values: 8-index runs (b bytes) of channels 64 blk + 8n .. + 7, two nibble words each -----------------
  /// The run at p (b bytes: 8 fields) as the low 8 b bits.
  KVQ_HD static uint32_t value_run(const uint8_t* p) {
    if constexpr (kBits == 4) return *reinterpret_cast<const uint32_t*>(p);
    else if constexpr (kBits == 2) return *reinterpret_cast<const uint16_t*>(p);
    else if constexpr (kBits == 1) return *p;
    else return p[0] | static_cast<uint32_t>(p[1]) << 8 | static_cast<uint32_t>(p[2]) << 16;
  }
  /// Nibble word h (0, 1) of a run: the indices of fields value_field(h, 0..3) in nibbles 0..3.
  KVQ_HD static uint32_t value_nibbles(uint32_t run, int h) {
    if constexpr (kBits == 4) return run >> (16 * h);
    else if constexpr (kBits == 2) return (run >> (2 * h)) & 0x3333u;
    else if constexpr (kBits == 1) return spread1(run >> (4 * h));
    else return spread3(run, h == 0);
  }
  KVQ_HD static constexpr int value_field(int h, int e) {
    if constexpr (kBits == 2) return 2 * e + h;
    else if constexpr (kBits == 3) return spread3_field(h, e);
    else return 4 * h + e;
  }

  struct Value {
    static constexpr bool kBf16 = false, kDense = false, kBulk = false;
    static constexpr int kChunk = 32, kRanges = 3;
    template <int D, int DP, int C>
    static constexpr int pieces() {
      static_assert(C == 32, "turbo_rvq values: chunks of 32 tokens");
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
      sections<D, C>(a, cc, r, offset, bytes);
    }
    KVQ_HD static constexpr int channel(int j, int col) {
      return 64 * (j >> 3) + 8 * col + value_field((j >> 2) & 1, j & 3);
    }
    KVQ_HD static constexpr int token_at(int vs, int e) { return 4 * vs + e; }
    /// The lane's tokens 8i .. 8i + 7: norm * 2^-12 (the levels are stored times 2^12).
    template <int C>
    KVQ_HD static void weights(const uint8_t* const* prm, int lane, float (&w)[C / 4]) {
      const uint4 nr = load16(prm[2] + 16 * (lane & 3));
      KVQ_UNROLL
      for (int t = 0; t < C / 4; ++t) w[t] = half_at(nr, t) * 0x1p-12f;
    }
    /// Tile j: channel pc + channel(j, n) of the lane's tokens 8i + 4vs + q, stage 1 + stage 2 in fp16. The 4 tiles
    /// of one nibble word share its loads and lookups (the same expressions in each unrolled call).
    template <int D, int DP, int C>
    KVQ_HD static void bfrags(const uint4*, const uint8_t* const* prm, const CodecArgs&, int lane, int j, int pc,
                              uint32_t (&b)[C / 16][2]) {
      const int h = (j >> 2) & 1, e = j & 3;
      const uint32_t sel = e & 1 ? 0x7632u : 0x5410u;
      uint32_t t1[8], t2[8];
      stage_table(prm, 0, t1);
      stage_table(prm, 1, t2);
      // The lane's first run (token 8i, channels pc + 8n ..), the same in every call: the calls' loads and lookups
      // merge where they are equal; tile j adds its row and block as constants.
      const int first = C / 4 * (lane & 3) * row_bytes<D>() + (pc / 8 + (lane >> 2)) * kBits;
      uint32_t level[C / 4];  // the lane's tokens: {field e - e % 2, field e - e % 2 + 1} of stage 1 + stage 2
      KVQ_UNROLL
      for (int x = 0; x < C / 4; ++x) {
        const int at = first + x * row_bytes<D>() + 8 * kBits * (j >> 3);
        uint32_t a01, a23, b01, b23;
        lookup<kBits>(value_nibbles(value_run(prm[0] + at), h), t1, a01, a23);
        lookup<kBits>(value_nibbles(value_run(prm[1] + at), h), t2, b01, b23);
        level[x] = e >> 1 ? h2_fma(a23, 0x3C003C00u, b23) : h2_fma(a01, 0x3C003C00u, b01);
      }
      KVQ_UNROLL
      for (int vs = 0; vs < C / 16; ++vs) {
        b[vs][0] = prmt(level[4 * vs], level[4 * vs + 1], sel);
        b[vs][1] = prmt(level[4 * vs + 2], level[4 * vs + 3], sel);
      }
    }
  };
};

}  // namespace kvq::cuda::detail

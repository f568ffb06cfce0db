// turbo_prod:b keys in the decode kernel (decode_kernel.cuh): the codec space is [R x (d) | S x (m = d)], so the
// kernel's key space is 2d and its k steps fall in two groups of d / 16: the turbo_mse:(b-1) part, decoded as
// TurboMseTraits<b - 1>'s keys (exact fp16 levels, its norm on the score tile), then the sign part, read as qjl's sign
// key fragments (qjl_traits.cuh) with the residual norm on the score tile. The signs lie in their own section of
// the block, so the chunk's sign tiles (4d bytes) come as a parameter range, next to the two norm ranges; the
// sketch factor sqrt(pi/2)/m is folded into the query map.
#pragma once

#include <cstdint>

#include "cuda/codec_traits.cuh"
#include "cuda/qjl_traits.cuh"

namespace kvq::cuda::detail {

template <int kBits>
struct TurboProdTraits {
  using Mse = typename TurboMseTraits<kBits - 1>::Key;
  using MseValue = typename TurboMseTraits<kBits - 1>::Value;

  /// r = 0: the chunk's norms; r = 1: its sign tiles (C x m bits, m = D); r = 2: its residual norms.
  template <int D, int C>
  KVQ_HD static void sections(const CodecArgs& a, int cc, int r, uint32_t& offset, uint32_t& bytes) {
    bytes = r == 1 ? C * D / 8 : 2u * C;
    offset = (r == 0 ? a.sec0 : r == 1 ? a.sec1 : a.sec2) + static_cast<uint32_t>(cc) * bytes;
  }

  struct Key {
    static constexpr bool kBf16 = false, kSplitB = false, kChunkA = false, kDense = false, kBulk = false;
    static constexpr bool kGroups = false;  // a factor per token after each part (groups of D / 16 k steps)
    static constexpr int kChunk = 32, kRanges = 3;
    template <int D>
    KVQ_HD static constexpr int space() {
      return 2 * D;
    }
    template <int D, int C>
    static constexpr int pieces() {
      return Mse::template pieces<D, C>();
    }
    template <int D, int C>
    static constexpr uint32_t chunk_bytes() {
      return Mse::template chunk_bytes<D, C>();
    }
    template <int D, int C>
    static constexpr int slots() {
      return Mse::template slots<D, C>();
    }
    KVQ_HD static constexpr int copy_slot(int k, int lane) { return Mse::copy_slot(k, lane); }
    template <int D, int C>
    KVQ_HD static int piece(const CodecArgs& a, int lane, int k) {
      return Mse::template piece<D, C>(a, lane, k);
    }
    template <int D, int C>
    KVQ_HD static void range(const CodecArgs& a, int cc, int r, uint32_t& offset, uint32_t& bytes) {
      sections<D, C>(a, cc, r, offset, bytes);
    }
    template <int D>
    KVQ_HD static constexpr int channel(int ks, int k) {
      return ks < D / 16 ? Mse::template channel<D>(ks, k) : D + SignKeyMap<D>::row(ks - D / 16, k);
    }
    template <int D, int C>
    KVQ_HD static void bfrags(const uint4* codes, const uint8_t* const* prm, int ks, const CodecArgs& a, int lane,
                              uint32_t (&b)[C / 8][2]) {
      using Signs = SignKeyMap<D>;
      if (ks < D / 16) return Mse::template bfrags<D, C>(codes, ks, a, lane, b);
      const int x = ks - D / 16;
      sign_key_frags<C>(load16(prm[1] + Signs::slot(lane, x / Signs::kSteps)), Signs::shift(lane & 3),
                        x % Signs::kSteps, b);
    }
    /// Group 0 (the mse part): the norm, as turbo_mse; group 1 (the sign part): the residual norm.
    template <int D, int C>
    KVQ_HD static void scale_group(const uint8_t* const* prm, const CodecArgs& a, int lane, int gr,
                                   const float (&acc)[C / 8][4], float (&s)[C / 8][2]) {
      if (gr == 0) return Mse::template scale_group<D, C>(prm, a, lane, gr, acc, s);
      uint4 nr[C / 32];
      run_halves<C>(prm[2], 1, lane & 3, 0, nr);
      scale_tiles<C>(nr, 1.0f, acc, s);
    }
  };

  // Values: the space [R x | S x] in parts of D channels, each summed by warps of its own (its own weights: the
  // norm or the residual norm, times 2^-12). The mse part is TurboMseTraits<b - 1>'s values; the sign part reads the
  // chunk's "rows in lanes" sign tiles (a parameter range): value tile j, column n is row lane_tile_channel(j, n)
  // of the part, whose word holds the chunk's 32 tokens, lane i taking byte i (tokens 8i .. 8i + 7) as +-4096.
  // The sign part's warps copy the mse slots too (the slot count is the pair's), unused.
  struct Value {
    static constexpr bool kBf16 = false, kDense = false, kBulk = false;
    static constexpr int kChunk = 32, kRanges = 3;
    template <int D>
    KVQ_HD static constexpr int space() {
      return 2 * D;
    }
    template <int D>
    KVQ_HD static constexpr int part() {
      return D;
    }
    template <int D, int DP, int C>
    static constexpr int pieces() {
      return MseValue::template pieces<D, DP, C>();
    }
    template <int D, int C>
    static constexpr uint32_t chunk_bytes() {
      return MseValue::template chunk_bytes<D, C>();
    }
    template <int D, int DP, int C>
    static constexpr int slots() {
      return MseValue::template slots<D, DP, C>();
    }
    KVQ_HD static constexpr int copy_slot(int k, int lane) { return MseValue::copy_slot(k, lane); }
    template <int D, int DP, int C>
    KVQ_HD static int piece(const CodecArgs& a, int lane, int k, int pc) {
      return MseValue::template piece<D, DP, C>(a, lane, k, pc % D);
    }
    template <int D, int DP, int C>
    KVQ_HD static void range(const CodecArgs& a, int cc, int r, uint32_t& offset, uint32_t& bytes) {
      sections<D, C>(a, cc, r, offset, bytes);
    }
    KVQ_HD static constexpr int channel(int j, int col) { return lane_tile_channel(j, col); }
    KVQ_HD static constexpr int token_at(int vs, int e) { return 4 * vs + e; }
    static_assert(MseValue::token_at(1, 2) == token_at(1, 2), "both parts pair the same tokens");
    template <int D, int C>
    KVQ_HD static void weights(const uint8_t* const* prm, int lane, int pc, float (&w)[C / 4]) {
      if (pc < D) return MseValue::template weights<C>(prm, lane, w);
      const uint4 nr = load16(prm[2] + 16 * (lane & 3));
KVQ_UNROLL
      for (int t = 0; t < C / 4; ++t) w[t] = half_at(nr, t) * 0x1p-12f;
    }
    template <int D, int DP, int C>
    KVQ_HD static void bfrags(const uint4* codes, const uint8_t* const* prm, const CodecArgs& a, int lane, int j,
                              int pc, uint32_t (&b)[C / 16][2]) {
      static_assert(C == 32, "turbo_prod values: chunks of 32 tokens");
      if (pc < D) return MseValue::template bfrags<D, DP, C>(codes, prm, a, lane, j, pc, b);
      const int n = lane >> 2, k16 = (pc - D + 32 * (j >> 2)) / 16 + (n >> 2);
      const uint32_t u = word(load16(prm[1] + 64 * k16 + 16 * (n & 3)), j & 3) >> (8 * (lane & 3));
      const uint32_t v = (u & 0xffu) * 0x8001u;  // token t at bit t, token t + 1 also at bit t + 16
KVQ_UNROLL
      for (int vs = 0; vs < C / 16; ++vs) {
        b[vs][0] = sign_pair<kHalf4096>(v, 4 * vs);
        b[vs][1] = sign_pair<kHalf4096>(v, 4 * vs + 2);
      }
    }
  };
};

}  // namespace kvq::cuda::detail

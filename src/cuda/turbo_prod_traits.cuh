// turbo_prod:b keys in the decode kernel (decode_kernel.cuh): the codec space is [R x (d) | S x (m = d)], so the
// kernel's key space is 2d and its k steps fall in two groups of d / 16: the turbo_mse:(b-1) part, decoded as
// TurboMseTraits<b - 1>'s keys (hi + lo levels, its norm on the score tile), then the sign part, read as qjl's sign
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

  struct Key {
    static constexpr bool kBf16 = false, kSplitB = true, kChunkA = false, kDense = false, kBulk = false;
    static constexpr bool kGroups = false;  // a factor per token after each part (groups of D / 16 k steps)
    static constexpr int kChunk = 32, kRanges = 3;
    template <int D>
    KVQ_HD static constexpr int space() {
      return 2 * D;
    }
    /// The mse part's k steps take the lo product.
    template <int D>
    KVQ_HD static constexpr int split_steps() {
      return D / 16;
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
    KVQ_HD static int piece(const CodecArgs& a, int lane, int k) {
      return Mse::template piece<D, C>(a, lane, k);
    }
    /// r = 0: the norms; r = 1: the chunk's sign tiles (C x D bits); r = 2: the residual norms.
    template <int D, int C>
    KVQ_HD static void range(const CodecArgs& a, int cc, int r, uint32_t& offset, uint32_t& bytes) {
      bytes = r == 1 ? C * D / 8 : 2u * C;
      offset = (r == 0 ? a.sec0 : r == 1 ? a.sec1 : a.sec2) + static_cast<uint32_t>(cc) * bytes;
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
    template <int D, int C>
    KVQ_HD static void bfrags_lo(const uint4* codes, int ks, const CodecArgs& a, int lane, uint32_t (&b)[C / 8][2]) {
      Mse::template bfrags_lo<D, C>(codes, ks, a, lane, b);
    }
    /// Group 0 (the mse part): the norm, as turbo_mse; group 1 (the sign part): the residual norm.
    template <int D, int C>
    KVQ_HD static void scale_group(const uint8_t* const* prm, const CodecArgs& a, int lane, int gr,
                                   const float (&acc)[C / 8][4], float (&s)[C / 8][2]) {
      if (gr == 0) return Mse::template scale_group<D, C>(prm, a, lane, gr, acc, s);
      const uint4 nr = load16(prm[2] + 16 * (lane & 3));
KVQ_UNROLL
      for (int jj = 0; jj < C / 8; ++jj) {
        s[jj][0] = fmaf(half_at(nr, jj), acc[jj][0] + acc[jj][2], s[jj][0]);
        s[jj][1] = fmaf(half_at(nr, 4 + jj), acc[jj][1] + acc[jj][3], s[jj][1]);
      }
    }
  };
};

}  // namespace kvq::cuda::detail

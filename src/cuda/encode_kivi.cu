// The append kernel of kivi:2, kivi:3 and kivi:4 (src/codec/kivi.cpp): no rotation; keys take one range per channel
// over the page's tokens, values one per token and group of G channels. A range [lo, hi] is stored as m = lo rounded
// down to fp16 and s = the smallest fp16 >= (hi - m) / (2^b - 1), codes round((x - m) / s) (the float quotient
// from s's reciprocal, exact_quotient.cuh). Keys: a thread per
// channel's range (two threads a channel, each half of the tokens, where 2 d <= 256), a barrier, then a warp per
// item of tokens x channels (lane_tile_items.cuh) builds its code words;
// values: a warp per item through ranges, codes and code words with no block barrier. Bit-exact with the CPU
// encoder (its order of comparisons, which picks the sign of a zero minimum or maximum).
// kivi:3 (layout::Kivi's two planes) runs kivi:2's items and words for the codes' low two bits and builds their high
// bits beside them: a key's high word (32 channels of one token) from the 8 lanes of its quads, a value item's 16
// tokens of one channel as one half of a high word (32 tokens, put_half: the other item of those tokens owns the
// other half).
#include <initializer_list>
#include <memory>

#include "codec/kivi.hpp"
#include "cuda/device_half.cuh"
#include "cuda/encode_kernel.cuh"
#include "cuda/exact_quotient.cuh"
#include "cuda/lane_tile_items.cuh"

namespace kvq::cuda::detail {
namespace {

struct KiviEnc {
  static constexpr int kBlocksPerSM = 5;
  // log2 of the code bits (kivi:3: of its first plane's, 2) and of the value group size; 2^b - 1
  int lb = 1, lg = 5, levels = 3;
  bool key = true;
  uint32_t mins_offset = 0, scales_offset = 0;
  uint32_t high_offset = 0;  // kivi:3: where its high-bit plane starts (kivi_high_plane_offset); 0: one plane

  // The ranges' (m, s, 1 / s): keys d of each; values each warp's item, kItemPairs of each.
  __host__ __device__ size_t scratch_floats(int, int d) const {
    return 3 * static_cast<size_t>(key ? d : kItemPairs * (kEncodeThreads / 32));
  }

  // Stores range p (outward fp16 rounding); false where fp16 cannot hold it.
  __device__ bool store_range(uint32_t* block, int p, float lo, float hi, float& m, float& s) const {
    const uint16_t hm = f16_bits_round_down(static_cast<double>(lo));
    m = f16_bits_to_float(hm);
    const uint16_t hs = f16_bits_round_up(__ddiv_rn(__dsub_rn(static_cast<double>(hi), static_cast<double>(m)),
                                                    static_cast<double>(levels)));
    s = f16_bits_to_float(hs);
    put_half(block, mins_offset + 2 * p, hm);
    put_half(block, scales_offset + 2 * p, hs);
    return isfinite(m) && isfinite(s);
  }

  // The code of v in a range (m, s) with y = RN(1 / s) (exact_quotient.cuh), or 0 where s = y = 0 (a constant
  // range: every value equals m).
  __device__ uint32_t code(float v, float m, float s, float y) const {
    return rounded_code_bits(__fsub_rn(v, m), s, y, 0.0f, static_cast<float>(levels)) & static_cast<uint32_t>(levels);
  }

  // The role a compile-time branch: each instantiation keeps only its own path's values live (both in one body
  // need more registers than kBlocksPerSM allows).
  __device__ void encode(const EncodeContext& ctx, float* x, float* scratch, uint32_t* block) const {
    if (key)
      encode_role<true>(ctx, x, scratch, block);
    else
      encode_role<false>(ctx, x, scratch, block);
  }

  template <bool kKey>
  __device__ void encode_role(const EncodeContext& ctx, float* x, float* scratch, uint32_t* block) const {
    const int T = ctx.T, d = ctx.d, G = 1 << lg, S = kKey ? 32 : G > 32 ? G : 32, P = 32 >> lb;
    // per_span = S / G value pairs of an item's token (1, or 2 where G = 16): indices by shifts, not divisions
    const int ls = kKey || lg < 5 ? 5 : lg, lps = kKey ? 0 : ls - lg, per_span = 1 << lps;  // S = 2^ls
    const int lane = static_cast<int>(threadIdx.x) & 31;
    const int bits = 1 << lb;  // of a word's codes (kivi:3: the low two)
    const uint32_t low_mask = (1u << bits) - 1;
    // keys: mins[c], steps[c], inverses[c] (RN(1 / steps[c]), 0 for 0); values: the warp's item pairs
    float* mins = scratch + (kKey ? 0 : 3 * kItemPairs * (static_cast<int>(threadIdx.x) >> 5));
    float* steps = mins + (kKey ? d : kItemPairs);
    // inverses[i] = steps[i + n]: an offset that is a constant for values (no register for its own pointer)
    const int n_ranges = kKey ? d : kItemPairs;
    if constexpr (kKey) {
      // Where the block has two threads a channel (d <= 128 at 256 threads), each takes half of the page's tokens
      // and the later half's (lo, hi) meets the earlier's through mins / steps: half the serial chain of compares
      // and every thread busy, in std::min / std::max's order over the whole page (the loop below).
      const int tid = static_cast<int>(threadIdx.x), n = static_cast<int>(blockDim.x);
      // Channel c over tokens [t_begin, t_end) in std::min / std::max's order: the first of equal values stays.
      auto scan = [&](int c, int t_begin, int t_end, float& lo, float& hi) {
        lo = hi = x[t_begin * d + c];
        for (int t = t_begin + 1; t < t_end; ++t) {
          const float e = x[t * d + c];
          lo = e < lo ? e : lo;
          hi = hi < e ? e : hi;
        }
      };
      // The channel's (min, step) into the block and, for the items, into mins / steps.
      auto publish = [&](int c, float lo, float hi) {
        float m = 0, s = 0;
        if (!store_range(block, c, lo, hi, m, s)) {
          ctx.report(0, c);
          m = s = 0;
        }
        mins[c] = m;
        steps[c] = s;
        steps[n_ranges + c] = code_inverse(s);
      };
      const bool halves = 2 * d <= n && T >= 2;
      if (halves) {
        const bool later = tid >= d;
        const int c = later ? tid - d : tid;
        float lo = 0, hi = 0;
        if (tid < 2 * d) {
          scan(c, later ? T / 2 : 0, later ? T : T / 2, lo, hi);
          if (later) {
            mins[c] = lo;
            steps[c] = hi;
          }
        }
        __syncthreads();
        if (!later) {
          // The later half replaces only a strictly smaller minimum or a strictly larger maximum: the first of
          // equal values stays, as over the whole page in order.
          const float lo2 = mins[c], hi2 = steps[c];
          lo = lo2 < lo ? lo2 : lo;
          hi = hi < hi2 ? hi2 : hi;
          publish(c, lo, hi);
        }
      }
      for (int c = tid; !halves && c < d; c += n) {
        float lo, hi;
        scan(c, 0, T, lo, hi);
        publish(c, lo, hi);
      }
      __syncthreads();
    }
    const ItemQuad q = ItemQuad::of(ls, lane);
    for_each_lane_tile_item(T, d, 5 - lb, ls, [&](int t0, int c0) {
      const int c = c0 + q.c;
      if constexpr (!kKey) {
        // Each (token, group)'s range in std::minmax_element's order (the first of equal minima, the last of equal
        // maxima): a lane's quad in order, then its group's lanes, lower channels first.
        for (int r = 0; r < P; r += q.tokens_per_round) {
          float lo = 0, hi = 0;
          if (c < d) {
            const float4 v = *reinterpret_cast<const float4*>(x + (t0 + r + q.p) * d + c);
            lo = hi = v.x;
            for (const float e : {v.y, v.z, v.w}) {
              lo = e < lo ? e : lo;
              hi = e < hi ? hi : e;
            }
          }
          // G / 4 lanes a group (G <= 128): the steps unrolled, each under a warp-uniform condition
#pragma unroll
          for (int m = 1; m < 32; m <<= 1) {
            if (m >= G / 4) break;
            const float other_lo = __shfl_xor_sync(kFullWarp, lo, m), other_hi = __shfl_xor_sync(kFullWarp, hi, m);
            const bool upper = (lane & m) != 0;  // this lane's channels follow the other's
            const float lo_a = upper ? other_lo : lo, lo_b = upper ? lo : other_lo;
            const float hi_a = upper ? other_hi : hi, hi_b = upper ? hi : other_hi;
            lo = lo_b < lo_a ? lo_b : lo_a;
            hi = hi_b < hi_a ? hi_a : hi_b;
          }
          if ((lane & (G / 4 - 1)) == 0) {
            mins[((r + q.p) << lps) + (q.c >> lg)] = lo;
            steps[((r + q.p) << lps) + (q.c >> lg)] = hi;
          }
        }
        __syncwarp();
        // Lane i: the (m, s) of pair i (token i / per_span, group i % per_span of the span), over its (lo, hi).
        if (lane < P * per_span) {
          const int t = t0 + (lane >> lps), gc = c0 + ((lane & (per_span - 1)) << lg);
          if (gc < d) {
            float m = 0, s = 0;
            if (!store_range(block, kivi_param(false, d, lg, t, gc), mins[lane], steps[lane], m, s)) {
              ctx.report(t, gc);
              m = s = 0;
            }
            mins[lane] = m;
            steps[lane] = s;
            steps[n_ranges + lane] = code_inverse(s);
          }
        }
        __syncwarp();
        for (int j = lane; j < S && c0 + j < d; j += 32) {
          uint32_t word = 0, high = 0;
#pragma unroll 2  // further, the loop's registers spill
          for (int p = 0; p < P; ++p) {
            const int k = (p << lps) + (j >> lg);
            const uint32_t u = code(x[(t0 + p) * d + c0 + j], mins[k], steps[k], steps[n_ranges + k]);
            word |= (u & low_mask) << (p << lb);
            high |= (u >> bits) << p;  // kivi:3's high bit (0 for kivi:2 and kivi:4)
          }
          store_value_word(block, d, lb, t0, c0 + j, word);
          if (high_offset != 0)  // P = 16 tokens: bits t0 % 32 .. of the 32-token word, an even byte
            put_half(block, high_offset + lane_tile_place(false, d, 0, t0, c0 + j).byte, static_cast<uint16_t>(high));
        }
        __syncwarp();  // the next item reuses the pairs
        return;
      }
      const float4 m4 = c < d ? *reinterpret_cast<const float4*>(mins + c) : float4{};
      const float4 s4 = c < d ? *reinterpret_cast<const float4*>(steps + c) : float4{};
      for (int r = 0; r < P; r += q.tokens_per_round) {
        const int t = t0 + r + q.p;
        uint32_t codes = 0, high = 0;
        if (c < d) {
          const float4 v = *reinterpret_cast<const float4*>(x + t * d + c);
          // read each round: held beside m4 and s4 across the rounds, it would spill
          const float4 y4 = *reinterpret_cast<const float4*>(steps + n_ranges + c);
          const uint32_t u[4] = {code(v.x, m4.x, s4.x, y4.x), code(v.y, m4.y, s4.y, y4.y),
                                 code(v.z, m4.z, s4.z, y4.z), code(v.w, m4.w, s4.w, y4.w)};
          for (int e = 0; e < 4; ++e) {
            codes |= (u[e] & low_mask) << (e << lb);
            high |= (u[e] >> bits) << e;  // kivi:3's high bit (0 for kivi:2 and kivi:4)
          }
        }
        store_key_quad_word(block, d, lb, lane, t, c, codes);
        // kivi:3: the high word of token t's 32 channels from c - c % 32 (S = 32: the quads of 8 lanes; d is a
        // multiple of 32)
        if (high_offset != 0) store_key_quad_word(block + high_offset / 4, d, 0, lane, t, c, high);
      }
    });
  }
};

int log2_of(int x) { return FastDiv::of(x).shift; }

class KiviEncoder final : public EncoderOf<KiviEnc> {
 public:
  KiviEncoder(const Codec& codec, const layout::Kivi& l) : EncoderOf(codec.spec().str()) {
    enc_.lb = log2_of(static_cast<int>(l.plane_bits(0)));
    enc_.lg = log2_of(static_cast<int>(l.G));
    enc_.levels = (1 << l.bits) - 1;
    enc_.key = l.key;
    enc_.mins_offset = static_cast<uint32_t>(l.mins_offset());
    enc_.scales_offset = static_cast<uint32_t>(l.scales_offset());
    if (l.planes() == 2)
      enc_.high_offset = kivi_high_plane_offset(l.key, static_cast<int>(l.d), static_cast<int>(l.T));
  }
};

}  // namespace

std::unique_ptr<DeviceEncoder> make_kivi_encoder(const Codec& codec) {
  const auto l = kivi_layout(codec);
  if (!l) return nullptr;
  return std::make_unique<KiviEncoder>(codec, *l);
}

}  // namespace kvq::cuda::detail

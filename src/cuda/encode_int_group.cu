// The append kernel of int8 and int4 (src/codec/int_group.cpp): rotate, divide by the trained per-channel lambda,
// then per token and group an fp16 absmax scale (nearest, up where the nearest would leave a code past qmax + 1/2)
// and codes round(x / s) clamped to +-qmax in the 64-byte lane tiles of layout::IntGroup. Both quotients are the
// CPU's IEEE ones, formed from reciprocals (exact_quotient.cuh: lambda's uploaded beside it, each scale's once per
// token and group). The Hadamard rotation divides by lambda in its own pass (rotate_device.cuh: the rotated row is
// in registers); after the rotation (a barrier) a warp takes an item of tokens x whole groups (lane_tile_items.cuh)
// through the scales (lambda too under a dense rotation), codes and code words with no block barrier. The two roles
// are separate instantiations of the item loop (fewer live registers: 5 blocks of 256 threads per SM). Bit-exact
// with the CPU encoder under the Hadamard rotation; other rotations differ in float order (dense matrix).
#include <memory>
#include <vector>

#include "codec/block_layout.hpp"
#include "codec/int_group.hpp"
#include "cuda/device_half.cuh"
#include "cuda/encode_kernel.cuh"
#include "cuda/exact_quotient.cuh"
#include "cuda/lane_tile_items.cuh"
#include "cuda/rotate_device.cuh"

namespace kvq::cuda::detail {
namespace {

struct IntEnc {
  static constexpr int kBlocksPerSM = 5;
  RotationView rot;
  const Divisor* lambda = nullptr;  // per channel
  int lb = 2, lg = 5, qmax = 7;  // log2 of the code bits and of the group size
  bool key = true;
  uint32_t scales_offset = 0;

  // The dense rotation's spare tile, then each warp's item: a scale and its reciprocal per (token, group).
  __host__ __device__ size_t scratch_floats(int T, int d) const {
    return (rot.hadamard() ? 0 : static_cast<size_t>(T) * d) +
           static_cast<size_t>(2 * kItemPairs) * (kEncodeThreads / 32);
  }

  // group_scale of int_group.cpp: the fp16 scale of a group whose largest |x''| is amax. The CPU rounds the double
  // quotient amax / qmax to float; the float quotient (one IEEE single division) is that same float, since rounding
  // a quotient of two floats first to double (53 >= 2 * 24 + 2 bits) and then to float never differs from rounding
  // it once (Figueroa, "When is double rounding innocuous?", 1995), so the nearest fp16 is the same. The CPU's
  // test amax <= (qmax + 1/2) * s in double is exact, and so is its float form: qmax + 1/2 (7.5, 127.5) has at most 8
  // significant bits, an fp16 s at most 11, their product is a float (or inf, as in double where s is inf). Only
  // the rare round-up (a code would pass qmax + 1/2) needs the double quotient.
  __device__ uint16_t group_scale(float amax) const {
    const float q = static_cast<float>(qmax);
    const uint16_t h = to_f16_bits(__fdiv_rn(amax, q));
    if (amax <= __fmul_rn(__fadd_rn(q, 0.5f), f16_bits_to_float(h))) return h;
    return f16_bits_round_up(__ddiv_rn(static_cast<double>(amax), static_cast<double>(qmax)));
  }

  // The code of x'' in a group of scale s = sy.x (sy.y: its reciprocal, 0 where s = 0), masked to its 2^lb bits.
  __device__ uint32_t code(float v, float2 sy) const {
    const float lim = static_cast<float>(qmax);
    return rounded_code_bits(v, sy.x, sy.y, -lim, lim) & ((1u << (1 << lb)) - 1);
  }

  __device__ void encode(const EncodeContext& ctx, float* x, float* scratch, uint32_t* block) const {
    // Under the Hadamard rotation x'' = x' / lambda is formed in the rotation's pass, in registers (the same IEEE
    // quotient); a dense rotation leaves it to the items.
    const bool divided = rot.hadamard();
    // (d >= 256 rotated outside this body: inlined, its rows' registers spilled here)
    rotate_rows</*kOutlineSingle=*/true>(rot, x, scratch, ctx.T, ctx.d, ctx.dd, divided ? lambda : nullptr);
    float2* scales = reinterpret_cast<float2*>(scratch + (divided ? 0 : ctx.T * ctx.d)) +
                     kItemPairs * (static_cast<int>(threadIdx.x) >> 5);
    // The role a compile-time branch: each instantiation keeps only its own path's values live (both in one body
    // need more registers than kBlocksPerSM allows).
    if (key)
      encode_items<true>(ctx, x, scales, block, divided);
    else
      encode_items<false>(ctx, x, scales, block, divided);
  }

  template <bool kKey>
  __device__ void encode_items(const EncodeContext& ctx, float* x, float2* scales, uint32_t* block,
                               bool divided) const {
    const int T = ctx.T, d = ctx.d, G = 1 << lg, groups = d >> lg, S = G > 32 ? G : 32, P = 32 >> lb;
    // per_span = S / G pairs of an item's token (1, or 2 where G = 16): indices by shifts, not divisions
    const int ls = lg > 5 ? lg : 5, lps = ls - lg, per_span = 1 << lps, lane = static_cast<int>(threadIdx.x) & 31;
    const ItemQuad q = ItemQuad::of(ls, lane);
    for_each_lane_tile_item(T, d, 5 - lb, ls, [&](int t0, int c0) {
      const int c = c0 + q.c;
      // x'' = x' / lambda in place (unless the rotation formed it: a dense rotation's items divide, their
      // reciprocal form would spill registers here), and each (token, group)'s largest |x''| (the maximum does not
      // depend on the order) into its pair's slot.
      for (int r = 0; r < P; r += q.tokens_per_round) {
        float amax = 0;
        if (c < d) {
          float4* at = reinterpret_cast<float4*>(x + (t0 + r + q.p) * d + c);
          float4 v = *at;
          if (!divided) {
            v = {__fdiv_rn(v.x, lambda[c].b), __fdiv_rn(v.y, lambda[c + 1].b), __fdiv_rn(v.z, lambda[c + 2].b),
                 __fdiv_rn(v.w, lambda[c + 3].b)};
            *at = v;
          }
          amax = fmaxf(fmaxf(fabsf(v.x), fabsf(v.y)), fmaxf(fabsf(v.z), fabsf(v.w)));
        }
        // G / 4 lanes a group (G <= 64): the steps unrolled, each under a warp-uniform condition
#pragma unroll
        for (int m = 1; m < 16; m <<= 1)
          if (m < G / 4) amax = fmaxf(amax, __shfl_xor_sync(kFullWarp, amax, m));
        if ((lane & (G / 4 - 1)) == 0) scales[((r + q.p) << lps) + (q.c >> lg)].x = amax;
      }
      __syncwarp();
      // Lane i: the scale of pair i (token i / per_span, group i % per_span of the span) and its reciprocal.
      if (lane < P * per_span) {
        const int t = t0 + (lane >> lps), gc = c0 + ((lane & (per_span - 1)) << lg);
        if (gc < d) {
          const uint16_t h = group_scale(scales[lane].x);
          float s = f16_bits_to_float(h);
          if (!isfinite(s)) {
            ctx.report(t, gc);
            s = 0;
          }
          scales[lane] = {s, code_inverse(s)};
          put_half(block, scales_offset + int_scale_byte(groups, t, gc >> lg), h);
        }
      }
      __syncwarp();
      if constexpr (kKey) {
        for (int r = 0; r < P; r += q.tokens_per_round) {
          const int p = r + q.p;
          uint32_t codes = 0;
          if (c < d) {
            const float2 s = scales[(p << lps) + (q.c >> lg)];
            const float4 v = *reinterpret_cast<const float4*>(x + (t0 + p) * d + c);
            codes = code(v.x, s) | code(v.y, s) << (1 << lb) | code(v.z, s) << (2 << lb) | code(v.w, s) << (3 << lb);
          }
          store_key_quad_word(block, d, lb, lane, t0 + p, c, codes);
        }
      } else {
        for (int j = lane; j < S && c0 + j < d; j += 32) {
          uint32_t word = 0;
          // P = 4 or 8 tokens: 4 at a time
          for (int p = 0; p < P; p += 4) {
#pragma unroll
            for (int u = p; u < p + 4; ++u)
              word |= code(x[(t0 + u) * d + c0 + j], scales[(u << lps) + (j >> lg)]) << (u << lb);
          }
          store_value_word(block, d, lb, t0, c0 + j, word);
        }
      }
      __syncwarp();  // the next item reuses the scales
    });
  }
};

int log2_of(int x) { return FastDiv::of(x).shift; }

class IntGroupEncoder final : public EncoderOf<IntEnc> {
 public:
  IntGroupEncoder(const Codec& codec, const IntGroupParams& p)
      : EncoderOf(codec.spec().str()), rotation_(upload_rotation(codec)) {
    const size_t d = static_cast<size_t>(codec.dim());
    std::vector<Divisor> lambda(d);
    for (size_t c = 0; c < d; ++c) lambda[c] = divisor_of(p.lambda[c]);
    static_assert(sizeof(Divisor) == 2 * sizeof(float));
    lambda_ = upload_floats(&lambda[0].b, 2 * d);
    const bool key = codec.role() == Role::key;
    const layout::IntGroup l{d, static_cast<size_t>(codec.block_tokens()), static_cast<size_t>(p.bits),
                             static_cast<size_t>(p.group), key};
    enc_.rot = {rotation_.signs.get(), rotation_.columns.get(), rotation_.scale};
    enc_.lambda = reinterpret_cast<const Divisor*>(lambda_.get());
    enc_.lb = log2_of(p.bits);
    enc_.lg = log2_of(p.group);
    enc_.qmax = p.bits == 8 ? 127 : 7;
    enc_.key = key;
    enc_.scales_offset = static_cast<uint32_t>(l.scales_offset());
  }

 private:
  DeviceRotation rotation_;
  std::shared_ptr<float> lambda_;  // d Divisors
};

}  // namespace

std::unique_ptr<DeviceEncoder> make_int_group_encoder(const Codec& codec) {
  const auto p = int_group_params(codec);
  if (!p) return nullptr;
  return std::make_unique<IntGroupEncoder>(codec, *p);
}

}  // namespace kvq::cuda::detail

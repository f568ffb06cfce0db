// Device-side decoding of each codec's block (include/kvq/block_layout.hpp) from shared memory, for the decode
// attention kernel. Every codec offers the same two reads of a block staged in shared memory:
//   key_slice(blk, t, c0, k):     k[j] = y_{t, c0 + j} / sigma_{c0 + j}, j < 8 (c0 a multiple of 8)
//   value_chunk(blk, t0, c, v):   v[j][i] = y_{t0 + j, c + i} / sigma_{c + i}, j < 8 tokens, i < 2 (c even)
// where y is the codec-space decode and sigma a per-channel factor folded into the query map and the output map
// (int8/int4's lambda; 1 elsewhere). Args carry what the layout does not fix at compile time.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace kvq::cuda::detail {

/// Run-time parameters of one codec's blocks.
struct CodecArgs {
  int T = 0;                        ///< tokens per block
  int group = 0;                    ///< int8/int4: channels per scale; kivi values: channels per (min, scale)
  const float* levels = nullptr;    ///< turbo_mse: 2^bits Lloyd–Max levels (device memory)
};

__device__ __forceinline__ float f16_at(const uint8_t* p) { return __half2float(*reinterpret_cast<const __half*>(p)); }

// ---- f16 / bf16: [T x d] token-major ---------------------------------------------------------------------------
template <bool kBf16>
struct FloatTraits {
  static constexpr int kLevels = 0;
  static constexpr bool kTokenLanes = false;
  __device__ static float2 pair(const uint8_t* p) {
    if constexpr (kBf16) return __bfloat1622float2(*reinterpret_cast<const __nv_bfloat162*>(p));
    else return __half22float2(*reinterpret_cast<const __half2*>(p));
  }
  template <int D>
  __device__ static void key_slice(const uint8_t* blk, int t, int c0, float (&k)[8], const CodecArgs&, const float*) {
    const uint4 raw = *reinterpret_cast<const uint4*>(blk + 2 * (t * D + c0));
    const uint32_t w[4] = {raw.x, raw.y, raw.z, raw.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const float2 f = pair(reinterpret_cast<const uint8_t*>(&w[i]));
      k[2 * i] = f.x;
      k[2 * i + 1] = f.y;
    }
  }
  template <int D>
  __device__ static void value_chunk(const uint8_t* blk, int t0, int c, float (&v)[8][2], const CodecArgs&,
                                     const float*) {
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const float2 f = pair(blk + 2 * ((t0 + j) * D + c));
      v[j][0] = f.x;
      v[j][1] = f.y;
    }
  }
};

// ---- int8 / int4 (IntGroup): keys tokens-in-lanes, values channels-in-lanes, fp16 scales in 16-token tiles -----
// Codes are decoded without integer-to-float conversions (16 per clock per SM on Hopper): the lane is flipped to
// offset binary (element + 2^(bits-1), unsigned), each element is masked in place into the mantissa of 2^23 and the
// float minus (2^23 + 2^(bits-1) 2^pos) is exactly element * 2^pos, pos being its bit position (elements above bit
// 23 - bits are shifted down first). The factor 2^-pos is folded into the queries (keys) or the scales (values).
template <int kBits>
struct IntTraits {
  static constexpr int kLevels = 0;
  static constexpr bool kTokenLanes = true;  // score_half: two lanes per token, no per-token reductions
  static constexpr int E = 32 / kBits;  // elements per 32-bit lane
  static constexpr int J = (23 - kBits) / kBits + 1;  // elements 0..J-1 fit the mantissa in place
  static constexpr uint32_t kFlip = kBits == 4 ? 0x88888888u : 0x80808080u;
  __device__ static constexpr int pos(int j) { return kBits * (j < J ? j : j - J); }
  /// The exact power of two that undoes element j's bit position.
  __device__ static float unpos(int j) { return __int_as_float((127 - pos(j)) << 23); }
  /// Query factor of channel c for score_half: its element's 2^-pos.
  __device__ static float q_factor(int c) { return unpos(c % E); }
  /// k[j] = element j of the lane * 2^pos(j), exactly.
  __device__ static void decode_word(uint32_t w, float (&k)[E]) {
    const uint32_t u = w ^ kFlip, hi = u >> (kBits * J);
#pragma unroll
    for (int j = 0; j < E; ++j) {
      const uint32_t bits = (j < J ? u : hi) & (((1u << kBits) - 1) << pos(j));
      k[j] = __uint_as_float(bits | 0x4B000000u) - (8388608.0f + static_cast<float>(1u << (kBits - 1 + pos(j))));
    }
  }
  template <int D>
  __device__ static int scales_offset(const CodecArgs& a) {
    return a.T * D * kBits / 8;
  }
  /// The scale group of channel c: the group size divides D, a power of two, so a shift (no division routine).
  __device__ static int group_of(int c, const CodecArgs& a) { return c >> (__ffs(a.group) - 1); }
  template <int D>
  __device__ static float scale(const uint8_t* blk, int t, int g, const CodecArgs& a) {
    return f16_at(blk + scales_offset<D>(a) + 2 * ((t / 16 * group_of(D, a) + g) * 16 + t % 16));
  }
  /// part[g] = the score of token t against query g over the lanes w = 2i + h of the token (h = 0, 1): the two
  /// lanes of a token read adjacent 64-byte tile rows, so a warp's 16 tokens x 2 halves hit 32 distinct banks.
  /// qs: [G][D] queries times q_factor, in shared memory (16-byte aligned).
  template <int D, int G>
  __device__ static void score_half(const uint8_t* blk, int t, int h, const float* qs, float (&part)[G],
                                    const CodecArgs& a) {
    constexpr int W = D / E;  // lanes (words) per token
    const uint8_t* row = blk + 64 * (t / 16 * W) + 4 * (t % 16);
#pragma unroll
    for (int g = 0; g < G; ++g) part[g] = 0;
#pragma unroll
    for (int i = 0; i < W / 2; ++i) {
      const int w = 2 * i + h;
      float k[E];
      decode_word(*reinterpret_cast<const uint32_t*>(row + 64 * w), k);
      const float s = scale<D>(blk, t, group_of(w * E, a), a);  // one scale per lane (group % E == 0)
#pragma unroll
      for (int g = 0; g < G; ++g) {
        const float4 qa = *reinterpret_cast<const float4*>(qs + g * D + w * E);
        float dot = fmaf(qa.x, k[0], fmaf(qa.y, k[1], fmaf(qa.z, k[2], qa.w * k[3])));
        if constexpr (E == 8) {
          const float4 qb = *reinterpret_cast<const float4*>(qs + g * D + w * E + 4);
          dot = fmaf(qb.x, k[4], fmaf(qb.y, k[5], fmaf(qb.z, k[6], fmaf(qb.w, k[7], dot))));
        }
        part[g] = fmaf(s, dot, part[g]);
      }
    }
  }
  template <int D>
  __device__ static void value_chunk(const uint8_t* blk, int t0, int c, float (&v)[8][2], const CodecArgs& a,
                                     const float*) {
#pragma unroll
    for (int w = 0; w < 8 / E; ++w) {
      const int t = t0 + w * E;
      const uint8_t* tile = blk + 64 * (t / E * (D / 16) + c / 16) + 4 * (c % 16);
      const uint2 words = *reinterpret_cast<const uint2*>(tile);  // channels c, c + 1 (c even)
      float x[E], y[E];
      decode_word(words.x, x);
      decode_word(words.y, y);
#pragma unroll
      for (int j = 0; j < E; ++j) {
        const float s = scale<D>(blk, t + j, group_of(c, a), a) * unpos(j);
        v[w * E + j][0] = s * x[j];
        v[w * E + j][1] = s * y[j];
      }
    }
  }
};

}  // namespace kvq::cuda::detail

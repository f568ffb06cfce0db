// Device-side decoding of each codec's block (include/kvq/block_layout.hpp) from shared memory, for the decode
// attention kernel. Every codec offers the same two reads of a block staged in shared memory:
//   key_slice(blk, t, c0, k):     k[j] = y_{t, c0 + j} / sigma_{c0 + j}, j < 8 (c0 a multiple of 8)
//   value_chunk(blk, t0, c, v):   v[j][i] = y_{t0 + j, c + i} / sigma_{c + i}, j < 8 tokens, i < 2 (c even)
// where y is the codec-space decode and sigma a per-channel factor folded into the query map and the output map
// (1 for these codecs; int8/int4's lambda for the tensor-core kernel). Args carry what the layout does not fix at
// compile time. f16, bf16, int8, int4 and turbo_mse blocks are read by decode_kernel_mma.cuh instead.
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

// ---- kivi: token-major b-bit codes (LSB first), fp16 mins then scales; keys per channel, values per group ----
template <int kBits>
struct KiviTraits {
  static constexpr int kLevels = 0;
  template <int D>
  __device__ static int mins_offset(const CodecArgs& a) {
    return a.T * D * kBits / 8;
  }
  __device__ static int param_align16(int n) { return (2 * n + 15) / 16 * 16; }
  template <int D>
  __device__ static void key_slice(const uint8_t* blk, int t, int c0, float (&k)[8], const CodecArgs& a,
                                   const float*) {
    const uint8_t* codes = blk + t * (D * kBits / 8) + c0 * kBits / 8;
    uint32_t bits = 0;
#pragma unroll
    for (int b = 0; b < kBits; ++b) bits |= static_cast<uint32_t>(codes[b]) << (8 * b);
    const uint8_t* mins = blk + mins_offset<D>(a);
    const uint8_t* scales = mins + param_align16(D);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int c = c0 + j;
      const float q = static_cast<float>((bits >> (kBits * j)) & ((1u << kBits) - 1));
      k[j] = f16_at(mins + 2 * c) + f16_at(scales + 2 * c) * q;
    }
  }
  template <int D>
  __device__ static void value_chunk(const uint8_t* blk, int t0, int c, float (&v)[8][2], const CodecArgs& a,
                                     const float*) {
    const int groups = D / a.group;
    const uint8_t* mins = blk + mins_offset<D>(a);
    const uint8_t* scales = mins + param_align16(a.T * groups);
#pragma unroll
    for (int j = 0; j < 8; ++j) {
      const int t = t0 + j;
      const uint32_t byte = blk[t * (D * kBits / 8) + c * kBits / 8];
      const int shift = c * kBits % 8;
      const int p = t * groups + c / a.group;
      const float m = f16_at(mins + 2 * p), s = f16_at(scales + 2 * p);
      v[j][0] = m + s * static_cast<float>((byte >> shift) & ((1u << kBits) - 1));
      v[j][1] = m + s * static_cast<float>((byte >> (shift + kBits)) & ((1u << kBits) - 1));
    }
  }
};

}  // namespace kvq::cuda::detail

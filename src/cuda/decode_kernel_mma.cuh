// The split-K decode kernel on the tensor cores (mma.sync m16n8k16, fp16 or bf16 operands, fp32 accumulation) for
// f16, bf16, int8, int4 and turbo_mse keys and values. Same blocks, staging, online softmax and partial states as
// decode_split_kernel; only the arithmetic differs: dequantizing into CUDA-core FMAs is compute-bound below the
// byte ratio (see the H200 notes).
//
// Exactness: codes (|q| <= 127) are exact in fp16, stored f16/bf16 values in their own type; turbo_mse's levels
// are split into hi + lo operands like the A side. The fp32 operands that
// multiply them (queries; softmax weights times scales) are split into hi + lo parts of the operand type, carried as
// two rows of the 16-row A operand: row g holds query head g's hi part, row g + 8 its lo part (G <= 8), so that one
// thread's accumulator rows g and g + 8 sum to a result accurate to about 2^-22 (fp16; 2^-17 with bf16), and the
// padding rows cost nothing the tensor cores would not spend anyway.
//   scores: S[16 x 8 tokens] += Qhl[16 x 16 channels] * codes^T, per group of channels, then times the token's scale
//   values: O[16 x 8 channels] += (p s)hl[16 x 16 tokens] * codes, the scale of each (token, group) in the A operand
// Warps: for scores, 8-token tiles of the page; for values, D/4 channels each (both for the whole GQA group).
#pragma once

#include "cuda/decode_kernel.cuh"

namespace kvq::cuda::detail {

// The operands each codec gives the kernel, from its block in shared memory:
//   key_pair(blk, T, t, c):        channels c, c + 1 of token t as an exact operand pair (codes or stored values)
//   key_scale(blk, T, gs, t, g):   the factor of token t's group g of gs channels (gs: CodecArgs::group, or D)
//   value_pair(blk, T, t, c):      tokens t, t + 1 of channel c
//   value_scale(blk, T, gs, t, g): likewise for values.
template <int kBits>
struct IntMma {
  static constexpr bool kBf16 = false;
  static constexpr bool kSplitB = false;
  static constexpr int kLevels = 0;
  static constexpr int E = 32 / kBits;  // codes per 32-bit lane of the block layout
  __device__ static int element(uint32_t w, int j) {
    return static_cast<int>(w << (32 - kBits * (j + 1))) >> (32 - kBits);
  }
  /// Codes j and j + 1 of a lane as an fp16 pair (exact).
  __device__ static uint32_t pair(uint32_t w, int j) {
    const __half2 h = __halves2half2(__int2half_rn(element(w, j)), __int2half_rn(element(w, j + 1)));
    return *reinterpret_cast<const uint32_t*>(&h);
  }
  template <int D>
  __device__ static float scale(const uint8_t* blk, int T, int group, int t, int g) {
    return f16_at(blk + T * D * kBits / 8 + 2 * ((t / 16 * (D / group) + g) * 16 + t % 16));
  }
  /// Keys, tokens in lanes: the 32-bit lane of token t holding channel c.
  template <int D>
  __device__ static uint32_t key_pair(const uint8_t* blk, int, int t, int c) {
    return pair(*reinterpret_cast<const uint32_t*>(blk + 64 * (t / 16 * (D / E) + c / E) + 4 * (t % 16)), c % E);
  }
  /// Values, channels in lanes: the 32-bit lane of channel c holding token t.
  template <int D>
  __device__ static uint32_t value_pair(const uint8_t* blk, int, int t, int c) {
    return pair(*reinterpret_cast<const uint32_t*>(blk + 64 * (t / E * (D / 16) + c / 16) + 4 * (c % 16)), t % E);
  }
  template <int D>
  __device__ static float key_scale(const uint8_t* blk, int T, int group, int t, int g) {
    return scale<D>(blk, T, group, t, g);
  }
  template <int D>
  __device__ static float value_scale(const uint8_t* blk, int T, int group, int t, int g) {
    return scale<D>(blk, T, group, t, g);
  }
};

/// f16 / bf16 blocks, [T x D] token-major, staged swizzled: the stored values are the operands (exact), no scales.
template <bool kIsBf16>
struct FloatMma {
  static constexpr bool kBf16 = kIsBf16;
  static constexpr bool kSplitB = false;
  static constexpr int kLevels = 0;
  /// Byte of (token t, channel c) in a block staged with swizzle_chunks = D / 8 (stage_page).
  template <int D>
  __device__ static int at(int t, int c) {
    return 2 * t * D + 16 * ((c / 8) ^ (t % 8)) + 2 * (c % 8);
  }
  template <int D>
  __device__ static uint32_t key_pair(const uint8_t* blk, int, int t, int c) {
    return *reinterpret_cast<const uint32_t*>(blk + at<D>(t, c));
  }
  template <int D>
  __device__ static uint32_t value_pair(const uint8_t* blk, int, int t, int c) {
    const uint32_t lo = *reinterpret_cast<const uint16_t*>(blk + at<D>(t, c));
    const uint32_t hi = *reinterpret_cast<const uint16_t*>(blk + at<D>(t + 1, c));
    return lo | hi << 16;
  }
  template <int D>
  __device__ static float key_scale(const uint8_t*, int, int, int, int) {
    return 1.0f;
  }
  template <int D>
  __device__ static float value_scale(const uint8_t*, int, int, int, int) {
    return 1.0f;
  }
};

/// turbo_mse:b blocks: token-major b-bit level indices (LSB first), fp16 norms. The levels are not exact in fp16, so
/// an index gives two B operands, its level's fp16 hi and lo parts (`levels`: 2^b hi, then 2^b lo, in shared
/// memory), and the kernel runs both products (kSplitB); the token's norm is its scale (one group of D channels).
template <int kBits>
struct TurboMseMma {
  static constexpr bool kBf16 = false;
  static constexpr bool kSplitB = true;
  static constexpr int kLevels = 1 << kBits;
  /// Index i of a token's row: its bits lie in the 16 from the byte holding its first bit.
  __device__ static int index(const uint8_t* row, int i) {
    const int bit = i * kBits;
    const uint32_t two = static_cast<uint32_t>(row[bit / 8]) | static_cast<uint32_t>(row[bit / 8 + 1]) << 8;
    return static_cast<int>(two >> (bit % 8)) & (kLevels - 1);
  }
  __device__ static void operands(const __half* levels, int j0, int j1, uint32_t& hi, uint32_t& lo) {
    const __half2 h = __halves2half2(levels[j0], levels[j1]);
    const __half2 l = __halves2half2(levels[kLevels + j0], levels[kLevels + j1]);
    hi = *reinterpret_cast<const uint32_t*>(&h);
    lo = *reinterpret_cast<const uint32_t*>(&l);
  }
  template <int D>
  __device__ static void key_pairs(const uint8_t* blk, int, int t, int c, const __half* levels, uint32_t& hi,
                                   uint32_t& lo) {
    const uint8_t* row = blk + t * (D * kBits / 8);
    operands(levels, index(row, c), index(row, c + 1), hi, lo);
  }
  template <int D>
  __device__ static void value_pairs(const uint8_t* blk, int, int t, int c, const __half* levels, uint32_t& hi,
                                     uint32_t& lo) {
    operands(levels, index(blk + t * (D * kBits / 8), c), index(blk + (t + 1) * (D * kBits / 8), c), hi, lo);
  }
  template <int D>
  __device__ static float norm(const uint8_t* blk, int T, int t) {
    return f16_at(blk + (T * (D * kBits / 8) + 15) / 16 * 16 + 2 * t);
  }
  template <int D>
  __device__ static float key_scale(const uint8_t* blk, int T, int, int t, int) {
    return norm<D>(blk, T, t);
  }
  template <int D>
  __device__ static float value_scale(const uint8_t* blk, int T, int, int t, int) {
    return norm<D>(blk, T, t);
  }
};

template <bool kBf16>
__device__ __forceinline__ void mma_16816(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  if constexpr (kBf16)
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  else
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, {%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/// (x0, x1) as operand pairs hi = {hi(x0), hi(x1)} (x0 in the low 16 bits) and lo = {x0 - hi(x0), x1 - hi(x1)},
/// in fp16 or bf16.
template <bool kBf16>
__device__ __forceinline__ void split_pair(float x0, float x1, uint32_t& hi, uint32_t& lo) {
  if constexpr (kBf16) {
    const __nv_bfloat16 h0 = __float2bfloat16_rn(x0), h1 = __float2bfloat16_rn(x1);
    const __nv_bfloat162 h = __halves2bfloat162(h0, h1);
    const __nv_bfloat162 l = __halves2bfloat162(__float2bfloat16_rn(x0 - __bfloat162float(h0)),
                                                __float2bfloat16_rn(x1 - __bfloat162float(h1)));
    hi = *reinterpret_cast<const uint32_t*>(&h);
    lo = *reinterpret_cast<const uint32_t*>(&l);
  } else {
    const __half h0 = __float2half_rn(x0), h1 = __float2half_rn(x1);
    const __half2 h = __halves2half2(h0, h1);
    const __half2 l = __halves2half2(__float2half_rn(x0 - __half2float(h0)), __float2half_rn(x1 - __half2float(h1)));
    hi = *reinterpret_cast<const uint32_t*>(&h);
    lo = *reinterpret_cast<const uint32_t*>(&l);
  }
}

template <class C, int D, int G>
__global__ void __launch_bounds__(kThreads, D == 256 ? 2 : 4) decode_split_mma_kernel(const SplitArgs a) {
  static_assert(G <= 8 && (D == 64 || D == 128 || D == 256), "GQA groups up to 8, head dimensions 64/128/256");
  constexpr int kSteps = D / 16;           // channel steps of the score product
  constexpr int kWarps = kThreads / 32;
  constexpr int kTiles = D / 8 / kWarps;   // 8-channel tiles of each warp in the value product

  extern __shared__ __align__(16) uint8_t smem[];
  const int stage_bytes = a.key_bytes + a.value_bytes;
  float* scores = reinterpret_cast<float*>(smem + static_cast<size_t>(stage_bytes) * a.stages * a.tile_pages);
  float* m_run = scores + G * a.tile_pages * a.T;  // scores: [G][tile_pages T]
  float* l_run = m_run + G;
  float* alpha = l_run + G;

  const int split = blockIdx.x, h = blockIdx.y, s = blockIdx.z;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const int gid = lane >> 2, tig = lane & 3;  // the mma fragments' row / column owners
  const bool real = gid < G;                  // rows gid and gid + 8 are query head gid (hi, lo)
  const SeqPages sp = a.seqs[s];
  const int p0 = split * a.pages_per_split;
  const int p1 = min(sp.n_pages, p0 + a.pages_per_split);
  const int kgroup = a.key.group > 0 ? a.key.group : D, vgroup = a.value.group > 0 ? a.value.group : D;

  if (tid < G) {
    m_run[tid] = -INFINITY;
    l_run[tid] = 0;
  }
  __shared__ __half key_levels[2 * kMaxLevels], value_levels[2 * kMaxLevels];  // hi, then lo
  if constexpr (C::kLevels > 0) {
    if (tid < C::kLevels) {
      const __half kh = __float2half_rn(a.key.levels[tid]), vh = __float2half_rn(a.value.levels[tid]);
      key_levels[tid] = kh;
      key_levels[C::kLevels + tid] = __float2half_rn(a.key.levels[tid] - __half2float(kh));
      value_levels[tid] = vh;
      value_levels[C::kLevels + tid] = __float2half_rn(a.value.levels[tid] - __half2float(vh));
    }
  }

  // A operand of the score product: query head gid, channels 16 ks + 2 tig (+1) and + 8, hi and lo rows.
  uint32_t qa[kSteps][4];
  {
    const float* q = a.q_space + (static_cast<size_t>(s) * a.n_q_heads + h * G + (real ? gid : 0)) * D;
#pragma unroll
    for (int ks = 0; ks < kSteps; ++ks) {
      const int c = 16 * ks + 2 * tig;
      const float f = real ? a.scale_log2 : 0.0f;
      split_pair<C::kBf16>(q[c] * f, q[c + 1] * f, qa[ks][0], qa[ks][1]);
      split_pair<C::kBf16>(q[c + 8] * f, q[c + 9] * f, qa[ks][2], qa[ks][3]);
    }
  }
  float o[kTiles][4];
#pragma unroll
  for (int j = 0; j < kTiles; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0;

  // Tiles of P pages: staged together (one commit group), scored and summed as one run of P T tokens.
  const int P = a.tile_pages, span = P * a.T;
  const int n_tiles = p1 > p0 ? (p1 - p0 + P - 1) / P : 0;
  auto issue = [&](int tile, int stage) {
    for (int i = 0; i < P && p0 + tile * P + i < p1; ++i)
      stage_page(a, sp.pages[p0 + tile * P + i], h, smem + static_cast<size_t>(stage * P + i) * stage_bytes);
    cp_async_commit();
  };
  if (n_tiles > 0) issue(0, 0);
  for (int tile = 0; tile < n_tiles; ++tile) {
    const int stage = a.stages == 2 ? tile & 1 : 0;
    if (a.stages == 2 && tile + 1 < n_tiles) {
      issue(tile + 1, stage ^ 1);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const uint8_t* base = smem + static_cast<size_t>(stage) * P * stage_bytes;
    const int n = min(P, p1 - p0 - tile * P) * a.T;  // tokens of this tile

    // Scores: each warp takes 8-token tiles; per channel group an exact code product, then the token's scale.
    for (int q8 = warp; q8 < n / 8; q8 += kWarps) {
      const uint8_t* kblk = base + static_cast<size_t>(8 * q8 / a.T) * stage_bytes;
      const int tb = 8 * q8 % a.T + gid;      // the B operand's token (in its page)
      const int t0 = 8 * q8 % a.T + 2 * tig;  // the accumulator's tokens t0, t0 + 1
      float acc[4] = {0, 0, 0, 0}, part[4] = {0, 0, 0, 0};
#pragma unroll
      for (int ks = 0; ks < kSteps; ++ks) {
        const int c = 16 * ks + 2 * tig;
        if constexpr (C::kSplitB) {
          uint32_t h0, l0, h1, l1;
          C::template key_pairs<D>(kblk, a.T, tb, c, key_levels, h0, l0);
          C::template key_pairs<D>(kblk, a.T, tb, c + 8, key_levels, h1, l1);
          mma_16816<C::kBf16>(part, qa[ks], h0, h1);
          mma_16816<C::kBf16>(part, qa[ks], l0, l1);
        } else {
          mma_16816<C::kBf16>(part, qa[ks], C::template key_pair<D>(kblk, a.T, tb, c),
                              C::template key_pair<D>(kblk, a.T, tb, c + 8));
        }
        if ((16 * ks + 16) % kgroup == 0) {  // the group of channels ends here
          const int g = 16 * ks / kgroup;
          const float s0 = C::template key_scale<D>(kblk, a.T, kgroup, t0, g);
          const float s1 = C::template key_scale<D>(kblk, a.T, kgroup, t0 + 1, g);
          acc[0] = fmaf(s0, part[0], acc[0]);
          acc[1] = fmaf(s1, part[1], acc[1]);
          acc[2] = fmaf(s0, part[2], acc[2]);
          acc[3] = fmaf(s1, part[3], acc[3]);
          part[0] = part[1] = part[2] = part[3] = 0;
        }
      }
      if (real) {
        scores[gid * span + 8 * q8 + 2 * tig] = acc[0] + acc[2];
        scores[gid * span + 8 * q8 + 2 * tig + 1] = acc[1] + acc[3];
      }
    }
    __syncthreads();
    softmax_page<G>(scores, span, n, m_run, l_run, alpha);
    __syncthreads();

    // Values: this warp's D/4 channels; A = weights times the (token, group) scale, split hi/lo.
    const float r = real ? alpha[gid] : 0.0f;
#pragma unroll
    for (int j = 0; j < kTiles; ++j)
#pragma unroll
      for (int i = 0; i < 4; ++i) o[j][i] *= r;
    for (int kt = 0; kt < n / 16; ++kt) {
      const uint8_t* vblk = base + static_cast<size_t>(16 * kt / a.T) * stage_bytes + a.key_bytes;
      const int t = 16 * kt % a.T + 2 * tig;  // tokens t, t + 1, t + 8, t + 9 of the page
      float w[4] = {0, 0, 0, 0};
      if (real) {
        const float* ps = scores + gid * span + 16 * kt + 2 * tig;
        w[0] = ps[0];
        w[1] = ps[1];
        w[2] = ps[8];
        w[3] = ps[9];
      }
      uint32_t pa[4];
      int built = -1;
#pragma unroll
      for (int j = 0; j < kTiles; ++j) {
        const int cb = 8 * (warp * kTiles + j), g = cb / vgroup;
        if (g != built) {
          split_pair<C::kBf16>(w[0] * C::template value_scale<D>(vblk, a.T, vgroup, t, g),
                               w[1] * C::template value_scale<D>(vblk, a.T, vgroup, t + 1, g), pa[0], pa[1]);
          split_pair<C::kBf16>(w[2] * C::template value_scale<D>(vblk, a.T, vgroup, t + 8, g),
                               w[3] * C::template value_scale<D>(vblk, a.T, vgroup, t + 9, g), pa[2], pa[3]);
          built = g;
        }
        const int c = cb + gid;  // the B operand's channel
        if constexpr (C::kSplitB) {
          uint32_t h0, l0, h1, l1;
          C::template value_pairs<D>(vblk, a.T, t, c, value_levels, h0, l0);
          C::template value_pairs<D>(vblk, a.T, t + 8, c, value_levels, h1, l1);
          mma_16816<C::kBf16>(o[j], pa, h0, h1);
          mma_16816<C::kBf16>(o[j], pa, l0, l1);
        } else {
          mma_16816<C::kBf16>(o[j], pa, C::template value_pair<D>(vblk, a.T, t, c),
                              C::template value_pair<D>(vblk, a.T, t + 8, c));
        }
      }
    }
    __syncthreads();  // the stage and the scores are rewritten next
    if (a.stages == 1 && tile + 1 < n_tiles) issue(tile + 1, 0);
  }

  if (real) {
    const size_t row = (static_cast<size_t>(s) * a.n_q_heads + h * G + gid) * a.n_splits + split;
#pragma unroll
    for (int j = 0; j < kTiles; ++j) {
      const int c = 8 * (warp * kTiles + j) + 2 * tig;
      a.partial_o[row * D + c] = o[j][0] + o[j][2];
      a.partial_o[row * D + c + 1] = o[j][1] + o[j][3];
    }
  }
  __syncthreads();
  if (tid < G) {
    const size_t row = (static_cast<size_t>(s) * a.n_q_heads + h * G + tid) * a.n_splits + split;
    a.partial_ml[2 * row] = m_run[tid];
    a.partial_ml[2 * row + 1] = l_run[tid];
  }
}

template <class C, int D, int G>
void launch_mma_one(const SplitArgs& args, dim3 grid, size_t smem_bytes, cudaStream_t stream) {
  auto kernel = decode_split_mma_kernel<C, D, G>;
  KVQ_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      static_cast<int>(smem_bytes)));
  kernel<<<grid, kThreads, smem_bytes, stream>>>(args);
  KVQ_CUDA_CHECK(cudaGetLastError());
}

template <class C, int D>
bool launch_mma_d(const SplitArgs& args, int g, dim3 grid, size_t smem_bytes, cudaStream_t stream) {
  switch (g) {
    case 1: launch_mma_one<C, D, 1>(args, grid, smem_bytes, stream); return true;
    case 2: launch_mma_one<C, D, 2>(args, grid, smem_bytes, stream); return true;
    case 4: launch_mma_one<C, D, 4>(args, grid, smem_bytes, stream); return true;
    case 8: launch_mma_one<C, D, 8>(args, grid, smem_bytes, stream); return true;
    default: return false;
  }
}

/// The launcher of a pair on the tensor cores (same signature as launch_split).
template <class C>
bool launch_mma(const SplitArgs& args, int d, int g, dim3 grid, size_t smem_bytes, cudaStream_t stream) {
  switch (d) {
    case 64: return launch_mma_d<C, 64>(args, g, grid, smem_bytes, stream);
    case 128: return launch_mma_d<C, 128>(args, g, grid, smem_bytes, stream);
    case 256: return launch_mma_d<C, 256>(args, g, grid, smem_bytes, stream);
    default: return false;
  }
}

}  // namespace kvq::cuda::detail

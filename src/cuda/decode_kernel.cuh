// The split-K decode attention kernel family (flash-decoding): one thread block per (split, kv head, sequence)
// scores the whole GQA group of G query heads against a slice of the sequence's pages, with an online softmax in
// fp32, and writes a partial state (m, l, o) in the value codec's space; decode_attention.cu merges the splits.
//
// Per page: the key and value blocks of the head are copied to shared memory with 16-byte cp.async (coalesced:
// a block is one contiguous byte range), double-buffered so that the next page streams in during the arithmetic;
// scores: D/8 lanes per token, each decoding 8 channels of the key in registers against the G queries held in
// registers, a shuffle reduction per query (tokens-in-lanes int8/int4 keys: two lanes per token, queries in shared
// memory, one shuffle); softmax: one warp per query head; values: each thread owns 2 channels
// of a contiguous run of tokens, decodes 8 tokens at a time and accumulates G weighted sums in registers.
// The codec pair and D, G are compile-time (codec_traits.cuh); T, group sizes and levels are run-time arguments.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/codec_traits.cuh"
#include "cuda/cuda_check.cuh"

namespace kvq::cuda::detail {

constexpr int kThreads = 128;
constexpr int kMaxLevels = 16;

/// One sequence of a batch: its device block table.
struct SeqPages {
  const uint32_t* pages;
  int n_pages;
};

struct SplitArgs {
  const uint8_t* pool;
  size_t page_bytes;
  size_t key_offset, key_stride;      // key block of head h at key_offset + h * key_stride
  size_t value_offset, value_stride;  // value block likewise
  int key_bytes, value_bytes;         // bytes copied per block (block_bytes rounded up to 16)
  int T, n_q_heads, n_splits, pages_per_split, stages;
  const SeqPages* seqs;
  const float* q_space;  // [seq][q head][D], already in the key codec's space (divided by sigma)
  float scale_log2;      // softmax scale * log2(e): scores are kept in base 2
  float* partial_o;      // [seq][q head][split][D]
  float* partial_ml;     // [seq][q head][split][2]
  CodecArgs key, value;
};

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(s), "l"(gmem));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

template <class K, class V, int D, int G>
__global__ void __launch_bounds__(kThreads, G >= 8 ? 1 : 4) decode_split_kernel(const SplitArgs a) {
  static_assert(D == 64 || D == 128 || D == 256, "head dimensions 64, 128, 256");
  constexpr int kLanesPerToken = D / 8 < 32 ? D / 8 : 32;  // each lane decodes 8 key channels
  constexpr int kTokensPerWarp = 32 / kLanesPerToken;
  constexpr int kWarps = kThreads / 32;
  constexpr int kGroups = 2 * kThreads / D;  // token groups of the value pass (each thread: 2 channels)

  extern __shared__ __align__(16) uint8_t smem[];
  const int stage_bytes = a.key_bytes + a.value_bytes;
  float* scores = reinterpret_cast<float*>(smem + static_cast<size_t>(stage_bytes) * a.stages);  // [G][T]
  float* reduce = scores + (G * a.T + 3) / 4 * 4;  // [kGroups][G][D], 16-byte aligned; the queries until the end
  float* m_run = reduce + kGroups * G * D;
  float* l_run = m_run + G;
  float* alpha = l_run + G;
  float* key_levels = alpha + G;
  float* value_levels = key_levels + kMaxLevels;

  const int split = blockIdx.x, h = blockIdx.y, s = blockIdx.z;
  const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
  const SeqPages sp = a.seqs[s];
  const int p0 = split * a.pages_per_split;
  const int p1 = min(sp.n_pages, p0 + a.pages_per_split);

  if (tid < G) {
    m_run[tid] = -INFINITY;
    l_run[tid] = 0;
  }
  if (tid < K::kLevels) key_levels[tid] = a.key.levels[tid];
  if (tid < V::kLevels) value_levels[tid] = a.value.levels[tid];

  // The queries of the group, this lane's 8 channels, in base-2 score units.
  // Tokens-in-lanes keys (K::kTokenLanes) read them from shared memory instead, times K::q_factor.
  const int sub = lane % kLanesPerToken, c0 = 8 * sub;
  float q[G][K::kTokenLanes ? 1 : 8];
  if constexpr (K::kTokenLanes) {
    for (int i = tid; i < G * D; i += kThreads)
      reduce[i] = a.q_space[(static_cast<size_t>(s) * a.n_q_heads + h * G + i / D) * D + i % D] * a.scale_log2 *
                  K::q_factor(i % D);
  } else {
#pragma unroll
    for (int g = 0; g < G; ++g)
#pragma unroll
      for (int j = 0; j < 8; ++j)
        q[g][j] = a.q_space[(static_cast<size_t>(s) * a.n_q_heads + h * G + g) * D + c0 + j] * a.scale_log2;
  }

  const int vc = 2 * (tid % (D / 2)), vgroup = tid / (D / 2);
  const int run = a.T / kGroups;  // tokens of this thread's value run
  float acc[G][2];
#pragma unroll
  for (int g = 0; g < G; ++g) acc[g][0] = acc[g][1] = 0;

  auto issue = [&](int p, int stage) {
    const uint8_t* page = a.pool + static_cast<size_t>(sp.pages[p]) * a.page_bytes;
    const uint8_t* kb = page + a.key_offset + h * a.key_stride;
    const uint8_t* vb = page + a.value_offset + h * a.value_stride;
    uint8_t* dst = smem + static_cast<size_t>(stage) * stage_bytes;
    for (int i = 16 * tid; i < a.key_bytes; i += 16 * kThreads) cp_async16(dst + i, kb + i);
    for (int i = 16 * tid; i < a.value_bytes; i += 16 * kThreads) cp_async16(dst + a.key_bytes + i, vb + i);
    cp_async_commit();
  };

  if (p0 < p1) issue(p0, 0);
  for (int p = p0; p < p1; ++p) {
    const int stage = a.stages == 2 ? (p - p0) & 1 : 0;
    if (a.stages == 2 && p + 1 < p1) {
      issue(p + 1, stage ^ 1);
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    const uint8_t* kblk = smem + static_cast<size_t>(stage) * stage_bytes;
    const uint8_t* vblk = kblk + a.key_bytes;

    // Scores of every token of the page for the G queries.
    if constexpr (K::kTokenLanes) {
      // 16 tokens per warp, two lanes per token, over the key tiles' 16-token rows (zero padding past T), so that
      // whole warps take part in the shuffle.
      for (int t = warp * 16 + (lane & 15); t < (a.T + 15) / 16 * 16; t += kWarps * 16) {
        float part[G];
        K::template score_half<D, G>(kblk, t, lane >> 4, reduce, part, a.key);
#pragma unroll
        for (int g = 0; g < G; ++g) {
          part[g] += __shfl_xor_sync(0xffffffffu, part[g], 16);
          if (lane < 16 && t < a.T) scores[g * a.T + t] = part[g];
        }
      }
    } else {
      for (int t = warp * kTokensPerWarp + lane / kLanesPerToken; t < a.T; t += kWarps * kTokensPerWarp) {
        float k[8];
        K::template key_slice<D>(kblk, t, c0, k, a.key, key_levels);
#pragma unroll
        for (int g = 0; g < G; ++g) {
          float part = 0;
#pragma unroll
          for (int j = 0; j < 8; ++j) part = fmaf(q[g][j], k[j], part);
#pragma unroll
          for (int off = kLanesPerToken / 2; off > 0; off /= 2) part += __shfl_xor_sync(0xffffffffu, part, off);
          if (sub == 0) scores[g * a.T + t] = part;
        }
      }
    }
    __syncthreads();

    // Online softmax: the page's maximum, weights exp2(s - m), the running sum and the rescale factor.
    for (int g = warp; g < G; g += kWarps) {
      float mx = -INFINITY;
      for (int t = lane; t < a.T; t += 32) mx = fmaxf(mx, scores[g * a.T + t]);
#pragma unroll
      for (int off = 16; off > 0; off /= 2) mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, off));
      const float m_old = m_run[g], m_new = fmaxf(m_old, mx);
      float sum = 0;
      for (int t = lane; t < a.T; t += 32) {
        const float e = exp2f(scores[g * a.T + t] - m_new);
        scores[g * a.T + t] = e;
        sum += e;
      }
#pragma unroll
      for (int off = 16; off > 0; off /= 2) sum += __shfl_xor_sync(0xffffffffu, sum, off);
      __syncwarp();
      if (lane == 0) {
        const float r = exp2f(m_old - m_new);  // 0 for the first page (m_old = -inf)
        alpha[g] = r;
        l_run[g] = l_run[g] * r + sum;
        m_run[g] = m_new;
      }
    }
    __syncthreads();

    // Values: acc = alpha acc + sum_t p_t v_t over this thread's run of tokens and 2 channels.
#pragma unroll
    for (int g = 0; g < G; ++g) {
      acc[g][0] *= alpha[g];
      acc[g][1] *= alpha[g];
    }
    for (int t0 = vgroup * run; t0 < (vgroup + 1) * run; t0 += 8) {
      float v[8][2];
      V::template value_chunk<D>(vblk, t0, vc, v, a.value, value_levels);
#pragma unroll
      for (int g = 0; g < G; ++g) {
        const float4 w0 = *reinterpret_cast<const float4*>(scores + g * a.T + t0);  // T, t0: multiples of 8
        const float4 w1 = *reinterpret_cast<const float4*>(scores + g * a.T + t0 + 4);
        const float w[8] = {w0.x, w0.y, w0.z, w0.w, w1.x, w1.y, w1.z, w1.w};
#pragma unroll
        for (int j = 0; j < 8; ++j) {
          acc[g][0] = fmaf(w[j], v[j][0], acc[g][0]);
          acc[g][1] = fmaf(w[j], v[j][1], acc[g][1]);
        }
      }
    }
    __syncthreads();  // the stage and the scores are rewritten next
    if (a.stages == 1 && p + 1 < p1) issue(p + 1, 0);
  }

  // Sum the token groups' accumulators and write the split's state (the loop's last barrier ended the reads of the
  // queries that share `reduce`, when the split had pages).
  if (p0 >= p1) __syncthreads();
#pragma unroll
  for (int g = 0; g < G; ++g) {
    reduce[(vgroup * G + g) * D + vc] = acc[g][0];
    reduce[(vgroup * G + g) * D + vc + 1] = acc[g][1];
  }
  __syncthreads();
  for (int i = tid; i < G * D; i += kThreads) {
    float o = 0;
#pragma unroll
    for (int r = 0; r < kGroups; ++r) o += reduce[r * G * D + i];
    const int g = i / D, c = i % D;
    const size_t row = (static_cast<size_t>(s) * a.n_q_heads + h * G + g) * a.n_splits + split;
    a.partial_o[row * D + c] = o;
  }
  if (tid < G) {
    const size_t row = (static_cast<size_t>(s) * a.n_q_heads + h * G + tid) * a.n_splits + split;
    a.partial_ml[2 * row] = m_run[tid];
    a.partial_ml[2 * row + 1] = l_run[tid];
  }
}

/// Launches the split kernel of the pair (K, V) for head dimension d and GQA group g (decode_pairs.cu instantiates
/// each pair); returns false when (d, g) has no instantiation.
template <class K, class V>
bool launch_split(const SplitArgs& args, int d, int g, dim3 grid, size_t smem_bytes, cudaStream_t stream);

template <class K, class V, int D, int G>
void launch_one(const SplitArgs& args, dim3 grid, size_t smem_bytes, cudaStream_t stream) {
  auto kernel = decode_split_kernel<K, V, D, G>;
  KVQ_CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                      static_cast<int>(smem_bytes)));
  kernel<<<grid, kThreads, smem_bytes, stream>>>(args);
  KVQ_CUDA_CHECK(cudaGetLastError());
}

template <class K, class V, int D>
bool launch_d(const SplitArgs& args, int g, dim3 grid, size_t smem_bytes, cudaStream_t stream) {
  switch (g) {
    case 1: launch_one<K, V, D, 1>(args, grid, smem_bytes, stream); return true;
    case 2: launch_one<K, V, D, 2>(args, grid, smem_bytes, stream); return true;
    case 4: launch_one<K, V, D, 4>(args, grid, smem_bytes, stream); return true;
    case 8: launch_one<K, V, D, 8>(args, grid, smem_bytes, stream); return true;
    default: return false;
  }
}

template <class K, class V>
bool launch_split(const SplitArgs& args, int d, int g, dim3 grid, size_t smem_bytes, cudaStream_t stream) {
  switch (d) {
    case 64: return launch_d<K, V, 64>(args, g, grid, smem_bytes, stream);
    case 128: return launch_d<K, V, 128>(args, g, grid, smem_bytes, stream);
    case 256: return launch_d<K, V, 256>(args, g, grid, smem_bytes, stream);
    default: return false;
  }
}

}  // namespace kvq::cuda::detail

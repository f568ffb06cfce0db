// The split-K decode attention kernel family (flash-decoding) on the tensor cores: each warp owns a range of chunks
// of one (sequence, kv head) and keeps its online softmax state and output in registers; decode_attention.cu merges
// the warps' partial states.
//
// Per chunk of C tokens (codec_traits.cuh has the fragment maps):
//   - the codes arrive kStages - 1 chunks ahead: every lane streams its own 16-byte pieces of the key and value
//     codes into its own shared-memory slots with cp.async (no barrier: a lane reads only what it copied) and the
//     warp copies the chunk's scales / minima / norms once into a shared area (one __syncwarp); f16/bf16 keys or
//     values (kBulk) instead come by the copy engine (8 copies a chunk, one a lane, placed by float_stage.cuh),
//     completing on the stage's mbarrier;
//   - scores S = Q K^T: the GQA group's queries (rows n < G of the A operand, fp32 split hi (row n) + lo (row n + 8),
//     built once per block into shared memory) times the keys decoded in registers to exact fp16 (mma.m16n8k16,
//     fp32 accumulation), each scale group's tiles scaled in fp32;
//   - online softmax in fp32 (base 2) on the C fragments, the 4 lanes of a row exchanging the chunk maximum;
//   - O += P V: the weights (times 2^12, so that small ones keep fp16's precision; split hi + lo) straight from the
//     score fragments into the A operand, the values decoded in registers.
// The codec pair and d are compile-time; the GQA group G <= 8 (rows), T and the codecs' group sizes are run-time.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "cuda/codec_traits.cuh"
#include "cuda/cuda_check.cuh"
#include "cuda/decode_tables.hpp"
#include "cuda/dependent_launch.cuh"
#include "cuda/fragment_ops.cuh"
#include "attention/query_digits.hpp"

namespace kvq::cuda::detail {

struct SplitArgs {
  const uint8_t* pool;
  size_t page_bytes;
  size_t key_offset, key_stride;      // key block of head h at key_offset + h * key_stride
  size_t value_offset, value_stride;  // value block likewise
  int G, n_q_heads, n_splits;         // n_splits: warps (ranges) per (sequence, kv head)
  int chunks_per_warp;
  int page_shift;                     // log2(T / C): chunks per page
  int stage_bytes;                    // per warp and pipeline stage: codes, then parameters (16-byte multiples)
  const SeqPages* seqs;
  const float* q_space;  // [seq][q head][key space], already in the key codec's space (divided by sigma)
  float scale_log2;      // softmax scale * log2(e): scores are kept in base 2
  float* partial_o;      // [seq][q head][split][value space]
  float* partial_ml;     // [seq][q head][split][2]
  CodecArgs key, value;
};

/// The size of the key codec's space at head dimension D: K::space<D>() where it differs from D (sketch rows).
template <class K, int D>
KVQ_HD constexpr int key_space() {
  if constexpr (requires { K::template space<D>(); }) return K::template space<D>();
  else return D;
}

/// The size of the value codec's space at head dimension D: V::space<D>() where it differs from D.
template <class V, int D>
KVQ_HD constexpr int value_space() {
  if constexpr (requires { V::template space<D>(); }) return V::template space<D>();
  else return D;
}

/// The value channels one warp sums: at most 128, and never across the parts of a value space made of parts of
/// V::part<D>() channels with factors of their own.
template <class V, int D>
KVQ_HD constexpr int value_part() {
  int part = value_space<V, D>();
  if constexpr (requires { V::template part<D>(); }) part = V::template part<D>();
  return part < 128 ? part : 128;
}

/// The value weights of the lane's tokens for the warp's part starting at value channel pc: V::weights, or a
/// V::weights taking pc for the value spaces made of parts.
template <class V, int D, int C>
KVQ_HD void value_weights(const uint8_t* const* prm, int lane, int pc, float (&w)[C / 4]) {
  if constexpr (requires { V::template weights<D, C>(prm, lane, pc, w); })
    V::template weights<D, C>(prm, lane, pc, w);
  else
    V::template weights<C>(prm, lane, w);
}

/// The key B fragments of k step ks: from the lane's slots, and from the chunk's parameter ranges for the codecs
/// that keep part of their codes there (a K::bfrags taking prm: codes in a second section of the block).
template <class K, int D, int C>
KVQ_HD void key_bfrags(const uint4* codes, const uint8_t* const* prm, int ks, const CodecArgs& a, int lane,
                       uint32_t (&b)[C / 8][2]) {
  if constexpr (requires { K::template bfrags<D, C>(codes, prm, ks, a, lane, b); })
    K::template bfrags<D, C>(codes, prm, ks, a, lane, b);
  else
    K::template bfrags<D, C>(codes, ks, a, lane, b);
}

/// The integer path's byte B fragments of k32 step ks (K::int_bfrags), from the chunk's parameter ranges too for the
/// codecs that keep part of their codes there (kivi:3's high bits).
template <class K, int D, int C>
KVQ_HD void key_int_bfrags(const uint4* codes, const uint8_t* const* prm, int ks, const CodecArgs& a, int lane,
                           uint32_t (&b)[C / 8][2]) {
  if constexpr (requires { K::template int_bfrags<D, C>(codes, prm, ks, a, lane, b); })
    K::template int_bfrags<D, C>(codes, prm, ks, a, lane, b);
  else
    K::template int_bfrags<D, C>(codes, ks, a, lane, b);
}

/// The fast value path's unscaled codes of value tile j (V::code_bfrags), from the chunk's parameter ranges too for
/// the codecs that keep part of their codes there (kivi:3's high bits: a V::code_bfrags<D, C> taking prm and pc).
template <class V, int D, int C>
KVQ_HD void value_code_bfrags(const uint4* codes, const uint8_t* const* prm, const CodecArgs& a, int lane, int j,
                              int pc, uint32_t (&b)[C / 16][2]) {
  if constexpr (requires { V::template code_bfrags<D, C>(codes, prm, a, lane, j, pc, b); })
    V::template code_bfrags<D, C>(codes, prm, a, lane, j, pc, b);
  else
    V::template code_bfrags<C>(codes, a, lane, j, b);
}

/// The lo fragments of k step ks (the kSplitB codecs: vecinfer keys' codebook remainders).
template <class K, int D, int C>
KVQ_HD void key_bfrags_lo(const uint4* codes, const uint8_t* const* prm, int ks, const CodecArgs& a, int lane,
                          uint32_t (&b)[C / 8][2]) {
  K::template bfrags_lo<D, C>(codes, prm, ks, a, lane, b);
}


/// Whether key traits K have the integer path (int8/int4 and turbo_mse keys: K::kIntScores).
template <class K>
KVQ_HD constexpr bool has_int_scores() {
  if constexpr (requires { K::kIntScores; }) return K::kIntScores;
  else return false;
}

/// Whether key traits K with the integer path build its A operand per block (kivi: K::kIntBlockDigits, digits of
/// the query times the block's scales, K::int_prepare) rather than once per kernel block (int_query_table).
template <class K>
KVQ_HD constexpr bool has_block_digits() {
  if constexpr (requires { K::kIntBlockDigits; }) return K::kIntBlockDigits;
  else return false;
}

/// Whether traits T read part of their codes from the chunk's parameter ranges (kivi:3's high bits: T::kHighPlane).
template <class T>
KVQ_HD constexpr bool has_high_plane() {
  if constexpr (requires { T::kHighPlane; }) return T::kHighPlane;
  else return false;
}

/// Whether value traits V have the fast value path (int4, kivi and turbo_mse values: V::kFastValues;
/// V::fast_values(args) says for which of their groups).
template <class V>
KVQ_HD constexpr bool has_fast_values() {
  if constexpr (requires { V::kFastValues; }) return V::kFastValues;
  else return false;
}

/// The output tiles of the fast value path beyond its DP / 16 value tiles: one for the values whose fast path adds
/// a per-group offset (kivi's minima: V::kFastOffsets), its row g holding that sum for group g of the part.
template <class V>
KVQ_HD constexpr int fast_offset_tiles() {
  if constexpr (requires { V::kFastOffsets; }) return V::kFastOffsets ? 1 : 0;
  else return 0;
}

/// log2 of the factor of the softmax weights: 12 (small weights keep fp16's precision as hi + lo), or the fast value
/// path's V::kFastWeightLog2.
template <class V, bool kFastValues>
KVQ_HD constexpr int weight_log2() {
  if constexpr (kFastValues) return V::kFastWeightLog2;
  else return 12;
}

/// The compile-time shape of one pair's kernel at head dimension D (kInt: the int keys' integer path).
template <class K, class V, int D, bool kInt = false>
struct SplitShape {
  static_assert(D == 64 || D == 128 || D == 256, "head dimensions 64, 128, 256");
  static constexpr int C = K::kChunk > V::kChunk ? K::kChunk : V::kChunk;  // tokens per chunk
  static constexpr int VD = value_space<V, D>();     // the output's size in the value codec's space
  static constexpr int DP = value_part<V, D>();
  static constexpr int kParts = VD / DP;  // warps sharing a range, each summing DP value channels
  static constexpr int KD = key_space<K, D>();  // the queries' size in the key codec's space
  static constexpr int NT = C / 8, KS = KD / 16, VS = C / 16, NJ = DP / 8;
  // The chunk's codes by the copy engine (kBulk: f16/bf16 keys or values), or by lanes; a stage holds the key codes,
  // then the value codes.
  static constexpr bool kBulk = K::kBulk || V::kBulk, kLanes = !K::kBulk || !V::kBulk;
  static constexpr int kKeyPieces = K::template pieces<D, C>();
  static constexpr int kValuePieces = V::template pieces<D, DP, C>();
  static constexpr int kKeyChunkBytes = static_cast<int>(K::template chunk_bytes<D, C>());  // C tokens' codes
  static constexpr int kValueChunkBytes = static_cast<int>(V::template chunk_bytes<D, C>());
  static constexpr int kBulkStageBytes = static_cast<int>(FloatStage<D, C>::kBytes);
  static constexpr int kKeyCodeBytes = K::kBulk ? kBulkStageBytes : 16 * code_slots<K, D, C>();  // per warp, stage
  static constexpr int kCodeBytes = kKeyCodeBytes + (V::kBulk ? kBulkStageBytes : 16 * code_slots<V, D, DP, C>());
  static constexpr int kBulkBytes = (K::kBulk ? kKeyChunkBytes : 0) + (V::kBulk ? kValueChunkBytes : 0);
  static constexpr int kBulkUnits = FloatStage<D, C>::kUnits * ((K::kBulk ? 1 : 0) + (V::kBulk ? 1 : 0));
  // The int4 pair fits 128 registers: 16 warps per SM with 2 stages (4 blocks of 41 KB). The others: 12 warps per
  // SM, 3 stages where a 32-token stage is small. Stages of 10 KB or more (f16/bf16 and int8 at d = 256, kivi:3 /
  // kivi:3 and kivi:4 / kivi:2 there with their high planes and 64-token chunks) take 2-warp blocks with 2 stages:
  // 4 warps would make a block of over 110 KB, one to an SM, and 3 stages two (4 warps), where 2-warp blocks of 2
  // stages fit three (6 warps).
  static constexpr bool kDense = K::kDense && V::kDense;
  static constexpr int kPlaneBytes = (has_high_plane<K>() ? C * KD / 8 : 0) + (has_high_plane<V>() ? C * D / 8 : 0);
  static constexpr bool kCrowded = kCodeBytes + kPlaneBytes >= 10240;
  static constexpr int kStages = C == 32 && kCodeBytes <= 4608 && !kDense ? 3 : 2;
  static_assert(C == 16 || C == 32 || C == 64, "chunks of 16, 32 or 64 tokens");
  static constexpr int kWarps = kCrowded && kParts <= 2 ? 2 : 4;
  static constexpr int kThreads = 32 * kWarps;
  // Registers: 128 (dense), 168, or 255 at d = 256, for values in parts, for grouped (int) keys in 64-token
  // chunks (beside kivi:2 values: 8 score tiles per scale group), and for kivi:3 beside f16/bf16 codes (the bulk
  // copies' state beside the high plane's reads spilled at d = 128: -DKVQ_CUDA_ALL_PAIRS=ON's pairs only).
  static constexpr bool kHeavy = D > 128 || kParts > 1 || (C == 64 && K::kGroups) ||
                                 (kBulk && (has_high_plane<K>() || has_high_plane<V>()));
  static constexpr int kMinBlocks = (kHeavy ? 256 : kDense ? 512 : 384) / kThreads;
  // A lane's pieces from one address (piece_source) but in the dense pair: there, holding the address through the
  // chunk spills the exact kernels at d = 128 (128 registers), so each piece keeps its own offset.
  static constexpr bool kOneAddress = !kDense;
  static constexpr int kTableBytes = KS * 32 * 16;                              // one [KS][32] fragment table
  // Queries (+ their fp32 values; the integer path: its digit table, at most kTableBytes, then S of the 8 rows, or
  // with block digits the rows' x' (int_query_values, kTableBytes) and S in warp 0's A table until the chunk loop:
  // 32 bytes less, which let kivi:2's blocks fit 4 to an SM).
  static constexpr bool kBlockDigits = kInt && has_block_digits<K>();
  static constexpr int kBlockBytes = kTableBytes * (K::kChunkA && !kInt ? 2 : 1) + (kInt && !kBlockDigits ? 32 : 0);
  // Per warp: the query fragments rebuilt per chunk (K::kChunkA), or with block digits per key block ([KD / 32][32]),
  // then the stages' mbarriers.
  static constexpr int kATableBytes = K::kChunkA ? (kBlockDigits ? kTableBytes / 2 : kTableBytes) : 0;
  static constexpr int kWarpBytes = kATableBytes + (kBulk ? 16 * kStages : 0);
  static_assert(!kBlockDigits || kATableBytes >= 32, "warp 0's A table holds the row scales");
  static_assert(kWarps % kParts == 0, "a block holds whole ranges");
  static_assert(K::kRanges <= kTableSlot && V::kRanges <= kTableSlot, "parameter ranges below the table slot");
};

/// The integer path's A fragment idx of its table [KD / 32][kSub][32] (lane idx % 32): for the lane's query row g
/// (rows g >= G zero) at scale S = qscale[g], per k32 step (and, for groups of 16 channels, per group of the step:
/// kSub = 2, the other group's digits zero) the digits D0 (row g) and D1 (row g + 8) of x_c ~ S (256 D0 + D1) at
/// the channels of K::channel32 (query_digits.hpp: the CPU's fast kernels round alike). x: the group's queries, G
/// rows of KD, already times scale_log2 (x_row_c = x[row * KD + c] * x_factor).
template <class K, int D, int kSub>
KVQ_HD uint4 int_query_fragment(const float* x, float x_factor, const float* qscale, int G, int idx) {
  constexpr int KD = key_space<K, D>();
  const int t = idx >> 5, g = (idx & 31) >> 2, i = idx & 3, ks = t / kSub, h = t % kSub;
  uint32_t w[4] = {0, 0, 0, 0};
  if (g < G) {
    const float S = qscale[g];
    for (int r = 0; r < 2; ++r)  // k = 4i + j (words 0, 1), 16 + 4i + j (words 2, 3)
      for (int j = 0; j < 4; ++j) {
        const int c = K::template channel32<D>(ks, 16 * r + 4 * i + j);
        if (kSub == 2 && ((c >> 4) & 1) != h) continue;  // groups of 16: the step's other group
        int32_t digit[2];
        kvq::detail::query_digits<2>(x[g * KD + c] * x_factor, S, digit);
        w[2 * r] |= (static_cast<uint32_t>(digit[0]) & 0xffu) << (8 * j);
        w[2 * r + 1] |= (static_cast<uint32_t>(digit[1]) & 0xffu) << (8 * j);
      }
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

/// The integer path's x' of block digits (has_block_digits), entry idx of [KD / 32][2][32] (lane idx % 32): for the
/// lane's query row g (rows g >= G zero) per k32 step ks and r = 0, 1 the values x_c / qscale[g] (|.| <= 32512) at
/// the channels K::channel32(ks, 16 r + 4i + j), j = 0..3. x as for int_query_fragment.
template <class K, int D>
KVQ_HD float4 int_query_values(const float* x, float x_factor, const float* qscale, int G, int idx) {
  constexpr int KD = key_space<K, D>();
  const int t = idx >> 5, g = (idx & 31) >> 2, i = idx & 3, ks = t >> 1, r = t & 1;
  float v[4] = {0, 0, 0, 0};
  if (g < G)
    for (int j = 0; j < 4; ++j)
      v[j] = x[g * KD + K::template channel32<D>(ks, 16 * r + 4 * i + j)] * x_factor / qscale[g];
  return make_float4(v[0], v[1], v[2], v[3]);
}

/// The integer path's A table and row scales, built once per block (every thread calls it): row n < 8 of the
/// query (x_c = q_c * scale_log2, rows n >= G zero) in 16-bit fixed point over the head, S_n = digit_scale(max |x_c|)
/// into qscale[n], then int_query_fragment for every entry of itab, or with block digits int_query_values for every
/// entry of the x' table (itab as float4: the same bytes).
template <class K, int D, int kSub, int kThreads>
__device__ __forceinline__ void int_query_table(const float* q, float scale_log2, int G, uint4* itab, float* qscale) {
  constexpr int KD = key_space<K, D>();
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  for (int n = warp; n < 8; n += kThreads / 32) {
    float amax = 0;
    if (n < G)
      for (int c = lane; c < KD; c += 32) amax = fmaxf(amax, fabsf(q[n * KD + c] * scale_log2));
    for (int off = 16; off > 0; off /= 2) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, off));
    if (lane == 0) qscale[n] = kvq::detail::digit_scale<2>(amax);
  }
  __syncthreads();
  if constexpr (has_block_digits<K>()) {
    for (int idx = threadIdx.x; idx < KD / 32 * 2 * 32; idx += kThreads)
      reinterpret_cast<float4*>(itab)[idx] = int_query_values<K, D>(q, scale_log2, qscale, G, idx);
  } else {
    for (int idx = threadIdx.x; idx < KD / 32 * kSub * 32; idx += kThreads)
      itab[idx] = int_query_fragment<K, D, kSub>(q, scale_log2, qscale, G, idx);
  }
}

/// Whether the block digits' table is formed by all 32 lanes for rows 0..3 (has_block_digits, G <= 4, the key
/// traits splitting a row's lane words in two: K::int_parts): lanes 16..31 take the second part of lanes 0..15's
/// rows, whose own rows 4..7 stay zero (the kernel zeroes them once), so a page's table costs each lane half the
/// work. With G > 4 every lane forms its own row's table, both parts.
template <class K, int D>
KVQ_HD bool split_block_digits(int G) {
  return K::template int_parts<D>() == 2 && G <= 4;
}

/// The block digits' per-block step (has_block_digits, every lane of the warp): the block's s_max over the warp,
/// K::int_prepare's table into atab (split_block_digits: the lanes' halves of rows 0..3), and the row's <x', m>:
/// each part's fp32 chain, the parts added, then the quad's sum (the same bits split or not). Ends with a
/// __syncwarp: a split table holds entries of other lanes.
template <class K, int D>
__device__ __forceinline__ void block_digits(const uint8_t* const* kprm, const CodecArgs& a, int lane, bool split,
                                             const uint4* xtab, uint4* atab, float& smax, float& bias) {
  // The scales' largest |s_c| as fp16 bits (sign cleared): non-negative fp16 order as their bits, so one integer
  // reduction over the warp.
  const uint32_t sm = K::template scale_max<D>(kprm, a, lane);
  smax = half_to_float(__reduce_max_sync(0xffffffffu, max(sm & 0xFFFFu, sm >> 16)), false);
  const float sigma = smax > 0 ? 1.0f / smax : 0.0f;
  const float4* xt = reinterpret_cast<const float4*>(xtab);
  if (split) {
    __syncwarp();  // every lane has read the previous block's table before other lanes' entries are replaced
    bias = K::template int_prepare<D>(kprm, a, lane & 15, lane >> 4, xt, sigma, atab);
    bias += __shfl_xor_sync(0xffffffffu, bias, 16);
  } else {
    bias = K::template int_prepare<D>(kprm, a, lane, 0, xt, sigma, atab);
    if constexpr (K::template int_parts<D>() == 2)
      bias += K::template int_prepare<D>(kprm, a, lane, 1, xt, sigma, atab);
  }
  bias += __shfl_xor_sync(0xffffffffu, bias, 1);
  bias += __shfl_xor_sync(0xffffffffu, bias, 2);
  __syncwarp();
}

/// Score stage, fp16/bf16 tensor cores: S = Q K^T of the chunk into sc (lane (n, i): row n, tokens (C/4) i + {jj,
/// C/8 + jj}), the keys decoded to exact fp16/bf16, each scale group's tiles scaled in fp32 (GS: log2 of the k steps
/// per group). A: the query fragments [KS][32].
template <class K, int D, int C, int GS>
__device__ __forceinline__ void fp_scores(const uint4* A, const uint4* kcodes, const uint8_t* const* kprm,
                                          const CodecArgs& a, int lane, float (&sc)[C / 8][2]) {
  constexpr int NT = C / 8, KS = key_space<K, D>() / 16, kGroupSteps = 1 << GS;
  float acc[NT][4];
#pragma unroll
  for (int ks = 0; ks < KS; ++ks) {
    const uint4 af = A[32 * ks + lane];
    uint32_t b[NT][2];
    key_bfrags<K, D, C>(kcodes, kprm, ks, a, lane, b);
#pragma unroll
    for (int jj = 0; jj < NT; ++jj) {
      if (ks % kGroupSteps == 0) mma_first<K::kBf16>(acc[jj], af, b[jj][0], b[jj][1]);
      else mma<K::kBf16>(acc[jj], af, b[jj][0], b[jj][1]);
    }
    if constexpr (K::kSplitB) {
      key_bfrags_lo<K, D, C>(kcodes, kprm, ks, a, lane, b);
#pragma unroll
      for (int jj = 0; jj < NT; ++jj) mma<K::kBf16>(acc[jj], af, b[jj][0], b[jj][1]);
    }
    if (ks % kGroupSteps == kGroupSteps - 1) K::template scale_group<D, C>(kprm, a, lane, ks >> GS, acc, sc);
  }
}

/// Score stage, integer tensor cores (the int keys' fast path): per k32 step one mma.m16n8k32 on the query's two
/// digits and the codes as signed bytes (two where groups hold 16 channels: kSub = 2), the digit products joined
/// per group in int32 and scaled by the tokens' fp16 scales in fp32 (K::scale_int_group). The scores come out
/// without the row's factor S_n 2^-kIntFactorLog2 (softmax_update applies it). GS: log2 of the k16 steps per group.
template <class K, int D, int C, int GS>
__device__ __forceinline__ void int_scores(const uint4* itab, const uint4* kcodes, const uint8_t* const* kprm,
                                           const CodecArgs& a, int lane, float (&sc)[C / 8][2]) {
  constexpr int NT = C / 8, KS32 = key_space<K, D>() / 32;
  constexpr int kSub = GS == 0 ? 2 : 1, kGroupSteps = GS == 0 ? 1 : 1 << (GS - 1);  // k32 steps per group
  int acc[NT][4];
#pragma unroll
  for (int ks = 0; ks < KS32; ++ks) {
    uint32_t b[NT][2];
    key_int_bfrags<K, D, C>(kcodes, kprm, ks, a, lane, b);
#pragma unroll
    for (int h = 0; h < kSub; ++h) {
      const uint4 af = itab[32 * (kSub * ks + h) + lane];
#pragma unroll
      for (int jj = 0; jj < NT; ++jj) {
        if (kSub == 2 || ks % kGroupSteps == 0) imma_first(acc[jj], af, b[jj][0], b[jj][1]);
        else imma(acc[jj], af, b[jj][0], b[jj][1]);
      }
      if (kSub == 2)
        K::template scale_int_group<D, C>(kprm, a, lane, 2 * ks + h, acc, sc);
      else if (ks % kGroupSteps == kGroupSteps - 1)
        K::template scale_int_group<D, C>(kprm, a, lane, ks / kGroupSteps, acc, sc);
    }
  }
}

/// Softmax update: the chunk's scores times `factor` (kScaled; the integer path's row scale), the running maximum
/// and sum (base 2; a row's maximum shared by its 4 lanes), o rescaled where the maximum moved, and the weights
/// p (times 2^kWeightLog2: 2^12, so that small ones keep fp16's precision as hi + lo; 1 on the fast value path) of
/// the lane's C / 4 tokens: p[jj], p[C/8 + jj]. o holds rows n, n + 8 of C fragments (query row n), or with
/// kTransposed (accumulate_values_fast) columns 2i, 2i + 1 (query rows 2i, 2i + 1, whose factors come from lanes
/// 8i and 8i + 4).
template <int C, int NJ, bool kScaled, int kWeightLog2, bool kTransposed>
__device__ __forceinline__ void softmax_update(const float (&sc)[C / 8][2], float factor, float& m_run, float& l_run,
                                               float (&o)[NJ][4], float (&p)[C / 4]) {
  constexpr int NT = C / 8;
  float mx = -INFINITY;
#pragma unroll
  for (int jj = 0; jj < NT; ++jj) mx = fmaxf(mx, fmaxf(sc[jj][0], sc[jj][1]));
  mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
  mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
  if constexpr (kScaled) mx *= factor;  // factor > 0: the maximum of the scaled scores
  const float m_new = fmaxf(m_run, mx);
  const float alpha = exp2_fast(m_run - m_new);  // 0 for the first chunk (m_run = -inf)
  m_run = m_new;
  l_run *= alpha;
  if (__any_sync(0xffffffffu, alpha != 1.0f)) {
    float f[2] = {alpha, alpha};
    if constexpr (kTransposed) {
      const int i = threadIdx.x & 3;
      f[0] = __shfl_sync(0xffffffffu, alpha, 8 * i);
      f[1] = __shfl_sync(0xffffffffu, alpha, 8 * i + 4);
    }
#pragma unroll
    for (int j = 0; j < NJ; ++j)
#pragma unroll
      for (int x = 0; x < 4; ++x) o[j][x] *= f[x & 1];
  }
  const float m_off = m_new - kWeightLog2;
#pragma unroll
  for (int jj = 0; jj < NT; ++jj) {
    if constexpr (kScaled) {
      p[jj] = exp2_fast(fmaf(sc[jj][0], factor, -m_off));
      p[NT + jj] = exp2_fast(fmaf(sc[jj][1], factor, -m_off));
    } else {
      p[jj] = exp2_fast(sc[jj][0] - m_off);
      p[NT + jj] = exp2_fast(sc[jj][1] - m_off);
    }
  }
#pragma unroll
  for (int t = 0; t < C / 4; ++t) l_run += p[t];
}

/// Accumulate stage: O += P V over the chunk's value steps, the weights (split hi + lo) straight from p as the A
/// operand, the values decoded in registers (the warp's part starting at value channel pc).
template <class V, int D, int DP, int C>
__device__ __forceinline__ void accumulate_values(const float (&p)[C / 4], const uint4* vcodes,
                                                  const uint8_t* const* vprm, const CodecArgs& a, int lane, int pc,
                                                  float (&o)[DP / 8][4]) {
  constexpr int VS = C / 16, NJ = DP / 8;
  float w[C / 4];
  value_weights<V, D, C>(vprm, lane, pc, w);
  uint4 pa[VS];
#pragma unroll
  for (int vs = 0; vs < VS; ++vs)
    pa[vs] = split_fragment<V::kBf16>(
        p[value_token<V, C>(vs, 0)] * w[value_token<V, C>(vs, 0)],
        p[value_token<V, C>(vs, 1)] * w[value_token<V, C>(vs, 1)],
        p[value_token<V, C>(vs, 2)] * w[value_token<V, C>(vs, 2)],
        p[value_token<V, C>(vs, 3)] * w[value_token<V, C>(vs, 3)]);
#pragma unroll
  for (int j = 0; j < NJ; ++j) {
    uint32_t b[VS][2];
    V::template bfrags<D, DP, C>(vcodes, vprm, a, lane, j, pc, b);
#pragma unroll
    for (int vs = 0; vs < VS; ++vs) mma<V::kBf16>(o[j], pa[vs], b[vs][0], b[vs][1]);
  }
}

/// Accumulate stage, fast (KVQ_ATTENTION=fast, the values with V::kFastValues): O^T += V^T P^T, the operands'
/// roles exchanged so that one mma covers 16 value channels: A holds the unscaled codes of two value tiles (rows n:
/// tile 2m, rows n + 8: tile 2m + 1; V::code_bfrags), B the weights times the values' per-token factors
/// (value_weights) as single fp16 operands, times the scales of each 32-channel block where the values have them
/// (V::kFastBlockScales: V::fast_weights); no lo part: the contract's rounding, docs/METHODS.md. oT[m] holds
/// C[channel][query row]: channels V::channel(2m, n), V::channel(2m + 1, n) of query rows 2i, 2i + 1; with
/// fast_offset_tiles, oT[DP / 16] the per-group offsets' sums (V::offset_afrags times the weights), added to the
/// channels after the last chunk (add_value_offsets).
template <class V, int D, int DP, int C>
__device__ __forceinline__ void accumulate_values_fast(const float (&p)[C / 4], const uint4* vcodes,
                                                       const uint8_t* const* vprm, const CodecArgs& a, int lane,
                                                       int pc, float (&oT)[DP / 16 + fast_offset_tiles<V>()][4]) {
  constexpr int VS = C / 16;
  float w[C / 4];
  value_weights<V, D, C>(vprm, lane, pc, w);
  uint32_t ph[VS][2];
#pragma unroll
  for (int vs = 0; vs < VS; ++vs)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int t0 = value_token<V, C>(vs, 2 * h), t1 = value_token<V, C>(vs, 2 * h + 1);
      ph[vs][h] = float2_to_h2(p[t0] * w[t0], p[t1] * w[t1]);
    }
  if constexpr (fast_offset_tiles<V>() > 0) {
    uint32_t am[VS][2];
    V::template offset_afrags<C>(vprm, a, lane, pc, am);
#pragma unroll
    for (int vs = 0; vs < VS; ++vs)
      mma<false>(oT[DP / 16], make_uint4(am[vs][0], 0u, am[vs][1], 0u), ph[vs][0], ph[vs][1]);
  }
#pragma unroll
  for (int r = 0; r < DP / 32; ++r) {
    uint32_t pw[VS][2];
    if constexpr (V::kFastBlockScales) {
      V::template fast_weights<C>(vprm, a, lane, pc, r, ph, pw);
    } else {
#pragma unroll
      for (int vs = 0; vs < VS; ++vs) pw[vs][0] = ph[vs][0], pw[vs][1] = ph[vs][1];
    }
#pragma unroll
    for (int m = 2 * r; m < 2 * r + 2; ++m) {
      uint32_t b0[VS][2], b1[VS][2];
      value_code_bfrags<V, D, C>(vcodes, vprm, a, lane, 2 * m, pc, b0);
      value_code_bfrags<V, D, C>(vcodes, vprm, a, lane, 2 * m + 1, pc, b1);
#pragma unroll
      for (int vs = 0; vs < VS; ++vs)
        mma<false>(oT[m], make_uint4(b0[vs][0], b1[vs][0], b0[vs][1], b1[vs][1]), pw[vs][0], pw[vs][1]);
    }
  }
}

/// The fast value path's offsets (fast_offset_tiles) onto the value tiles of accumulate_values_fast: each 32-channel
/// block's row of oT[DP / 16] from the lane of its group (lane 4 g + i holds group g's sums of query rows 2i, 2i + 1).
template <class V, int DP>
__device__ __forceinline__ void add_value_offsets(const CodecArgs& a, int lane, int pc, float (&oT)[DP / 16 + 1][4]) {
  const int n = lane >> 2, i = lane & 3;
#pragma unroll
  for (int r = 0; r < DP / 32; ++r) {
    const int from = 4 * V::offset_row(a, pc, V::channel(4 * r, n)) + i;
    const float b0 = __shfl_sync(0xffffffffu, oT[DP / 16][0], from);
    const float b1 = __shfl_sync(0xffffffffu, oT[DP / 16][1], from);
#pragma unroll
    for (int m = 2 * r; m < 2 * r + 2; ++m) {
      oT[m][0] += b0;
      oT[m][1] += b1;
      oT[m][2] += b0;
      oT[m][3] += b1;
    }
  }
}

/// The parameter bytes per chunk of the key and value codecs (their ranges together).
template <class K, class V, int D>
KVQ_HD uint32_t param_bytes(const CodecArgs& key, const CodecArgs& value) {
  using S = SplitShape<K, V, D>;
  uint32_t total = 0, off, bytes;
  for (int r = 0; r < K::kRanges; ++r) {
    K::template range<D, S::C>(key, 0, r, off, bytes);
    total += bytes;
  }
  for (int r = 0; r < V::kRanges; ++r) {
    V::template range<D, S::DP, S::C>(value, 0, r, off, bytes);
    total += bytes;
  }
  return total;
}

/// Hides the scores of the chunk's tokens before `first` (chunk-relative; the chunk a sliding window starts in):
/// lane (n, i) holds tokens (C / 4) i + {jj, C / 8 + jj}.
template <int C>
KVQ_HD void hide_before(int first, int lane, float (&sc)[C / 8][2]) {
  const int t0 = C / 4 * (lane & 3);
KVQ_UNROLL
  for (int jj = 0; jj < C / 8; ++jj) {
    if (t0 + jj < first) sc[jj][0] = -INFINITY;
    if (t0 + C / 8 + jj < first) sc[jj][1] = -INFINITY;
  }
}

/// GS: log2 of the k16 steps per key scale group (int8/int4 keys), log2(D / 16) for the codecs without groups (whose
/// space of more than D channels is scored in groups of D).
/// kInt: the int keys' integer path (KVQ_ATTENTION=fast): scores by int_scores on the query's two 8-bit digits.
/// kFastValues: the fast value path (KVQ_ATTENTION=fast, V::kFastValues): accumulate_values_fast.
/// kWindowStart: the variant run on the one page per sequence that a sliding window starts inside (SeqPages::
/// window_first): it skips the page's chunks wholly before the window and hides the older tokens of the chunk it
/// starts in. Its occupancy does not matter (a page per (sequence, kv head)), so it may take every register; the
/// split kernel itself has none to spare for the mask (docs/perf/h200.md, run 14) and never sees a partial page.
template <class K, class V, int D, int GS, bool kWindowStart = false, bool kInt = false, bool kFastValues = false>
__global__ void __launch_bounds__(SplitShape<K, V, D, kInt>::kThreads,
                                  kWindowStart ? 1 : SplitShape<K, V, D, kInt>::kMinBlocks)
    decode_split_kernel(const SplitArgs a) {
  using S = SplitShape<K, V, D, kInt>;
  constexpr int C = S::C, NT = S::NT, KS = S::KS, NJ = S::NJ, DP = S::DP;
  constexpr int kStages = S::kStages;
  constexpr int kWeightLog2 = weight_log2<V, kFastValues>();  // the weights' factor 2^kWeightLog2
  constexpr int kValueTiles = kFastValues ? DP / 16 : NJ;  // o: C fragments of 16 x 8, then the offsets' tile
  constexpr int kOTiles = kValueTiles + (kFastValues ? fast_offset_tiles<V>() : 0);

  extern __shared__ __align__(16) uint8_t smem[];
  uint4* qtab = reinterpret_cast<uint4*>(smem);
  float4* qf = reinterpret_cast<float4*>(smem + S::kTableBytes);
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  uint8_t* ktable = smem + S::kBlockBytes;  // the codecs' tables (vecinfer's codebooks), key then value
  uint8_t* vtable = ktable + a.key.table_bytes;
  uint8_t* wbase = vtable + a.value.table_bytes + warp * (S::kWarpBytes + kStages * a.stage_bytes);
  uint4* atab = reinterpret_cast<uint4*>(wbase);
  uint64_t* bars = reinterpret_cast<uint64_t*>(wbase + S::kATableBytes);  // 16 bytes a stage
  uint8_t* ring = wbase + S::kWarpBytes;

  // The integer path's row scales S_n (block digits: in warp 0's A table, read before the chunk loop rewrites it).
  float* qscale = reinterpret_cast<float*>(S::kBlockDigits ? vtable + a.value.table_bytes : smem + S::kTableBytes);

  const int h = blockIdx.y, s = blockIdx.z;
  const int range = blockIdx.x * (S::kWarps / S::kParts) + warp / S::kParts;
  const int pc = (warp % S::kParts) * DP;  // this warp's value channels: pc .. pc + DP - 1
  const size_t q_row0 = static_cast<size_t>(s) * a.n_q_heads + static_cast<size_t>(h) * a.G;

  if constexpr (S::kBulk) {
    if (lane == 0) {
      for (int st = 0; st < kStages; ++st) mbar_init(bars + 2 * st);
      mbar_init_fence();
    }
    // Every warp's barriers initialized before any is armed: without this barrier racecheck reported the init
    // and the first arm as a hazard where two warps share a range (d = 256; docs/perf/h200.md, runs 19-20).
    __syncthreads();
  }
  wait_for_prior_kernel();  // launched as a dependent: the queries, tables and pages are read below

  const SeqPages sp = a.seqs[s];
  const int r0 = range * a.chunks_per_warp;
  const int chunk_begin = kWindowStart ? max(r0, sp.window_first / C) : r0;
  const int chunk_end = min(sp.n_pages << a.page_shift, r0 + a.chunks_per_warp);
  const int chunk_mask = (1 << a.page_shift) - 1;

  // Where the chunk's parameters sit in a stage: the key ranges, then the value ranges, after the codes (their
  // sizes do not depend on the chunk).
  uint32_t kpo[3] = {0, 0, 0}, vpo[3] = {0, 0, 0};
  {
    uint32_t at = S::kCodeBytes, off, bytes;
    for (int r = 0; r < K::kRanges; ++r) {
      K::template range<D, C>(a.key, 0, r, off, bytes);
      kpo[r] = at;
      at += bytes;
    }
    for (int r = 0; r < V::kRanges; ++r) {
      V::template range<D, DP, C>(a.value, 0, r, off, bytes);
      vpo[r] = at;
      at += bytes;
    }
  }

  // What every chunk's copies share: the head's blocks in a page, the lane's pieces in a chunk.
  const size_t kblock = a.key_offset + static_cast<size_t>(h) * a.key_stride;
  const size_t vblock = a.value_offset + static_cast<size_t>(h) * a.value_stride;
  int kpiece[S::kKeyPieces > 0 ? S::kKeyPieces : 1], vpiece[S::kValuePieces > 0 ? S::kValuePieces : 1];
#pragma unroll
  for (int k = 0; k < S::kKeyPieces; ++k) kpiece[k] = K::template piece<D, C>(a.key, lane, k);
#pragma unroll
  for (int k = 0; k < S::kValuePieces; ++k) vpiece[k] = V::template piece<D, DP, C>(a.value, lane, k, pc);

  // Block-table entries, 32 pages at a time: lane j holds the id of page base + j.
  int pid_base = -1;
  uint32_t pid = 0;
  auto issue = [&](int chunk, int stage) {
    const int p = chunk >> a.page_shift, cc = chunk & chunk_mask;
    if ((p & ~31) != pid_base) {
      pid_base = p & ~31;
      pid = pid_base + lane < sp.n_pages ? sp.pages[pid_base + lane] : 0u;
    }
    const uint8_t* page = a.pool + static_cast<size_t>(__shfl_sync(0xffffffffu, pid, p & 31)) * a.page_bytes;
    const uint8_t* kb = page + kblock;
    const uint8_t* vb = page + vblock;
    const uint8_t* kc = kb + static_cast<uint32_t>(cc) * S::kKeyChunkBytes;  // unsigned: no sign extension
    const uint8_t* vc = vb + static_cast<uint32_t>(cc) * S::kValueChunkBytes;
    uint8_t* st = ring + stage * a.stage_bytes;
    if constexpr (S::kBulk) {
      // A unit a lane (FloatStage): the key units from lane 0, then the value units; lane 0 arms the barrier (the
      // phase cannot complete before its arrival, whichever copy lands first).
      using F = FloatStage<D, C>;
      if (lane < S::kBulkUnits) {
        fence_proxy_async();  // the stage's earlier reads before the copy engine rewrites it
        if (lane == 0) mbar_expect(bars + 2 * stage, S::kBulkBytes);
        const bool key = K::kBulk && lane < F::kUnits;
        F::copy_unit(key ? st : st + S::kKeyCodeBytes, key ? kc : vc, lane % F::kUnits, bars + 2 * stage);
      }
    }
    // The lanes' pieces (slot lane_slot(k, lane): st moves to the lane's slot 0; where lanes share pieces, a lane
    // copies all of its pieces or none: lane_copies) and the parameter ranges (none for f16/bf16).
    st += 16 * lane;
    if (lane_copies<K, D, C>(lane)) {
#pragma unroll
      for (int k = 0; k < S::kKeyPieces; ++k)
        cp_async16(st + 16 * (lane_slot<K>(k, lane) - lane), piece_source<K, S::kOneAddress>(kc, kpiece, k));
    }
    if (lane_copies<V, D, DP, C>(lane)) {
#pragma unroll
      for (int k = 0; k < S::kValuePieces; ++k)
        cp_async16(st + S::kKeyCodeBytes + 16 * (lane_slot<V>(k, lane) - lane),
                   piece_source<V, S::kOneAddress>(vc, vpiece, k));
    }
    st -= 16 * lane;
    uint8_t* prm = st + S::kCodeBytes;
    for (int r = 0; r < K::kRanges; ++r) {
      uint32_t off, bytes;
      K::template range<D, C>(a.key, cc, r, off, bytes);
#pragma unroll 1
      for (uint32_t o = 16 * lane; o < bytes; o += 512) cp_async16(prm + o, kb + off + o);
      prm += bytes;
    }
    for (int r = 0; r < V::kRanges; ++r) {
      uint32_t off, bytes;
      V::template range<D, DP, C>(a.value, cc, r, off, bytes);
#pragma unroll 1
      for (uint32_t o = 16 * lane; o < bytes; o += 512) cp_async16(prm + o, vb + off + o);
      prm += bytes;
    }
  };

  // The first chunks' copies go out before the block builds its query fragments and copies the codecs' tables, so
  // that their latency overlaps that work (a warp's stages are its own; its barriers were set up by its lane 0).
#pragma unroll
  for (int st = 0; st < kStages - 1; ++st) {
    if (chunk_begin + st < chunk_end) issue(chunk_begin + st, st);
    if constexpr (S::kLanes) cp_async_commit();
  }

  // The group's queries as A fragments (and their fp32 values for per-chunk rebuilds), rows n >= G zero; the
  // integer path: their digits and each row's scale.
  if constexpr (kInt) {
    int_query_table<K, D, GS == 0 ? 2 : 1, S::kThreads>(a.q_space + q_row0 * S::KD, a.scale_log2, a.G, qtab,
                                                         qscale);
  } else {
    for (int idx = threadIdx.x; idx < KS * 32; idx += S::kThreads) {
      const int ks = idx >> 5, g = (idx & 31) >> 2, i = idx & 3;
      float x[4];
#pragma unroll
      for (int e = 0; e < 4; ++e)
        x[e] = g < a.G ? a.q_space[(q_row0 + g) * S::KD + K::template channel<D>(ks, frag_k(i, e))] * a.scale_log2
                       : 0.0f;
      qtab[idx] = split_fragment<K::kBf16>(x[0], x[1], x[2], x[3]);
      if constexpr (K::kChunkA) qf[idx] = make_float4(x[0], x[1], x[2], x[3]);
    }
  }
  for (uint32_t idx = threadIdx.x; idx < a.key.table_bytes / 16; idx += S::kThreads)
    reinterpret_cast<uint4*>(ktable)[idx] = static_cast<const uint4*>(a.key.table)[idx];
  for (uint32_t idx = threadIdx.x; idx < a.value.table_bytes / 16; idx += S::kThreads)
    reinterpret_cast<uint4*>(vtable)[idx] = static_cast<const uint4*>(a.value.table)[idx];
  __syncthreads();

  // The integer path's factor of the lane's row n: S_n times 2^-kIntFactorLog2 (int4 codes enter times 16).
  float row_scale = 1.0f;
  if constexpr (kInt) row_scale = qscale[lane >> 2] * (1.0f / (1 << K::kIntFactorLog2));
  bool split_digits = false;  // block digits: split_block_digits, whose rows 4..7 stay zero
  if constexpr (S::kBlockDigits) {
    __syncthreads();  // every warp has read S before warp 0 writes its first A table
    split_digits = split_block_digits<K, D>(a.G);
    if (split_digits && lane >= 16)
      for (int ks = 0; ks < S::KD / 32; ++ks) atab[32 * ks + lane] = make_uint4(0u, 0u, 0u, 0u);
  }

  float kb_max = 0, kb_bias = 0;  // block digits: the current key block's s_max and the row's <x', m>

  float m_run = -INFINITY, l_run = 0;
  float o[kOTiles][4];
#pragma unroll
  for (int j = 0; j < kOTiles; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0;

  uint32_t phases = 0;  // bulk copies: the parity each stage's barrier completes next, one bit a stage
  for (int chunk = chunk_begin, stage = 0; chunk < chunk_end;
       ++chunk, stage = stage == kStages - 1 ? 0 : stage + 1) {
    if (chunk + kStages - 1 < chunk_end) issue(chunk + kStages - 1, stage == 0 ? kStages - 1 : stage - 1);
    if constexpr (S::kBulk) {
      mbar_wait(bars + 2 * stage, (phases >> stage) & 1);
      phases ^= 1u << stage;
    }
    if constexpr (S::kLanes) {
      cp_async_commit();
      cp_async_wait<kStages - 1>();
    }
    __syncwarp();
    const uint8_t* st = ring + stage * a.stage_bytes;
    const uint4* kcodes = reinterpret_cast<const uint4*>(st);
    const uint4* vcodes = reinterpret_cast<const uint4*>(st + S::kKeyCodeBytes);
    const uint8_t* kprm[kTableSlot + 1] = {st + kpo[0], st + kpo[1], st + kpo[2], ktable};
    const uint8_t* vprm[kTableSlot + 1] = {st + vpo[0], st + vpo[1], st + vpo[2], vtable};

    // Scores of the chunk: lane (n, i) holds row n's scores of tokens (C/4) i + {jj, C/8 + jj} in sc[jj][0 / 1].
    float sc[NT][2];
#pragma unroll
    for (int jj = 0; jj < NT; ++jj) sc[jj][0] = sc[jj][1] = 0;
    if constexpr (S::kBlockDigits) {
      if ((chunk & chunk_mask) == 0 || chunk == chunk_begin)  // a new key block: its digit table
        block_digits<K, D>(kprm, a.key, lane, split_digits, qtab, atab, kb_max, kb_bias);
      int_scores<K, D, C, GS>(atab, kcodes, kprm, a.key, lane, sc);
#pragma unroll
      for (int jj = 0; jj < NT; ++jj) {
        sc[jj][0] = fmaf(sc[jj][0], kb_max, kb_bias);
        sc[jj][1] = fmaf(sc[jj][1], kb_max, kb_bias);
      }
    } else if constexpr (kInt) {
      int_scores<K, D, C, GS>(qtab, kcodes, kprm, a.key, lane, sc);
    } else if constexpr (K::kChunkA) {
      float cst = K::template prepare<D>(kprm, a.key, lane, qf, atab);
      cst += __shfl_xor_sync(0xffffffffu, cst, 1);
      cst += __shfl_xor_sync(0xffffffffu, cst, 2);
      fp_scores<K, D, C, GS>(atab, kcodes, kprm, a.key, lane, sc);
#pragma unroll
      for (int jj = 0; jj < NT; ++jj) {
        sc[jj][0] += cst;
        sc[jj][1] += cst;
      }
    } else {
      fp_scores<K, D, C, GS>(qtab, kcodes, kprm, a.key, lane, sc);
    }
    if constexpr (kWindowStart) {  // read here, not kept: held through the chunk step, int4 at d = 256 spilled
      const int first = *static_cast<const volatile int*>(&a.seqs[s].window_first);
      hide_before<C>(first - chunk * C, lane, sc);
    }

    float p[C / 4];
    softmax_update<C, kOTiles, kInt, kWeightLog2, kFastValues>(sc, row_scale, m_run, l_run, o, p);
    if constexpr (kFastValues) accumulate_values_fast<V, D, DP, C>(p, vcodes, vprm, a.value, lane, pc, o);
    else accumulate_values<V, D, DP, C>(p, vcodes, vprm, a.value, lane, pc, o);
    __syncwarp();  // every lane is done with the stage before it is refilled
  }
  if constexpr (S::kLanes) cp_async_wait<0>();
  allow_next_kernel();  // the merge may be scheduled; it waits for this kernel's end before reading

  // The warp's partial state: o and l times 2^-kWeightLog2 (the weights' factor).
  constexpr float kUnweight = 1.0f / (1 << kWeightLog2);
  l_run += __shfl_xor_sync(0xffffffffu, l_run, 1);
  l_run += __shfl_xor_sync(0xffffffffu, l_run, 2);
  const int n = lane >> 2, i = lane & 3;
  const auto row_of = [&](int query) { return (q_row0 + query) * a.n_splits + range; };
  if constexpr (kFastValues) {
    if constexpr (kOTiles > kValueTiles) add_value_offsets<V, DP>(a.value, lane, pc, o);
#pragma unroll
    for (int x = 0; x < 2; ++x)  // query rows 2i, 2i + 1
      if (2 * i + x < a.G) {
        float* po = a.partial_o + row_of(2 * i + x) * S::VD + pc;
#pragma unroll
        for (int m = 0; m < kValueTiles; ++m) {
          po[V::channel(2 * m, n)] = o[m][x] * kUnweight;
          po[V::channel(2 * m + 1, n)] = o[m][2 + x] * kUnweight;
        }
      }
  } else if (n < a.G) {
    float* po = a.partial_o + row_of(n) * S::VD + pc;
#pragma unroll
    for (int j = 0; j < NJ; ++j) {
      po[V::channel(j, 2 * i)] = (o[j][0] + o[j][2]) * kUnweight;
      po[V::channel(j, 2 * i + 1)] = (o[j][1] + o[j][3]) * kUnweight;
    }
  }
  if (n < a.G && i == 0 && pc == 0) {
    a.partial_ml[2 * row_of(n)] = m_run;
    a.partial_ml[2 * row_of(n) + 1] = l_run * kUnweight;
  }
}

/// What the plan needs of one pair's kernel at one head dimension.
struct SplitKernel {
  const void* fn = nullptr;               // the __global__ function
  const void* window_start_fn = nullptr;  // its kWindowStart variant
  int threads = 0, warps = 0, parts = 0, chunk = 0, stages = 0;
  int code_bytes = 0;   // per warp and stage
  int param_bytes = 0;  // per warp and stage, for the codecs' arguments
  int block_bytes = 0, warp_bytes = 0;
  bool fast = false;    // a fast path: the int keys' integer scores or the fast value path, not only exact fp16
};

/// The kernel for the key groups' shift; the integer path takes groups of 16 channels for int4 keys too (two
/// masked products per k32 step), which the fp16 path cannot (a lane word feeds two of its k steps).
template <class K, class V, int D, bool kWindowStart, bool kInt, bool kFastValues>
const void* split_kernel_fn(int group_shift) {
  if constexpr (K::kGroups) {
    switch (group_shift) {
      case 0:
        if constexpr (kInt || K::kMinGroupShift == 0)
          return reinterpret_cast<const void*>(&decode_split_kernel<K, V, D, 0, kWindowStart, kInt, kFastValues>);
        return nullptr;
      case 1: return reinterpret_cast<const void*>(&decode_split_kernel<K, V, D, 1, kWindowStart, kInt, kFastValues>);
      case 2: return reinterpret_cast<const void*>(&decode_split_kernel<K, V, D, 2, kWindowStart, kInt, kFastValues>);
      default: return nullptr;
    }
  } else {
    return reinterpret_cast<const void*>(
        &decode_split_kernel<K, V, D, log2_of(D / 16), kWindowStart, kInt, kFastValues>);
  }
}

template <class K, class V, int D, bool kInt, bool kFastValues>
SplitKernel split_kernel_at(const CodecArgs& key, const CodecArgs& value) {
  using S = SplitShape<K, V, D, kInt>;
  SplitKernel k;
  k.fn = split_kernel_fn<K, V, D, false, kInt, kFastValues>(key.group_shift);
  k.window_start_fn = split_kernel_fn<K, V, D, true, kInt, kFastValues>(key.group_shift);
  k.fast = kInt || kFastValues;
  k.threads = S::kThreads;
  k.warps = S::kWarps;
  k.parts = S::kParts;
  k.chunk = S::C;
  k.stages = S::kStages;
  k.code_bytes = S::kCodeBytes;
  k.param_bytes = static_cast<int>(param_bytes<K, V, D>(key, value));  // the same for both paths
  k.block_bytes = S::kBlockBytes;
  k.warp_bytes = S::kWarpBytes;
  return k;
}

template <class K, class V, int D>
SplitKernel split_kernel_at(const CodecArgs& key, const CodecArgs& value, bool fast) {
  constexpr bool kInt = has_int_scores<K>();
  if constexpr (has_fast_values<V>()) {
    if (fast && V::fast_values(value)) return split_kernel_at<K, V, D, kInt, true>(key, value);
  }
  if constexpr (kInt) {
    if (fast) return split_kernel_at<K, V, D, true, false>(key, value);
  }
  return split_kernel_at<K, V, D, false, false>(key, value);
}

/// The split kernel of the pair (K, V) for head dimension d (decode_pairs.cu instantiates each pair): with `fast`
/// (KVQ_ATTENTION=fast) the integer path where the keys have one and the fast value path where the values have one
/// (SplitKernel::fast says whether either applies); fn is null when d or the key groups have no instantiation.
template <class K, class V>
SplitKernel split_kernel(int d, const CodecArgs& key, const CodecArgs& value, bool fast) {
  switch (d) {
    case 64: return split_kernel_at<K, V, 64>(key, value, fast);
    case 128: return split_kernel_at<K, V, 128>(key, value, fast);
    case 256: return split_kernel_at<K, V, 256>(key, value, fast);
    default: return {};
  }
}

}  // namespace kvq::cuda::detail

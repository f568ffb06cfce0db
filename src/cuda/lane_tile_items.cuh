// How the int8/int4 and kivi append kernels split a page's tile among warps: a warp per item, and no block barrier
// between an item's stages (only __syncwarp). An item is P = 32 >> lb consecutive tokens (the tokens of one value
// code word of layout::IntGroup / layout::Kivi, codes of 2^lb bits) x a span of S = max(G, 32) channels (whole
// groups of G). A warp sees its item two ways:
// - quads: each lane a float4 of 4 consecutive channels of one token, S / 4 lanes a token, 128 / S tokens a round.
//   The group statistics (a group's lanes meet by shuffles) and the key code words (32 >> lb consecutive channels
//   of one token, from 8 >> lb lanes) take this view; a quarter warp reads 128 contiguous bytes (no bank conflict).
// - columns: each lane one channel of each 32 channels of the span, over the item's P tokens: a value code word (the
//   P tokens of one channel) is built by one lane.
#pragma once

#include <cstdint>

#include "cuda/encode_kernel.cuh"
#include "cuda/encode_layout.cuh"

namespace kvq::cuda::detail {

constexpr unsigned kFullWarp = 0xffffffffu;
/// (token, group) pairs of an item, at most: P * S / G <= 32 (P <= 16, and S / G = 2 only where G = 16).
constexpr int kItemPairs = 32;

/// Calls run(t0, c0) for each item of a page of T tokens x d channels, a warp per item: tokens [t0, t0 + P),
/// channels [c0, c0 + S) (the last span may pass d by 16 channels: d is a multiple of 16 and of G), P = 2^lp and
/// S = 2^ls (shifts: the compiler cannot see that run-time P and S are powers of two, and divided).
template <class Run>
__device__ void for_each_lane_tile_item(int T, int d, int lp, int ls, const Run& run) {
  constexpr int kWarps = kEncodeThreads / 32;
  const int spans = (d + (1 << ls) - 1) >> ls, rows = T >> lp;
  // item i = row * spans + span, i stepping by kWarps: the (row, span) pair stepped alike, no division
  int row = 0, span = static_cast<int>(threadIdx.x) >> 5;
  while (span >= spans) span -= spans, ++row;
  while (row < rows) {
    run(row << lp, span << ls);
    span += kWarps;
    while (span >= spans) span -= spans, ++row;
  }
}

/// The quad view of a lane in an item of span S = 2^ls.
struct ItemQuad {
  int tokens_per_round;  ///< 128 / S
  int c;                 ///< offset of the lane's 4 channels in the span
  int p;                 ///< the lane's token in a round
  __device__ static ItemQuad of(int ls, int lane) {
    const int llanes = ls - 2;  // S / 4 lanes a token
    return {1 << (5 - llanes), 4 * (lane & ((1 << llanes) - 1)), lane >> llanes};
  }
};

/// Stores the key code word of token t that holds channel c (a quad's first channel): `codes` are the lane's four
/// codes (2^lb bits each, in channel order); the 8 >> lb lanes of a word meet by shuffles and its first lane stores
/// it, where c < d (a word lies wholly below d or wholly beyond it). Every lane of the warp calls it.
__device__ inline void store_key_quad_word(uint32_t* block, int d, int lb, int lane, int t, int c, uint32_t codes) {
  const int n = 8 >> lb;  // lanes per word
  uint32_t word = codes << ((lane & (n - 1)) * (4 << lb));
  for (int m = 1; m < n; m <<= 1) word |= __shfl_xor_sync(kFullWarp, word, m);
  if ((lane & (n - 1)) == 0 && c < d) block[lane_tile_place(true, d, lb, t, c).byte / 4] = word;
}

/// Stores the value code word of channel c over tokens [t0, t0 + 32 >> lb).
__device__ inline void store_value_word(uint32_t* block, int d, int lb, int t0, int c, uint32_t word) {
  block[lane_tile_place(false, d, lb, t0, c).byte / 4] = word;
}

}  // namespace kvq::cuda::detail

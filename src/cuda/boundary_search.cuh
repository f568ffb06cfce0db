// A scalar codebook's index (FloatCodebook::nearest: the number of boundaries below v) by binary search, and its
// level by index, for host and device with the width a constant: the boundaries are sorted, so the ones below v are
// a prefix of them and Bits compares find its length where the linear count takes 2^Bits - 1 (ties and NaN as that
// count: v > at[k] decides). Both select among values held by value (registers on the device) with trees of
// selects, never an indexed register. tests/boundary_search_test.cpp checks them against FloatCodebook on the host.
#pragma once

#include <cstdint>

#include "cuda/encode_layout.cuh"  // KVQ_ENCODE_HD

namespace kvq::cuda::detail {

/// The 2^Bits - 1 sorted boundaries of a Bits-bit book, held by value (in registers on the device, loaded once per
/// thread).
template <int Bits>
struct BoundarySearch {
  static constexpr int kCount = (1 << Bits) - 1;
  float at[kCount];

  KVQ_ENCODE_HD explicit BoundarySearch(const float* boundaries) {
    for (int k = 0; k < kCount; ++k) at[k] = boundaries[k];
  }

  KVQ_ENCODE_HD uint32_t index(float v) const {
    uint32_t idx = 0;
    search<1 << (Bits - 1)>(v, idx);
    return idx;
  }

 private:
  // Sets bit Step of the index, then the lower ones: each compare's boundary selected by the bits found so far (a
  // tree of selects: no indexed registers).
  template <int Step>
  KVQ_ENCODE_HD void search(float v, uint32_t& idx) const {
    if (v > pick<Step, 0, (1 << Bits) / (2 * Step)>(idx)) idx |= Step;
    if constexpr (Step > 1) search<Step / 2>(v, idx);
  }
  // at[idx + Step - 1] for idx a multiple of 2 Step, among the N candidates from the First-th on.
  template <int Step, int First, int N>
  KVQ_ENCODE_HD float pick(uint32_t idx) const {
    if constexpr (N == 1) {
      return at[First * 2 * Step + Step - 1];
    } else {
      const bool upper = (idx & ((N / 2) * 2 * Step)) != 0;
      return upper ? pick<Step, First + N / 2, N / 2>(idx) : pick<Step, First, N / 2>(idx);
    }
  }
};

/// The 2^Bits levels of a Bits-bit book, level(i) = at[i] by a tree of selects on i's bits.
template <int Bits>
struct LevelTable {
  float at[1 << Bits];

  KVQ_ENCODE_HD explicit LevelTable(const float* levels) {
    for (int k = 0; k < (1 << Bits); ++k) at[k] = levels[k];
  }

  KVQ_ENCODE_HD float level(uint32_t i) const { return pick<0, (1 << Bits)>(i); }

 private:
  // at[i] among the N levels from the First-th on (i's bits below N decide).
  template <int First, int N>
  KVQ_ENCODE_HD float pick(uint32_t i) const {
    if constexpr (N == 1) {
      return at[First];
    } else {
      return (i & (N / 2)) != 0 ? pick<First + N / 2, N / 2>(i) : pick<First, N / 2>(i);
    }
  }
};

}  // namespace kvq::cuda::detail

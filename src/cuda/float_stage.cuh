// Where a chunk of f16/bf16 rows (C tokens x D channels, token-major as in the block) lies in a pipeline stage, and
// its copy there by the copy engine.
//
// The chunk goes as 8 units of C / 8 consecutive token rows, one bulk copy each (a lane's), unit u into slot(u) of
// unit + 16 bytes: the units are multiples of 128 bytes, so slot s starts at 16-byte bank group s % 8 and the
// 16-byte column c of its rows lies in bank group (s + c) % 8. The fragments read 8 rows of one column from 8
// units (values: ldmatrix.trans, row r of each 8 x 8 matrix from unit r), or two units of a quarter warp at 4
// columns each (keys: units 2q and 2q + 1, slots 4 apart): no bank conflicts, where the block's own layout put all
// 8 rows of a column in one bank group.
#pragma once

#include <cstdint>

#include "cuda/fragment_ops.cuh"

namespace kvq::cuda::detail {

template <int D, int C>
struct FloatStage {
  static constexpr int kUnits = 8;
  static constexpr int kUnitRows = C / kUnits;
  static constexpr uint32_t kRowBytes = 2 * D;
  static constexpr uint32_t kUnitBytes = kUnitRows * kRowBytes;
  static constexpr uint32_t kSlotBytes = kUnitBytes + 16;
  static constexpr uint32_t kBytes = kUnits * kSlotBytes;
  static_assert(kUnitBytes % 128 == 0, "a slot's bank group is its index mod 8");

  /// Units 2q and 2q + 1 four bank groups apart, the 8 units in 8 bank groups.
  KVQ_HD static constexpr int slot(int u) { return 4 * (u & 1) + (u >> 1); }
  KVQ_HD static constexpr uint32_t unit_offset(int u) { return slot(u) * kSlotBytes; }
  /// The byte offset of 16-byte column col of the chunk's token t.
  KVQ_HD static constexpr uint32_t at(int t, int col) {
    return unit_offset(t / kUnitRows) + (t % kUnitRows) * kRowBytes + 16 * col;
  }

#if defined(__CUDACC__)
  /// Unit u of a chunk, completing on bar (armed for 2 C D bytes per chunk copied).
  __device__ static void copy_unit(uint8_t* stage, const uint8_t* chunk, int u, uint64_t* bar) {
    bulk_copy(stage + unit_offset(u), chunk + u * kUnitBytes, kUnitBytes, bar);
  }
#endif
};

}  // namespace kvq::cuda::detail

// Byte layouts of every codec's block, in one header shared by the C++ kernels and (later) the CUDA kernels.
//
// A block holds T tokens of one head. Blocks are structure-of-arrays: each section (codes, scales, norms, ...)
// starts at a 16-byte aligned offset inside the block, so that SIMD loads of a section never straddle it.
// Blocks themselves carry no alignment promise: multi-byte fields are read with memcpy (or aligned loads where the
// cache guarantees 64-byte aligned blocks). All multi-byte fields are little-endian; fp16 means IEEE binary16.
// Each layout gives its size formula, its bits per element, and a static_assert at d = 128, T = 64.
#pragma once

#include <cstddef>

namespace kvq::layout {

constexpr size_t align16(size_t n) { return (n + 15) & ~size_t{15}; }

// ---- f32 / f16 / bf16 ------------------------------------------------------------------------------------------
// [T x d values], token-major. 32 / 16 / 16 bits per element.
struct Float {
  size_t d, T, width;  // width: 4 or 2 bytes
  constexpr size_t block_bytes() const { return T * d * width; }
};
static_assert(Float{128, 64, 2}.block_bytes() == 16384);

// ---- int8 / int4 (group absmax) ----------------------------------------------------------------------------------


// ---- kivi ------------------------------------------------------------------------------------------------------


// ---- turbo_mse / turbo_prod / qjl / turbo_rvq ------------------------------------------------------------------


// ---- vecinfer --------------------------------------------------------------------------------------------------


}  // namespace kvq::layout

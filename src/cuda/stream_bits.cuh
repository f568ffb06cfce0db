// Writing a code into a bitpack.hpp stream (LSB first) inside an append kernel's shared copy of a block: a code of
// up to 32 bits may straddle two 32-bit words, so it is OR-ed into both (several threads fill the bits of one word).
#pragma once

#include <cstdint>

namespace kvq::cuda::detail {

/// ORs `value` (already masked to `width` bits) into the block at block bit `bit` (encode_layout.cuh's
/// stream_code_bit; bit k is bit k % 32 of the little-endian word k / 32).
__device__ __forceinline__ void put_stream_bits(uint32_t* block, uint32_t bit, uint32_t value, uint32_t width) {
  if (value == 0) return;
  const uint32_t word = bit / 32, shift = bit % 32;
  atomicOr(block + word, value << shift);
  if (shift + width > 32) atomicOr(block + word + 1, value >> (32 - shift));
}

}  // namespace kvq::cuda::detail

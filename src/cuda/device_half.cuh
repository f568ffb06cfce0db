// fp16 and bf16 stores on the device with the bits of src/core/half.hpp and src/codec/fp16_bounds.hpp (round to
// nearest even; values beyond the range become Inf, which the encoders report), for finite inputs.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

namespace kvq::cuda::detail {

__device__ __forceinline__ uint16_t to_f16_bits(float f) { return __half_as_ushort(__float2half_rn(f)); }
__device__ __forceinline__ float f16_bits_to_float(uint16_t h) { return __half2float(__ushort_as_half(h)); }
__device__ __forceinline__ uint16_t to_bf16_bits(float f) { return __bfloat16_as_ushort(__float2bfloat16_rn(f)); }

/// The smallest fp16 >= v, as bits (fp16_bounds.hpp's f16_round_up).
__device__ __forceinline__ uint16_t f16_bits_round_up(double v) {
  const uint16_t h = to_f16_bits(__double2float_rn(v));
  if (!(static_cast<double>(f16_bits_to_float(h)) < v)) return h;
  if ((h & 0x7fffu) == 0) return 0x0001u;
  return static_cast<uint16_t>((h & 0x8000u) ? h - 1u : h + 1u);
}

/// The largest fp16 <= v, as bits.
__device__ __forceinline__ uint16_t f16_bits_round_down(double v) {
  return static_cast<uint16_t>(f16_bits_round_up(-v) ^ 0x8000u);
}

}  // namespace kvq::cuda::detail

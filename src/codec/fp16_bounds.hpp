// fp16 values that bound a real number from one side. Stored scales and minimums are rounded outward with these so
// that the range they describe still covers every input: a scale rounded down would push codes past the last level.
#pragma once

#include <cstdint>

#include "core/half.hpp"

namespace kvq {

/// The smallest fp16 value >= v, as bits; +Inf when v is above the largest finite fp16 (65504).
inline uint16_t f16_round_up(double v) {
  // Rounding through float and then fp16 lands on one of the two fp16 neighbours of v: one step up is enough.
  const uint16_t h = f32_to_f16(static_cast<float>(v));
  if (!(static_cast<double>(f16_to_f32(h)) < v)) return h;
  if ((h & 0x7fffu) == 0) return 0x0001u;                            // +-0 -> smallest positive subnormal
  return static_cast<uint16_t>((h & 0x8000u) ? h - 1u : h + 1u);     // toward +Inf in either sign
}

/// The largest fp16 value <= v, as bits; -Inf when v is below -65504.
inline uint16_t f16_round_down(double v) { return static_cast<uint16_t>(f16_round_up(-v) ^ 0x8000u); }

}  // namespace kvq

// turbo_mse keys' levels as signed bytes, for the fast attention kernels' integer dot products (docs/METHODS.md,
// "Fast attention kernels"). One rounding rule for the CPU's kernels (page_kernel.cpp hands them the bytes) and the
// CUDA decode kernel's integer path (decode_attention.cu), so that both score a key alike.
#pragma once

#include <cmath>
#include <cstdint>

namespace kvq {

/// The widest turbo_mse keys scored by their levels as bytes: at 4 bits the innermost level rounds to a byte of
/// about 6 (up to 8 % off) and the kernels' error reached a tenth of the codec's own (docs/METHODS.md).
inline constexpr int kByteLevelMaxBits = 3;

/// Levels L_j ~ unit l_j: unit = max_j |L_j| / 127 (1 where every level is zero), l_j = lrint(L_j / unit). So
/// |L_j - unit l_j| <= unit / 2, every l_j lies in [-127, 127] and the largest |L_j| maps to +-127.
struct SignedByteLevels {
  int8_t l[16];
  float unit;
};

/// levels: the 16 nibble levels of a LaneCodes chunk (TurboMseParams::nibble_levels).
inline SignedByteLevels signed_byte_levels(const float* levels) {
  SignedByteLevels b{};
  float amax = 0;
  for (int e = 0; e < 16; ++e) amax = std::fmax(amax, std::fabs(levels[e]));
  b.unit = amax > 0 ? amax / 127.0f : 1.0f;
  for (int e = 0; e < 16; ++e) b.l[e] = static_cast<int8_t>(std::lrint(levels[e] / b.unit));
  return b;
}

}  // namespace kvq

#include "core/half.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace kvq {
namespace {

// Double-precision reference: the fp16 value nearest to f (ties to even), found by scanning all finite encodings.
double nearest_f16(double f) {
  double best = 0, best_err = INFINITY;
  uint16_t best_bits = 0;
  for (uint32_t b = 0; b < 0x7c00; ++b) {
    for (int s = 0; s < 2; ++s) {
      const uint16_t bits = static_cast<uint16_t>(b | (s ? 0x8000u : 0u));
      const double v = f16_to_f32(bits);
      const double err = std::fabs(v - f);
      if (err < best_err || (err == best_err && (bits & 1u) == 0 && (best_bits & 1u))) {
        best = v, best_err = err, best_bits = bits;
      }
    }
  }
  return best;
}

TEST(Half, RoundTripsEveryF16Value) {
  for (uint32_t b = 0; b < 0x10000; ++b) {
    const uint16_t h = static_cast<uint16_t>(b);
    const float f = f16_to_f32(h);
    if (std::isnan(f)) {
      EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(f))));
      continue;
    }
    ASSERT_EQ(f32_to_f16(f), h) << std::hex << b;
  }
}

TEST(Half, RoundsToNearestEven) {
  for (double f : {0.1, -0.3333333, 1.0009765625 + 1e-9, 1.00048828125, 6.1e-5, 3.0e-8, 5.96e-8, 2.98e-8, 65504.0,
                   1234.5678, -0.000123}) {
    EXPECT_EQ(static_cast<double>(f16_to_f32(f32_to_f16(static_cast<float>(f)))), nearest_f16(static_cast<float>(f)))
        << f;
  }
  EXPECT_TRUE(std::isinf(f16_to_f32(f32_to_f16(65520.0f))));
  EXPECT_EQ(f16_to_f32(f32_to_f16(65519.0f)), 65504.0f);
  EXPECT_TRUE(std::isinf(f16_to_f32(f32_to_f16(std::numeric_limits<float>::infinity()))));
  EXPECT_TRUE(std::isnan(f16_to_f32(f32_to_f16(std::numeric_limits<float>::quiet_NaN()))));
}

TEST(Half, Bfloat16) {
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.0f)), 1.0f);
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.00390625f)), 1.0f);    // tie -> even
  EXPECT_EQ(bf16_to_f32(f32_to_bf16(1.01171875f)), 1.015625f);  // tie -> even (up)
  EXPECT_TRUE(std::isnan(bf16_to_f32(f32_to_bf16(std::numeric_limits<float>::quiet_NaN()))));
  for (float f : {3.14159f, -2.71828f, 1e-20f, 1e20f}) EXPECT_NEAR(bf16_to_f32(f32_to_bf16(f)), f, std::fabs(f) / 256);
}

}  // namespace
}  // namespace kvq

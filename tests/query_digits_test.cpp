// The fast kernels' query digits (src/attention/query_digits.hpp), shared by the CPU's fast kernels and the CUDA
// decode kernel's integer path: two 8-bit digits hold round(q / S) exactly, the top one in [-127, 127], the low one
// in [-128, 127], D0 = floor((v + 128) / 256); |q - S (256 D0 + D1)| <= S / 2 (plus the rounding of q / S) with
// S = max|q| / 32512; a query too small for a normal S takes S = 1 and zero digits.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <vector>

#include "attention/query_digits.hpp"
#include "kvq/detail/synthetic.hpp"
#include "test_seed.hpp"

namespace kvq {
namespace {

using detail::digit_scale;
using detail::kDigitsMax;
using detail::query_digits;

TEST(QueryDigits, TwoDigitsHoldTheRoundedQuery) {
  KVQ_FRESH_SEED();
  static_assert(kDigitsMax<2> == 32512 && kDigitsMax<1> == 127 && kDigitsMax<3> == 8323072);
  const float sizes[] = {1.0f, 3e-20f, 7e25f, 0.001f};
  for (uint64_t k = 0; k < 4; ++k) {
    const float size = sizes[k];
    std::vector<float> q = gaussian_vectors(4, 128, seed + k);
    for (float& x : q) x *= size;
    q[17] = 40.0f * size;  // an outlier channel
    for (size_t row = 0; row < 4; ++row) {
      const float* x = q.data() + row * 128;
      float amax = 0;
      for (int c = 0; c < 128; ++c) amax = std::max(amax, std::fabs(x[c]));
      const float S = digit_scale<2>(amax);
      ASSERT_EQ(S, amax / 32512.0f);
      bool top = false;
      for (int c = 0; c < 128; ++c) {
        int32_t d[2];
        query_digits<2>(x[c], S, d);
        ASSERT_GE(d[0], -127);
        ASSERT_LE(d[0], 127);
        ASSERT_GE(d[1], -128);
        ASSERT_LE(d[1], 127);
        const int32_t v = 256 * d[0] + d[1];
        const float r = x[c] / S;
        EXPECT_EQ(v, static_cast<int32_t>(r < 0 ? r - 0.5f : r + 0.5f)) << "round half away from zero";
        EXPECT_EQ(d[0], static_cast<int32_t>(std::floor((v + 128) / 256.0)));
        // S / 2, plus the fp32 rounding of q / S (at most 32512 x 2^-24 < 2^-9 of S)
        EXPECT_LE(std::fabs(static_cast<double>(x[c]) - static_cast<double>(S) * v), (0.5 + 0x1p-9) * S);
        top |= std::abs(v) == 32512;
      }
      EXPECT_TRUE(top) << "the largest element takes the whole range";
    }
  }
}

TEST(QueryDigits, QueriesTooSmallToScaleTakeZeroDigits) {
  EXPECT_EQ(digit_scale<2>(0.0f), 1.0f);
  EXPECT_EQ(digit_scale<2>(1e-35f), 1.0f);  // below FLT_MIN x 32512
  EXPECT_EQ(digit_scale<2>(FLT_MIN * 32512.0f), FLT_MIN);
  for (const float x : {1e-35f, -1e-38f, 1e-44f, 0.0f}) {
    int32_t d[2];
    query_digits<2>(x, digit_scale<2>(std::fabs(x)), d);
    EXPECT_EQ(d[0], 0);
    EXPECT_EQ(d[1], 0);
  }
}

}  // namespace
}  // namespace kvq

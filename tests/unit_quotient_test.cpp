// The CUDA append kernels' quotient (src/codec/unit_quotient.hpp) against the division it replaces, bit for bit, on
// the host: over random rows divided by their norms and over quotients placed within a few ulps of the float midpoints
// (where a product off by an ulp would round differently). KVQ_QUOTIENT_SWEEP=<millions> runs that many million
// random rows' elements more.
#include <gtest/gtest.h>

#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <random>
#include <vector>

#include "codec/lane_norm.hpp"
#include "codec/unit_quotient.hpp"
#include "test_seed.hpp"

namespace kvq {
namespace {

uint32_t float_bits(float f) {
  uint32_t b;
  std::memcpy(&b, &f, sizeof b);
  return b;
}

/// Counts the elements whose unit_quotient differs in any bit from float(x / norm).
int64_t mismatches(const float* x, size_t n, double norm) {
  const double inverse = 1.0 / norm;
  int64_t bad = 0;
  for (size_t i = 0; i < n; ++i)
    bad += float_bits(unit_quotient(x[i], norm, inverse)) != float_bits(static_cast<float>(x[i] / norm));
  return bad;
}

/// Random rows of awkward sizes at magnitudes 2^-149 .. 2^120 (normal and subnormal floats, rows of one large and
/// many tiny elements), each divided by its own lane_norm as the encoders do.
int64_t random_rows(std::mt19937_64& rng, int64_t elements) {
  constexpr int kDims[] = {1, 3, 7, 17, 31, 33, 64, 96, 128, 200, 256, 512};
  std::normal_distribution<float> normal;
  std::uniform_int_distribution<int> scale(-150, 120), pick(0, 11), style(0, 3);
  std::vector<float> row(512);
  int64_t bad = 0;
  for (int64_t done = 0; done < elements;) {
    const int d = kDims[pick(rng)], s = style(rng);
    const int e = scale(rng);
    for (int j = 0; j < d; ++j) {
      const float v = normal(rng);
      // 0: one scale; 1: a scale per element (wide dynamic range); 2: one outlier; 3: tiny, down to subnormals
      const int ej = s == 1 ? scale(rng) : s == 3 ? e - 100 : e;
      row[j] = std::ldexp(v, ej < -149 ? -149 : ej);
    }
    if (s == 2) row[0] = std::ldexp(1.0f + std::abs(normal(rng)), e + 20 > 120 ? 120 : e + 20);
    const double norm = lane_norm(row.data(), d);
    if (norm > 0) bad += mismatches(row.data(), d, norm);
    done += d;
  }
  return bad;
}

TEST(UnitQuotient, MatchesTheDivisionOnRandomRows) {
  KVQ_FRESH_SEED();
  std::mt19937_64 rng(seed);
  EXPECT_EQ(random_rows(rng, 20'000'000), 0);
}

// Quotients within a few double ulps of the midpoints between floats, normal and subnormal (where a product off by an
// ulp would round to the other float), of the floats themselves, and below the normal floats; x random or at powers
// of two, the largest and the subnormal floats; the norms of every significand that gives such a quotient.
TEST(UnitQuotient, MatchesTheDivisionNearFloatMidpoints) {
  KVQ_FRESH_SEED();
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> unit(0.0, 1.0);
  std::uniform_int_distribution<int> exponent(-149, 127), shift(0, 60), subnormal(0, (1 << 23) - 2);
  const float special[] = {1.0f, -1.0f, FLT_MAX, -FLT_MAX, FLT_MIN, FLT_TRUE_MIN, -FLT_TRUE_MIN, 0x1.fffffep-1f,
                           0x1.000002p0f, 3.0f, 0x1p-126f, 0x1.fffffcp-127f};
  int64_t bad = 0, cases = 0;
  for (int trial = 0; trial < 300'000; ++trial) {
    const float x = trial < 12 * 1000 ? special[trial % 12]
                                      : static_cast<float>(std::ldexp(1.0 + unit(rng), exponent(rng)));
    // A target quotient in (0, 1]: a float, the midpoint above it, a midpoint between subnormal floats, or any
    // quotient below the normal floats.
    const int kind = trial % 4;
    const float f = static_cast<float>(std::ldexp(1.0 + unit(rng), -shift(rng) - 1));
    const double target = kind == 0   ? f
                          : kind == 1 ? f + std::ldexp(1.0, std::ilogb(f) - 24)
                          : kind == 2 ? std::ldexp(static_cast<double>(2 * subnormal(rng) + 1), -150)
                                      : std::ldexp(1.0 + unit(rng), -126 - shift(rng) % 30);
    const double base = std::abs(static_cast<double>(x)) / target;
    if (!(base >= std::abs(static_cast<double>(x))) || !std::isfinite(base) || base == 0) continue;
    double norm = base;
    for (int k = 0; k < 8; ++k) norm = std::nextafter(norm, 0.0);
    for (int k = 0; k < 17; ++k, norm = std::nextafter(norm, INFINITY)) {
      if (norm < std::abs(static_cast<double>(x))) continue;
      bad += mismatches(&x, 1, norm);
      ++cases;
    }
  }
  EXPECT_GT(cases, 4'000'000);
  EXPECT_EQ(bad, 0);
}

TEST(UnitQuotient, SweepFromTheEnvironment) {
  const char* env = std::getenv("KVQ_QUOTIENT_SWEEP");
  if (env == nullptr) GTEST_SKIP() << "set KVQ_QUOTIENT_SWEEP=<millions of elements> for a longer sweep";
  KVQ_FRESH_SEED();
  std::mt19937_64 rng(seed);
  EXPECT_EQ(random_rows(rng, std::strtoll(env, nullptr, 10) * 1'000'000), 0);
}

}  // namespace
}  // namespace kvq

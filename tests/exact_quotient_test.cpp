// The append encoders' quotients without divisions (src/cuda/exact_quotient.cuh), run on the host, against the
// division they replace: divide() against a / b bit for bit, rounded_code_bits() against the CPU int8/int4 and kivi
// encoders' clamp(nearbyint(v / s), lo, hi) for every positive fp16 scale. KVQ_EXACT_QUOTIENT_SWEEP=N multiplies
// the random draws by N (a long run: N = 100 takes a few minutes).
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <limits>
#include <random>
#include <vector>

#include "core/half.hpp"
#include "cuda/exact_quotient.cuh"
#include "test_seed.hpp"

namespace kvq::cuda::detail {
namespace {

uint64_t sweep_factor() {
  const char* env = std::getenv("KVQ_EXACT_QUOTIENT_SWEEP");
  return env != nullptr ? std::max<uint64_t>(1, std::strtoull(env, nullptr, 10)) : 1;
}

float from_bits(uint32_t u) { return std::bit_cast<float>(u); }
uint32_t bits_of(float f) { return std::bit_cast<uint32_t>(f); }

// Both NaN, or the same bits (the sign of a zero included).
bool same(float a, float b) { return (std::isnan(a) && std::isnan(b)) || bits_of(a) == bits_of(b); }

// Counts the cases and the mismatches, reporting the first few.
struct Tally {
  uint64_t cases = 0, wrong = 0;
  template <class Message>
  void check(bool ok, const Message& message) {
    ++cases;
    if (!ok && ++wrong <= 5) ADD_FAILURE() << message();
  }
};

// Divisors: lambda's trained range ([1e-3, 1e3]) log-uniform, then the significands that stress a reciprocal (1,
// 1 + ulp, all ones, 1.5, near sqrt 2) at several exponents, and divisors outside [2^-16, 2^16] (the division).
std::vector<float> divisors(std::mt19937_64& rng, int random) {
  std::vector<float> out;
  std::uniform_real_distribution<double> log10(-3, 3);
  for (int i = 0; i < random; ++i) out.push_back(static_cast<float>(std::pow(10.0, log10(rng))));
  for (uint32_t mant : {0u, 1u, 2u, 0x7fffffu, 0x7ffffeu, 0x400000u, 0x3504f3u, 0x555555u, 0x2aaaabu})
    for (int e : {-16, -10, -1, 0, 1, 7, 10, 15, 16})
      out.push_back(from_bits(static_cast<uint32_t>(127 + e) << 23 | mant));
  for (float b : {0x1p-17f, 0x1.fffffep-17f, 0x1.000002p16f, 1e-30f, 1e30f, std::numeric_limits<float>::min(),
                  std::numeric_limits<float>::max(), std::numeric_limits<float>::denorm_min()})
    out.push_back(b);
  return out;
}

TEST(ExactQuotient, DivideIsTheDivision) {
  KVQ_FRESH_SEED();
  std::mt19937_64 rng(seed);
  const uint64_t rounds = 40 * sweep_factor();
  const std::vector<float> bs = divisors(rng, 1000);
  std::uniform_int_distribution<uint32_t> any_bits;
  std::uniform_int_distribution<uint32_t> mant(0, (1u << 23) - 1);
  std::uniform_int_distribution<int> exponent(-40, 40);  // lambda's quotients: rotated keys and values
  std::uniform_int_distribution<int> any_exponent(-160, 130);
  Tally tally;
  for (const float b : bs) {
    const Divisor d = divisor_of(b);
    auto check = [&](float a) {
      float v[1] = {a};
      divide(v, [&](int) { return d; });
      const float want = a / b, got = v[0];
      tally.check(same(got, want), [&] {
        return testing::Message() << a << " / " << b << ": " << got << ", the division " << want;
      });
    };
    for (float a : {0.0f, -0.0f, 1.0f, -1.0f, b, -b, std::numeric_limits<float>::infinity(),
                    -std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN(),
                    std::numeric_limits<float>::denorm_min(), std::numeric_limits<float>::min(),
                    std::numeric_limits<float>::max(), -std::numeric_limits<float>::max()})
      check(a);
    for (uint64_t i = 0; i < rounds * 64; ++i) {
      // Any bit pattern, then a quotient near 2^e (the encoders' range) with a random significand.
      check(from_bits(any_bits(rng)));
      check(from_bits(static_cast<uint32_t>(127 + exponent(rng)) << 23 | mant(rng)) * (i % 2 ? b : -b));
      // Quotients nearest a midpoint between two floats (the hardest to round): a = RN(b m) with m = q + ulp(q) / 2
      // (b m exact in double), and quotients of products b k (small integers k, the quotient exact or nearly).
      const int e = i % 4 == 0 ? any_exponent(rng) : exponent(rng);  // a quarter over the whole range
      const double m = std::ldexp(static_cast<double>((1u << 23) | mant(rng)), e - 23) + std::ldexp(1.0, e - 24);
      check(static_cast<float>(static_cast<double>(b) * m));
      check(static_cast<float>(static_cast<double>(b) * -m));
      check(b * static_cast<float>(mant(rng) >> 12));
    }
  }
  EXPECT_EQ(tally.wrong, 0u) << "of " << tally.cases;
  RecordProperty("cases", std::to_string(tally.cases));
}

// The CPU encoders' code of v in a group of scale s: int8/int4 (src/codec/int_group.cpp, lo = -qmax, hi = qmax)
// and kivi (src/codec/kivi.cpp, v = x - m, lo = 0, hi = 2^b - 1).
float cpu_code(float v, float s, float lo, float hi) {
  return s > 0 ? std::clamp(std::nearbyint(v / s), lo, hi) : 0.0f;
}

TEST(ExactQuotient, RoundedCodeIsTheCpuCode) {
  KVQ_FRESH_SEED();
  std::mt19937_64 rng(seed);
  const uint64_t random = 8 * sweep_factor();
  std::uniform_real_distribution<float> unit(-1, 1);
  Tally tally;
  struct Range {
    int lo, hi;
  };
  for (const Range range : {Range{-7, 7}, Range{-127, 127}, Range{0, 1}, Range{0, 3}, Range{0, 7}, Range{0, 15}}) {
    const float lo = static_cast<float>(range.lo), hi = static_cast<float>(range.hi);
    for (uint16_t h = 1; h < 0x7c00; ++h) {  // every positive finite fp16 scale
      const float s = f16_to_f32(h), y = code_inverse(s);
      auto check = [&](float v) {
        const float want = cpu_code(v, s, lo, hi);
        const auto got = static_cast<int32_t>(rounded_code_bits(v, s, y, lo, hi) - 0x4B400000u);
        tally.check(static_cast<float>(got) == want, [&] {
          return testing::Message() << "[" << lo << ", " << hi << "], v " << v << ", s " << s << ": " << got
                                    << ", the CPU " << want;
        });
      };
      // Around every boundary k + 1/2 (the product (k + 1/2) s is a float: 9 + 11 significant bits) and every
      // integer k, by a few ulps of v, over and past the clamp.
      for (int k = range.lo - 2; k <= range.hi + 1; ++k) {
        const float mid = (static_cast<float>(k) + 0.5f) * s, at = static_cast<float>(k) * s;
        float up = mid, down = mid;
        for (int n = 0; n < 4; ++n, up = std::nextafter(up, INFINITY), down = std::nextafter(down, -INFINITY))
          check(up), check(down);
        check(std::nextafter(at, INFINITY)), check(std::nextafter(at, -INFINITY));
      }
      for (float v : {0.0f, -0.0f, std::numeric_limits<float>::denorm_min(), -std::numeric_limits<float>::min(),
                      s * 0x1p-30f, s, -s, s * 0x1p100f, -s * 0x1p100f, s * 0x1.fffffep99f})
        check(v);
      const float span = std::max(hi, -lo) + 0.5f;
      for (uint64_t i = 0; i < random; ++i) check(unit(rng) * span * s);
    }
    // s = 0 (a group of zeros or a constant range, or a scale past fp16) with y = 0: code 0.
    EXPECT_EQ(rounded_code_bits(1e30f, 0, 0, lo, hi), 0x4B400000u);
    EXPECT_EQ(rounded_code_bits(-3.0f, 0, 0, lo, hi), 0x4B400000u);
  }
  EXPECT_EQ(tally.wrong, 0u) << "of " << tally.cases;
  RecordProperty("cases", std::to_string(tally.cases));
}

}  // namespace
}  // namespace kvq::cuda::detail

// Rotations: orthogonality, exact inverses, batching, determinism from the seed, the SRFT against a plain
// double-precision DFT, the FFT against the direct DFT, Haar statistics, Householder products, and error messages.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <complex>
#include <functional>
#include <limits>
#include <numbers>
#include <ostream>
#include <span>
#include <string>
#include <vector>

#include "kvq/detail/random.hpp"
#include "kvq/detail/synthetic.hpp"
#include "kvq/error.hpp"
#include "kvq/rotation.hpp"
#include "rotation/fft.hpp"
#include "test_seed.hpp"

namespace kvq {
namespace {

constexpr double kTol = 1e-5;  // relative, fp32 rotations

bool power_of_two(int d) { return (d & (d - 1)) == 0; }

double norm(const float* x, int d) {
  double s = 0;
  for (int i = 0; i < d; ++i) s += static_cast<double>(x[i]) * x[i];
  return std::sqrt(s);
}

double distance(const float* a, const float* b, int d) {
  double s = 0;
  for (int i = 0; i < d; ++i) s += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
  return std::sqrt(s);
}

/// Gaussian rows and key-like rows (non-zero channel means, up to 4 outlier channels 10-50x larger).
std::vector<std::vector<float>> test_data(size_t n, int d, uint64_t seed) {
  const int outliers = std::min(4, d / 2);
  return {gaussian_vectors(n, d, derive_seed(seed, 1)),
          sample_profile(key_like_profile(d, derive_seed(seed, 2), outliers), n, derive_seed(seed, 3))};
}

void expect_error(const std::function<void()>& f, const std::vector<std::string>& parts) {
  try {
    f();
    ADD_FAILURE() << "expected kvq::Error containing '" << parts.front() << "'";
  } catch (const Error& e) {
    const std::string what = e.what();
    for (const auto& part : parts) EXPECT_NE(what.find(part), std::string::npos) << "message: " << what;
  }
}

struct Case {
  std::string spec;
  int dim;
};
void PrintTo(const Case& c, std::ostream* os) { *os << c.spec << " d=" << c.dim; }

std::vector<Case> all_cases() {
  std::vector<Case> cases;
  for (const char* spec : {"identity", "hadamard", "srft", "haar", "householder", "householder:3"})
    for (int dim : {16, 48, 64, 80, 96, 128, 160, 192, 256})
      if (std::string(spec) != "hadamard" || power_of_two(dim)) cases.push_back({spec, dim});
  return cases;
}

std::string case_name(const testing::TestParamInfo<Case>& info) {
  std::string s = info.param.spec + "_d" + std::to_string(info.param.dim);
  for (char& c : s)
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  return s;
}

class RotationProperties : public testing::TestWithParam<Case> {};

TEST_P(RotationProperties, PreservesNormAndInverseRecoversInput) {
  KVQ_FRESH_SEED();
  const auto& [spec, d] = GetParam();
  const auto rot = make_rotation(spec, d, seed);
  constexpr size_t n = 8;
  for (const auto& x : test_data(n, d, seed)) {
    std::vector<float> y(x.size()), back(x.size());
    rot->apply(x.data(), y.data(), n);
    rot->apply_inverse(y.data(), back.data(), n);
    for (size_t r = 0; r < n; ++r) {
      const float* xr = x.data() + r * d;
      const double nx = norm(xr, d);
      EXPECT_NEAR(norm(y.data() + r * d, d), nx, kTol * nx) << "row " << r;
      EXPECT_LE(distance(back.data() + r * d, xr, d), kTol * nx) << "row " << r;
    }
  }
}

TEST_P(RotationProperties, BatchedEqualsRowByRow) {
  KVQ_FRESH_SEED();
  const auto& [spec, d] = GetParam();
  const auto rot = make_rotation(spec, d, seed);
  constexpr size_t n = 7;  // not a multiple of any internal row block
  const auto x = test_data(n, d, seed)[1];
  std::vector<float> batched(x.size()), single(x.size());
  for (bool inverse : {false, true}) {
    if (inverse) {
      rot->apply_inverse(x.data(), batched.data(), n);
      for (size_t r = 0; r < n; ++r) rot->apply_inverse(x.data() + r * d, single.data() + r * d, 1);
    } else {
      rot->apply(x.data(), batched.data(), n);
      for (size_t r = 0; r < n; ++r) rot->apply(x.data() + r * d, single.data() + r * d, 1);
    }
    EXPECT_EQ(batched, single) << (inverse ? "apply_inverse" : "apply");
  }
}

TEST_P(RotationProperties, InPlaceEqualsOutOfPlace) {
  KVQ_FRESH_SEED();
  const auto& [spec, d] = GetParam();
  const auto rot = make_rotation(spec, d, seed);
  constexpr size_t n = 5;
  const auto x = test_data(n, d, seed)[0];
  std::vector<float> out(x.size()), in_place = x;
  rot->apply(x.data(), out.data(), n);
  rot->apply(in_place.data(), in_place.data(), n);
  EXPECT_EQ(in_place, out) << "apply";
  in_place = x;
  rot->apply_inverse(x.data(), out.data(), n);
  rot->apply_inverse(in_place.data(), in_place.data(), n);
  EXPECT_EQ(in_place, out) << "apply_inverse";
}

TEST_P(RotationProperties, MatrixIsOrthogonalAndMatchesApply) {
  KVQ_FRESH_SEED();
  const auto& [spec, d] = GetParam();
  const auto rot = make_rotation(spec, d, seed);
  const std::vector<float> m = rot->matrix();
  const size_t dd = static_cast<size_t>(d);
  double worst_rrt = 0, worst_rtr = 0;
  for (size_t i = 0; i < dd; ++i)
    for (size_t j = 0; j < dd; ++j) {
      double rrt = 0, rtr = 0;
      for (size_t t = 0; t < dd; ++t) {
        rrt += static_cast<double>(m[i * dd + t]) * m[j * dd + t];
        rtr += static_cast<double>(m[t * dd + i]) * m[t * dd + j];
      }
      const double id = i == j ? 1.0 : 0.0;
      worst_rrt = std::max(worst_rrt, std::abs(rrt - id));
      worst_rtr = std::max(worst_rtr, std::abs(rtr - id));
    }
  EXPECT_LE(worst_rrt, kTol) << "R R^T - I";
  EXPECT_LE(worst_rtr, kTol) << "R^T R - I";

  // matrix() is built from apply_inverse; apply must agree with it (so apply_inverse is apply's transpose).
  const auto x = test_data(1, d, seed)[1];
  std::vector<float> y(dd), ref(dd);
  rot->apply(x.data(), y.data(), 1);
  for (size_t i = 0; i < dd; ++i) {
    double s = 0;
    for (size_t j = 0; j < dd; ++j) s += static_cast<double>(m[i * dd + j]) * x[j];
    ref[i] = static_cast<float>(s);
  }
  EXPECT_LE(distance(y.data(), ref.data(), d), kTol * norm(x.data(), d));
}

TEST_P(RotationProperties, SeedDeterminesRotation) {
  KVQ_FRESH_SEED();
  const auto& [spec, d] = GetParam();
  const auto m = make_rotation(spec, d, seed)->matrix();
  EXPECT_EQ(make_rotation(spec, d, seed)->matrix(), m);
  const std::string expected_spec = spec == "householder" ? "householder:" + std::to_string(d / 2) : spec;
  EXPECT_EQ(make_rotation(spec, d, seed)->spec(), expected_spec);
  if (spec == "identity") return;
  // Three other seeds: at d = 16 two seeds give the same 16 random signs with probability 2^-16, all three 2^-48.
  int differing = 0;
  for (uint64_t other = 1; other <= 3; ++other) {
    const auto m2 = make_rotation(spec, d, seed + other)->matrix();
    double diff = 0;
    for (size_t i = 0; i < m.size(); ++i) diff = std::max(diff, static_cast<double>(std::abs(m[i] - m2[i])));
    differing += diff > 1e-3;
  }
  EXPECT_GE(differing, 1) << "other seeds give the same rotation";
}

INSTANTIATE_TEST_SUITE_P(AllKinds, RotationProperties, testing::ValuesIn(all_cases()), case_name);

// ---- SRFT against the obvious O(d^2) double-precision DFT with the documented packing.

/// [Re Y_0, Re Y_{d/2}, sqrt2 Re Y_1, sqrt2 Im Y_1, ...] with Y = F diag(s) x, F the unitary DFT.
std::vector<double> srft_reference(const std::vector<float>& signs, const float* x, int d) {
  std::vector<double> c(d), s(d);  // cos and sin of 2 pi t/d: the DFT only needs (j k mod d)
  for (int t = 0; t < d; ++t) {
    c[t] = std::cos(2.0 * std::numbers::pi * t / d);
    s[t] = std::sin(2.0 * std::numbers::pi * t / d);
  }
  std::vector<std::complex<double>> big_y(d / 2 + 1);
  for (int k = 0; k <= d / 2; ++k) {
    std::complex<double> sum = 0;
    for (int j = 0; j < d; ++j) {
      const int t = static_cast<int>(static_cast<int64_t>(j) * k % d);
      sum += static_cast<double>(signs[j]) * x[j] * std::complex<double>(c[t], -s[t]);
    }
    big_y[k] = sum / std::sqrt(static_cast<double>(d));
  }
  std::vector<double> y(d);
  y[0] = big_y[0].real();
  y[1] = big_y[d / 2].real();
  for (int k = 1; k < d / 2; ++k) {
    y[2 * k] = std::sqrt(2.0) * big_y[k].real();
    y[2 * k + 1] = std::sqrt(2.0) * big_y[k].imag();
  }
  return y;
}

TEST(RotationSrft, MatchesDoubleDftReferenceWithDocumentedPacking) {
  KVQ_FRESH_SEED();
  // The supported head dimensions plus sizes whose d/2 has radices 3, 5, 7, 11, 13, 17, 23, 29, 31, ..., and
  // the largest ones: d/2 = 2039 (prime, generic radix) and 2047 = 23 * 89.
  for (int d : {2, 6, 10, 14, 16, 22, 26, 32, 34, 46, 48, 58, 62, 64, 74, 80, 94, 96, 112, 118, 128, 160, 192, 242,
                256, 320, 384, 512, 4078, 4094, 4096}) {
    SCOPED_TRACE("d = " + std::to_string(d));
    const auto rot = make_rotation("srft", d, seed);
    // Row 0 of R (the output Re Y_0) is s_j / sqrt(d): it reveals the signs.
    std::vector<float> row0(d, 0.0f);
    row0[0] = 1.0f;
    rot->apply_inverse(row0.data(), row0.data(), 1);
    std::vector<float> signs(d);
    for (int j = 0; j < d; ++j) {
      ASSERT_NEAR(std::abs(row0[j]), 1.0 / std::sqrt(d), 1e-6) << "j = " << j;
      signs[j] = row0[j] > 0 ? 1.0f : -1.0f;
    }
    const size_t n = d > 1024 ? 1 : 3;
    for (const auto& x : test_data(n, d, seed + static_cast<uint64_t>(d))) {
      std::vector<float> y(x.size()), back(x.size());
      rot->apply(x.data(), y.data(), n);
      rot->apply_inverse(y.data(), back.data(), n);
      for (size_t r = 0; r < n; ++r) {
        const float* xr = x.data() + r * d;
        const double nx = norm(xr, d);
        const auto ref = srft_reference(signs, xr, d);
        double err = 0, worst = 0;
        for (int i = 0; i < d; ++i) {
          const double e = y[r * d + i] - ref[i];
          err += e * e;
          worst = std::max(worst, std::abs(e));
        }
        EXPECT_LE(std::sqrt(err), kTol * nx) << "row " << r;
        EXPECT_LE(worst, kTol * nx) << "row " << r;
        EXPECT_LE(distance(back.data() + r * d, xr, d), kTol * nx) << "row " << r;
      }
    }
  }
}

TEST(RotationFft, ComplexFftMatchesDirectDft) {
  KVQ_FRESH_SEED();
  std::vector<int> sizes;
  for (int n = 1; n <= 40; ++n) sizes.push_back(n);
  for (int n : {49, 64, 97, 100, 121, 125, 128, 243, 1024, 2039}) sizes.push_back(n);
  Rng rng(seed);
  for (int n : sizes) {
    SCOPED_TRACE("n = " + std::to_string(n));
    const fft::ComplexFft plan(n);
    std::vector<fft::Complex> x(n), work(n);
    for (auto& v : x) v = {static_cast<float>(rng.normal()), static_cast<float>(rng.normal())};
    std::vector<std::complex<double>> roots(n);  // e^{-2 pi i t/n}
    for (int t = 0; t < n; ++t) roots[t] = std::polar(1.0, -2.0 * std::numbers::pi * t / n);
    for (bool backward : {false, true}) {
      std::vector<fft::Complex> data = x;
      const fft::Complex* got =
          backward ? plan.backward(data.data(), work.data()) : plan.forward(data.data(), work.data());
      double err = 0, scale = 0;
      for (int k = 0; k < n; ++k) {
        std::complex<double> ref = 0;
        for (int j = 0; j < n; ++j) {
          const auto w = roots[j * k % n];
          ref += std::complex<double>(x[j].re, x[j].im) * (backward ? std::conj(w) : w);
        }
        err += std::norm(std::complex<double>(got[k].re, got[k].im) - ref);
        scale += std::norm(ref);
      }
      EXPECT_LE(std::sqrt(err), kTol * std::sqrt(scale)) << (backward ? "backward" : "forward");
    }
  }
}

// ---- Haar: statistics that a fixed or structured orthogonal matrix fails.

TEST(RotationHaar, EntriesLookLikeGaussianWithVariance1OverD) {
  KVQ_FRESH_SEED();
  constexpr int d = 128;
  const auto m = make_rotation("haar", d, seed)->matrix();
  // mean = 1^T R 1 / d^2, and R 1 is uniform on the sphere of radius sqrt(d): standard deviation d^-1.5.
  double mean = 0;
  int inside = 0;
  for (float v : m) {
    mean += v;
    inside += std::abs(v) * std::sqrt(static_cast<double>(d)) < 1.0;
  }
  mean /= static_cast<double>(m.size());
  EXPECT_LE(std::abs(mean), 5.0 * std::pow(d, -1.5));
  // sqrt(d) R_ij is close to N(0, 1): P(|z| < 1) = 0.6827 (sampling sd 0.004 over d^2 entries; Beta vs normal 0.002).
  EXPECT_NEAR(static_cast<double>(inside) / static_cast<double>(m.size()), 0.6827, 0.02);
}

TEST(RotationHaar, FirstCoordinateHasVariance1OverDAndTraceHasMeanZero) {
  KVQ_FRESH_SEED();
  constexpr int d = 32;
  constexpr int samples = 800;
  const auto profile = key_like_profile(d, seed);
  double sum_z = 0, sum_z2 = 0, sum_trace = 0;
  for (int s = 0; s < samples; ++s) {
    const uint64_t seed_s = derive_seed(seed, static_cast<uint64_t>(s));
    const auto rot = make_rotation("haar", d, seed_s);
    // A key-like x (outlier channels): (R x)_0 / |x| has variance 1/d only if R's rows point everywhere.
    const auto x = sample_profile(profile, 1, derive_seed(seed_s, 1));
    std::vector<float> y(d);
    rot->apply(x.data(), y.data(), 1);
    const double z = std::sqrt(static_cast<double>(d)) * y[0] / norm(x.data(), d);
    sum_z += z;
    sum_z2 += z * z;
    const auto m = rot->matrix();
    for (int i = 0; i < d; ++i) sum_trace += m[static_cast<size_t>(i) * d + i];
  }
  // z^2 = d u^2 with u^2 ~ Beta(1/2, (d-1)/2): mean 1, variance 2(d-1)/(d+2) = 1.82; tolerances are 5 sigma.
  EXPECT_NEAR(sum_z / samples, 0.0, 5.0 / std::sqrt(samples));
  EXPECT_NEAR(sum_z2 / samples, 1.0, 5.0 * std::sqrt(1.82 / samples));
  // The trace of a Haar orthogonal matrix has mean 0 and variance 1; without the sign fix of QR it is biased.
  EXPECT_NEAR(sum_trace / samples, 0.0, 5.0 / std::sqrt(samples));
}

// ---- Householder.

TEST(RotationHouseholder, LearnedReflectorsMatchExplicitProductInOrder) {
  KVQ_FRESH_SEED();
  constexpr int d = 48, k = 5;
  Rng rng(seed);
  std::vector<std::vector<float>> v(k, std::vector<float>(d));
  for (auto& vi : v) {
    const double scale = 0.01 + 10.0 * rng.uniform();  // reflectors need not be unit vectors
    for (auto& e : vi) e = static_cast<float>(scale * rng.normal());
  }
  const auto rot = make_householder(d, v);
  EXPECT_EQ(rot->spec(), "householder:5");
  EXPECT_EQ(rot->kind(), RotationKind::householder);
  // M = H_k ... H_1 in double, built by left-multiplying H_1, then H_2, ...
  std::vector<double> m(d * d, 0.0);
  for (int i = 0; i < d; ++i) m[i * d + i] = 1.0;
  for (const auto& vi : v) {
    double vv = 0;
    for (float e : vi) vv += static_cast<double>(e) * e;
    for (int col = 0; col < d; ++col) {
      double vm = 0;
      for (int t = 0; t < d; ++t) vm += vi[t] * m[t * d + col];
      for (int t = 0; t < d; ++t) m[t * d + col] -= 2.0 * vi[t] * vm / vv;
    }
  }
  const auto got = rot->matrix();
  double worst = 0;
  for (int i = 0; i < d * d; ++i) worst = std::max(worst, std::abs(got[i] - m[i]));
  EXPECT_LE(worst, kTol);
}

TEST(RotationHouseholder, OneReflectorIsASymmetricReflection) {
  KVQ_FRESH_SEED();
  constexpr int d = 80;
  const auto m = make_rotation("householder:1", d, seed)->matrix();
  double trace = 0, asym = 0;
  for (int i = 0; i < d; ++i) {
    trace += m[i * d + i];
    for (int j = 0; j < d; ++j) asym = std::max(asym, static_cast<double>(std::abs(m[i * d + j] - m[j * d + i])));
  }
  EXPECT_NEAR(trace, d - 2.0, kTol * d);  // eigenvalues: -1 once, +1 (d - 1) times
  EXPECT_LE(asym, kTol);
}

// ---- Errors.

TEST(RotationErrors, UnsupportedDimensionsAndSpecsAreNamed) {
  expect_error([] { make_rotation("hadamard", 96, 1); }, {"power-of-two", "96"});
  expect_error([] { make_rotation("srft", 15, 1); }, {"srft", "even", "15"});
  expect_error([] { make_rotation("srft", 1, 1); }, {"srft", "even", "1"});
  expect_error([] { make_rotation("householder:0", 96, 1); }, {"reflector count 0", "[1, 96]"});
  expect_error([] { make_rotation("householder:97", 96, 1); }, {"reflector count 97", "[1, 96]"});
  expect_error([] { make_rotation("householder:x", 96, 1); }, {"householder:x", "integer"});
  expect_error([] { make_rotation("fourier", 64, 1); }, {"unknown rotation 'fourier'"});
  expect_error([] { make_rotation("srft:2", 64, 1); }, {"takes no argument"});
}

TEST(RotationErrors, BadLearnedReflectorsAreNamed) {
  constexpr int d = 48;
  std::vector<std::vector<float>> v(3, std::vector<float>(d, 1.0f));
  v[1].assign(d, 0.0f);
  expect_error([&] { make_householder(d, v); }, {"reflector 1", "zero vector"});
  v[1].assign(d - 1, 1.0f);
  expect_error([&] { make_householder(d, v); }, {"reflector 1", "47 entries", "48"});
  v[1].assign(d, 1.0f);
  v[2][5] = std::numeric_limits<float>::quiet_NaN();
  expect_error([&] { make_householder(d, v); }, {"reflector 2", "non-finite"});
  v[2][5] = std::numeric_limits<float>::infinity();
  expect_error([&] { make_householder(d, v); }, {"reflector 2", "non-finite"});
  expect_error([&] { make_householder(d, std::span<const std::vector<float>>{}); }, {"0 reflectors"});
}

}  // namespace
}  // namespace kvq

// int8 / int4 and kivi against plain double-precision reference quantizers written out here: the stored scales and
// minimums, the codes read straight from the documented byte layouts, the per-element decode bounds, bits per
// element, lambda calibration, what the rotation buys on outlier channels, and the errors for bad specs.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "codec/block_layout.hpp"
#include "core/half.hpp"
#include "kvq/codec.hpp"
#include "kvq/detail/random.hpp"
#include "kvq/detail/synthetic.hpp"
#include "kvq/error.hpp"
#include "test_seed.hpp"

namespace kvq {
namespace {

constexpr int kT = 64;
// Codes whose reference value lies this close to an exact .5 tie may round either way (the codec works in fp32).
constexpr double kTieWindow = 1e-4;

struct CodeTally {
  size_t compared = 0, near_ties = 0;
};

double read_f16(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return f16_to_f32(h);
}

bool near_tie(double v) {
  const double frac = std::fabs(v) - std::floor(std::fabs(v));
  return std::fabs(frac - 0.5) < kTieWindow;
}

// How far outward rounding to fp16 may move a value: one fp16 step, at most 2^-10 of a normal value, 2^-24 below.
double f16_step(double v) { return std::ldexp(std::fabs(v), -10) + std::ldexp(1.0, -24); }

std::vector<float> key_like(int d, size_t n, uint64_t seed) {
  return sample_profile(key_like_profile(d, seed), n, derive_seed(seed, 1));
}

double relative_error(const std::vector<float>& x, const std::vector<float>& xhat) {
  double err = 0, ref = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    err += (static_cast<double>(x[i]) - xhat[i]) * (static_cast<double>(x[i]) - xhat[i]);
    ref += static_cast<double>(x[i]) * x[i];
  }
  return err / ref;
}

std::vector<uint8_t> encode(const Codec& codec, const std::vector<float>& x, int n) {
  std::vector<uint8_t> block(codec.block_bytes());
  codec.encode(x.data(), n, block.data());
  return block;
}

std::vector<float> decode(const Codec& codec, const std::vector<uint8_t>& block, int n) {
  std::vector<float> x(static_cast<size_t>(n) * codec.dim());
  codec.decode(block.data(), n, x.data());
  return x;
}

std::string error_of(const std::string& spec, int d, Role role = Role::key) {
  try {
    make_codec(spec, CodecParams{d, kT, 1, role});
  } catch (const Error& e) {
    return e.what();
  }
  return "no error";
}

// ---- int8 / int4 ---------------------------------------------------------------------------------------------

struct IntShape {
  int bits, G;
  long qmax() const { return bits == 8 ? 127 : 7; }
  bool key;
  layout::IntGroup layout(int d) const {
    return {static_cast<size_t>(d), kT, static_cast<size_t>(bits), static_cast<size_t>(G), key};
  }
};

IntShape int_shape(const Codec& codec) {
  return {codec.spec().name == "int8" ? 8 : 4, codec.spec().arg(0, 32), codec.role() == Role::key};
}

// Code of token t, channel c, read as the layout documents: a two's-complement byte or nibble in the lane of its key
// or value tile.
int stored_int_code(const std::vector<uint8_t>& block, const IntShape& shape, int d, int t, int c) {
  const layout::IntGroup l = shape.layout(d);
  const size_t ut = static_cast<size_t>(t), uc = static_cast<size_t>(c);
  if (shape.bits == 8) return static_cast<int8_t>(block[l.code_byte(ut, uc)]);
  const int nibble = (block[l.code_byte(ut, uc)] >> l.code_shift(ut, uc)) & 15;
  return nibble < 8 ? nibble : nibble - 16;
}

// Checks an encoded block of n tokens against the reference: x'' = (R x)_c / lambda_c, scale s = the stored fp16
// within one fp16 step of max|x''| / qmax and with max|x''| / s <= qmax + 0.5, code = round(x'' / s) clamped to
// +-qmax, decode = lambda_c s q within lambda_c s / 2 of x'.
void check_int_block(const Codec& codec, const std::vector<float>& x, int n, const std::vector<double>& lambda,
                     const std::vector<uint8_t>& block, CodeTally& tally, std::vector<int>* codes = nullptr) {
  const int d = codec.dim();
  const IntShape shape = int_shape(codec);
  const layout::IntGroup l = shape.layout(d);
  ASSERT_EQ(codec.block_bytes(), l.block_bytes());
  std::vector<float> xr(static_cast<size_t>(n) * d), y(xr.size());
  codec.to_space(x.data(), n, xr.data());
  codec.decode_space(block.data(), n, y.data());
  for (int t = 0; t < n; ++t)
    for (int g = 0; g < d / shape.G; ++g) {
      double amax = 0;
      for (int c = g * shape.G; c < (g + 1) * shape.G; ++c)
        amax = std::max(amax, std::fabs(xr[static_cast<size_t>(t) * d + c] / lambda[c]));
      const double s = read_f16(block.data() + l.scale_byte(static_cast<size_t>(t), static_cast<size_t>(g)));
      const double exact = amax / shape.qmax();
      // The codec forms x'' in fp32 (and its lambda is fp32): the reference may sit a few fp32 ulps off.
      ASSERT_LE(std::fabs(s - exact), f16_step(exact) + 1e-6 * exact) << "token " << t << " group " << g;
      if (amax > 0) {
        ASSERT_GT(s, 0.0) << "token " << t << " group " << g;
        ASSERT_LE(amax / s, (shape.qmax() + 0.5) * (1 + 1e-6)) << "token " << t << " group " << g
                                                                << ": clamping would cost more than half a step";
      }
      for (int c = g * shape.G; c < (g + 1) * shape.G; ++c) {
        const size_t i = static_cast<size_t>(t) * d + c;
        const double ref = s > 0 ? xr[i] / lambda[c] / s : 0.0;
        const int code = stored_int_code(block, shape, d, t, c);
        const long ref_code = std::clamp(std::lround(ref), -shape.qmax(), shape.qmax());
        ++tally.compared;
        if (near_tie(ref)) {
          ++tally.near_ties;
          ASSERT_LE(std::fabs(code - ref), 0.5 + kTieWindow);
        } else {
          ASSERT_EQ(code, ref_code) << "token " << t << " channel " << c << " reference " << ref;
        }
        const double step = lambda[c] * s;
        ASSERT_NEAR(y[i], step * code, 1e-6 * std::fabs(step * code)) << "decode is lambda * s * q";
        ASSERT_LE(std::fabs(xr[i] - y[i]), step / 2 * (1 + 1e-5) + 1e-6 * std::fabs(xr[i]))
            << "token " << t << " channel " << c;
        if (codes) codes->push_back(code);
      }
    }
}

TEST(IntGroupCodec, CodesMatchReferenceAndStayWithinHalfAStep) {
  KVQ_FRESH_SEED();
  for (const char* spec : {"int4", "int4:16", "int4:64", "int8", "int8:16", "int8:64"})
    for (int d : {128, 64})
      for (bool outliers : {false, true}) {
        const Role role = outliers ? Role::key : Role::value;  // the two int4 layouts
        SCOPED_TRACE(std::string(spec) + " d=" + std::to_string(d) + (outliers ? " key-like key" : " gaussian value"));
        const auto codec = make_codec(spec, CodecParams{d, kT, seed, role});
        const auto x = outliers ? key_like(d, kT, seed) : gaussian_vectors(kT, d, seed);
        CodeTally tally;
        for (int n : {kT, 17, 1}) ASSERT_NO_FATAL_FAILURE(check_int_block(*codec, x, n, std::vector<double>(d, 1.0),
                                                                          encode(*codec, x, n), tally));
        EXPECT_LT(tally.near_ties, tally.compared / 100) << "ties must stay rare or the comparison means nothing";
      }
}

TEST(IntGroupCodec, BitsPerElementAsDocumented) {
  const std::pair<const char*, double> cases[] = {{"int4", 4.5},  {"int4:16", 5.0}, {"int4:64", 4.25},
                                                  {"int8", 8.5},  {"int8:16", 9.0}, {"int8:64", 8.25}};
  for (const auto& [spec, bits] : cases) {
    const auto codec = make_codec(spec, CodecParams{128, kT, 0, Role::key});
    EXPECT_DOUBLE_EQ(codec->bits_per_element(), bits) << spec;
    EXPECT_EQ(codec->space_dim(), 128) << spec;
  }
}

TEST(IntGroupCodec, ZeroGroupsDecodeToZero) {
  KVQ_FRESH_SEED();
  const int d = 128;
  for (const char* spec : {"int4,rot=identity", "int8:16,rot=identity", "int4"}) {
    SCOPED_TRACE(spec);
    const auto codec = make_codec(spec, CodecParams{d, kT, seed, Role::key});
    auto x = gaussian_vectors(3, d, seed);
    std::fill(x.begin(), x.begin() + d, 0.0f);          // token 0: all zero
    std::fill(x.begin() + d, x.begin() + d + 64, 0.0f);  // token 1: channels 0..63 zero
    const auto block = encode(*codec, x, 3);
    const auto xhat = decode(*codec, block, 3);
    for (int c = 0; c < d; ++c) EXPECT_EQ(xhat[c], 0.0f) << "token 0 channel " << c;
    if (codec->spec().option("rot", "") == "identity") {
      for (int c = 0; c < 64; ++c) EXPECT_EQ(xhat[d + c], 0.0f) << "token 1 channel " << c;
    }
    for (float v : xhat) EXPECT_TRUE(std::isfinite(v));
  }
}

TEST(IntGroupCodec, TinyValuesKeepTheBoundAndHugeOnesAreRejected) {
  KVQ_FRESH_SEED();
  const int d = 128;
  for (const char* spec : {"int4", "int8"}) {
    SCOPED_TRACE(spec);
    const auto codec = make_codec(spec, CodecParams{d, kT, seed, Role::key});
    for (float tiny : {1e-6f, 1e-8f}) {  // scales among the fp16 subnormals, or below the smallest one
      auto x = gaussian_vectors(kT, d, seed);
      for (auto& v : x) v *= tiny;
      CodeTally tally;
      ASSERT_NO_FATAL_FAILURE(
          check_int_block(*codec, x, kT, std::vector<double>(d, 1.0), encode(*codec, x, kT), tally));
    }
    auto x = gaussian_vectors(kT, d, seed);
    for (auto& v : x) v *= 1e7f;  // |x'| up to ~4e7, beyond 65504 * 127
    try {
      encode(*codec, x, kT);
      FAIL() << "values beyond the fp16 scale range must be rejected";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("fp16 scale range"), std::string::npos) << e.what();
    }
  }
}

// Reference lambda: RMS of each rotated channel over the examples, floored at 1e-3 of the largest, divided by the
// geometric mean.
std::vector<double> reference_lambda(const Codec& codec, const std::vector<float>& train, size_t n) {
  const int d = codec.dim();
  std::vector<float> xr(train.size());
  codec.to_space(train.data(), static_cast<int>(n), xr.data());
  std::vector<double> rms(d, 0.0);
  for (size_t i = 0; i < xr.size(); ++i) rms[i % d] += static_cast<double>(xr[i]) * xr[i] / static_cast<double>(n);
  double largest = 0, mean_log = 0;
  for (auto& r : rms) largest = std::max(largest, r = std::sqrt(r));
  for (auto& r : rms) mean_log += std::log(r = std::max(r, 1e-3 * largest)) / d;
  for (auto& r : rms) r /= std::exp(mean_log);
  return rms;
}

TEST(IntGroupCodec, TrainedLambdaChangesCodesAndKeepsTheBound) {
  KVQ_FRESH_SEED();
  const int d = 128;
  constexpr size_t kTrain = 2048;
  const ChannelProfile profile = key_like_profile(d, seed);
  const auto train = sample_profile(profile, kTrain, derive_seed(seed, 2));
  const auto x = sample_profile(profile, kT, derive_seed(seed, 3));
  for (const char* spec : {"int4,rot=identity", "int8:16,rot=identity", "int4", "int4:16"}) {
    SCOPED_TRACE(spec);
    const auto plain = make_codec(spec, CodecParams{d, kT, seed, Role::key});
    const auto trained = make_codec(spec, CodecParams{d, kT, seed, Role::key});
    EXPECT_FALSE(trained->needs_training());
    trained->train(train.data(), kTrain);
    const auto lambda = reference_lambda(*trained, train, kTrain);
    CodeTally tally;
    std::vector<int> plain_codes, trained_codes;
    const auto plain_block = encode(*plain, x, kT), trained_block = encode(*trained, x, kT);
    ASSERT_NO_FATAL_FAILURE(
        check_int_block(*plain, x, kT, std::vector<double>(d, 1.0), plain_block, tally, &plain_codes));
    ASSERT_NO_FATAL_FAILURE(check_int_block(*trained, x, kT, lambda, trained_block, tally, &trained_codes));
    EXPECT_LT(tally.near_ties, tally.compared / 100);
    size_t changed = 0;
    for (size_t i = 0; i < plain_codes.size(); ++i) changed += plain_codes[i] != trained_codes[i];
    EXPECT_GT(changed, plain_codes.size() / 50) << "calibrated lambda must change the codes";
    // Without a rotation an outlier channel sets the scale of its whole group and the ordinary channels there round
    // to zero; lambda gives each channel its own step. (With a rotation the channels are already alike.)
    if (plain->spec().option("rot", "") == "identity") {
      const auto plain_hat = decode(*plain, plain_block, kT), trained_hat = decode(*trained, trained_block, kT);
      double plain_err = 0, trained_err = 0;
      for (size_t i = 0; i < x.size(); ++i) {
        if (std::count(profile.outliers.begin(), profile.outliers.end(), static_cast<int>(i % d))) continue;
        plain_err += (x[i] - plain_hat[i]) * static_cast<double>(x[i] - plain_hat[i]);
        trained_err += (x[i] - trained_hat[i]) * static_cast<double>(x[i] - trained_hat[i]);
      }
      EXPECT_LT(trained_err, 0.2 * plain_err) << "error on the ordinary channels";
    }
  }
  // Training on zeros has nothing to calibrate: lambda stays 1.
  const auto codec = make_codec("int4", CodecParams{d, kT, seed, Role::key});
  const std::vector<float> zeros(static_cast<size_t>(16) * d, 0.0f);
  codec->train(zeros.data(), 16);
  CodeTally tally;
  ASSERT_NO_FATAL_FAILURE(check_int_block(*codec, x, kT, std::vector<double>(d, 1.0), encode(*codec, x, kT), tally));
}

TEST(IntGroupCodec, StateCarriesLambda) {
  KVQ_FRESH_SEED();
  const int d = 64;
  const auto train = key_like(d, 512, seed);
  const auto x = key_like(d, kT, derive_seed(seed, 7));
  const CodecParams params{d, kT, seed, Role::key};
  const auto trained = make_codec("int4,rot=identity", params);
  EXPECT_TRUE(trained->state().empty()) << "no state before calibration";
  trained->train(train.data(), 512);
  const auto state = trained->state();
  EXPECT_EQ(state.size(), d * sizeof(float));
  const auto restored = make_codec("int4,rot=identity", params);
  restored->load_state(state);
  EXPECT_EQ(encode(*restored, x, kT), encode(*trained, x, kT));
  restored->load_state({});  // back to lambda = 1
  EXPECT_EQ(encode(*restored, x, kT), encode(*make_codec("int4,rot=identity", params), x, kT));
  EXPECT_THROW(restored->load_state(std::vector<uint8_t>(state.size() - 4)), Error);
  std::vector<uint8_t> bad = state;
  const float zero = 0;
  std::memcpy(bad.data() + 8, &zero, 4);
  EXPECT_THROW(restored->load_state(bad), Error);
}

// Why the paper rotates: without a rotation an outlier channel sets the scale of its whole group and the other
// channels there round to zero. Averaged over several key-like profiles (4 outlier channels of 10-50x each) so that
// one profile with mild outliers does not decide.
TEST(IntGroupCodec, RotationTamesOutlierChannels) {
  KVQ_FRESH_SEED();
  const int d = 128, n_profiles = 16;
  double err[2] = {0, 0};  // mean relative error: unrotated, rotated
  for (int p = 0; p < n_profiles; ++p) {
    const auto x = key_like(d, kT, derive_seed(seed, p));
    for (int rotated : {0, 1}) {
      const auto codec = make_codec(rotated ? "int4,rot=hadamard" : "int4,rot=identity", CodecParams{d, kT, seed});
      err[rotated] += relative_error(x, decode(*codec, encode(*codec, x, kT), kT)) / n_profiles;
    }
  }
  EXPECT_LT(err[1], 0.6 * err[0]) << "relative error rotated " << err[1] << ", unrotated " << err[0];
}

TEST(IntGroupSpecs, BadSpecsGiveClearErrors) {
  const auto expect_error = [](const std::string& spec, int d, const std::string& needle) {
    const std::string what = error_of(spec, d);
    EXPECT_NE(what.find(needle), std::string::npos) << spec << " at d=" << d << ": " << what;
  };
  expect_error("int4:24", 128, "group size 24 unsupported");
  expect_error("int8:0", 128, "group size 0 unsupported");
  expect_error("int4:64", 96, "group size 64 does not divide head dimension 96");
  expect_error("int3", 128, "unknown codec 'int3'");
  expect_error("int4:16/2", 128, "at most 1 argument");
  expect_error("int4,g=16", 128, "unknown option 'g'");
  expect_error("int4,rot=nosuch", 128, "unknown rotation 'nosuch'");
  EXPECT_EQ(error_of("int4:64", 128), "no error");
  EXPECT_EQ(error_of("int8:16,rot=identity", 64), "no error");
}

// ---- kivi ------------------------------------------------------------------------------------------------------

struct KiviShape {
  int bits, G;
  bool key;
  int levels() const { return (1 << bits) - 1; }
};

KiviShape kivi_shape(const Codec& codec) {
  return {codec.spec().args.at(0), std::stoi(codec.spec().option("g", "32")), codec.role() == Role::key};
}

// Code of token t, channel c: b-bit unsigned codes in the lanes of 64-byte tiles (b = 2, 4 never straddle a byte;
// b = 3 as a 2-bit and a 1-bit plane).
int stored_kivi_code(const std::vector<uint8_t>& block, const layout::Kivi& l, int t, int c) {
  const auto ut = static_cast<size_t>(t), uc = static_cast<size_t>(c);
  if (l.bits == 3) {
    const layout::IntGroup lo{l.d, l.T, 2, l.G, l.key}, hi{l.d, l.T, 1, l.G, l.key};
    const size_t hi_at = l.code_tokens() * l.d / 4;
    return ((block[lo.code_byte(ut, uc)] >> lo.code_shift(ut, uc)) & 3) |
           ((block[hi_at + hi.code_byte(ut, uc)] >> hi.code_shift(ut, uc)) & 1) << 2;
  }
  return (block[l.code_byte(ut, uc)] >> l.code_shift(ut, uc)) & ((1 << l.bits) - 1);
}

// Checks an encoded block against the reference: each range [lo, hi] (per channel over the n tokens for keys, per
// token and group for values) stored as m within one fp16 step below lo and s within one fp16 step above
// (hi - m) / (2^b - 1); code = round((x - m) / s); decode m + s q within s / 2 of x.
void check_kivi_block(const Codec& codec, const std::vector<float>& x, int n, const std::vector<uint8_t>& block,
                      CodeTally& tally) {
  const int d = codec.dim();
  const KiviShape shape = kivi_shape(codec);
  const layout::Kivi l{static_cast<size_t>(d), kT, static_cast<size_t>(shape.bits), static_cast<size_t>(shape.G),
                       shape.key};
  ASSERT_EQ(codec.block_bytes(), l.block_bytes());
  const auto y = decode(codec, block, n);
  // The elements each range covers, as (token, channel) lists.
  std::vector<std::vector<std::pair<int, int>>> ranges;
  if (shape.key) {
    for (int c = 0; c < d; ++c) {
      ranges.emplace_back();
      for (int t = 0; t < n; ++t) ranges.back().emplace_back(t, c);
    }
  } else {
    for (int t = 0; t < n; ++t)
      for (int g = 0; g < d / shape.G; ++g) {
        ranges.emplace_back();
        for (int c = g * shape.G; c < (g + 1) * shape.G; ++c) ranges.back().emplace_back(t, c);
      }
  }
  for (size_t p = 0; p < ranges.size(); ++p) {
    double lo = INFINITY, hi = -INFINITY;
    for (auto [t, c] : ranges[p]) {
      lo = std::min<double>(lo, x[static_cast<size_t>(t) * d + c]);
      hi = std::max<double>(hi, x[static_cast<size_t>(t) * d + c]);
    }
    const auto [t0, c0] = ranges[p].front();
    const size_t param = l.param(static_cast<size_t>(t0), static_cast<size_t>(c0));
    const double m = read_f16(block.data() + l.mins_offset() + 2 * param);
    const double s = read_f16(block.data() + l.scales_offset() + 2 * param);
    ASSERT_LE(m, lo) << "range " << p << ": the fp16 minimum must be rounded down";
    ASSERT_LE(lo - m, f16_step(lo)) << "range " << p;
    const double exact = (hi - m) / shape.levels();
    ASSERT_GE(s, exact) << "range " << p << ": the fp16 scale must be rounded up";
    ASSERT_LE(s, exact + f16_step(exact)) << "range " << p;
    for (auto [t, c] : ranges[p]) {
      const size_t i = static_cast<size_t>(t) * d + c;
      const double ref = s > 0 ? (x[i] - m) / s : 0.0;
      const int code = stored_kivi_code(block, l, t, c);
      ASSERT_LE(ref, shape.levels() + 1e-6) << "no code may need clamping";
      ++tally.compared;
      if (near_tie(ref)) {
        ++tally.near_ties;
        ASSERT_LE(std::fabs(code - ref), 0.5 + kTieWindow);
      } else {
        ASSERT_EQ(code, std::lround(ref)) << "token " << t << " channel " << c << " reference " << ref;
      }
      ASSERT_LE(std::fabs(x[i] - y[i]), s / 2 * (1 + 1e-5) + 1e-6 * (std::fabs(x[i]) + std::fabs(m)))
          << "token " << t << " channel " << c;
    }
  }
}

TEST(KiviCodec, CodesMatchReferenceAndStayWithinHalfAStep) {
  KVQ_FRESH_SEED();
  for (const char* spec : {"kivi:2", "kivi:3", "kivi:4", "kivi:2,g=64", "kivi:3,g=16", "kivi:4,g=16"})
    for (Role role : {Role::key, Role::value})
      for (int d : {128, 96})
        for (bool outliers : {false, true}) {
          if (d % std::stoi(CodecSpec::parse(spec).option("g", "32")) != 0) continue;
          SCOPED_TRACE(std::string(spec) + (role == Role::key ? " key" : " value") + " d=" + std::to_string(d) +
                       (outliers ? " key-like" : " gaussian"));
          const auto codec = make_codec(spec, CodecParams{d, kT, seed, role});
          const auto x = outliers ? key_like(d, kT, seed) : gaussian_vectors(kT, d, seed);
          CodeTally tally;
          for (int n : {kT, 17, 1})
            ASSERT_NO_FATAL_FAILURE(check_kivi_block(*codec, x, n, encode(*codec, x, n), tally));
          EXPECT_LT(tally.near_ties, tally.compared / 100);
        }
}

TEST(KiviCodec, BitsPerElementAsDocumented) {
  const std::tuple<const char*, Role, double> cases[] = {
      {"kivi:2", Role::key, 2.5},   {"kivi:4", Role::key, 4.5},         {"kivi:2", Role::value, 3.0},
      {"kivi:4", Role::value, 5.0}, {"kivi:2,g=64", Role::value, 2.5},  {"kivi:2,g=128", Role::value, 2.25},
      {"kivi:2,g=64", Role::key, 2.5},  {"kivi:3", Role::key, 3.5},        {"kivi:3", Role::value, 4.0},
      {"kivi:3,g=64", Role::value, 3.5}};
  for (const auto& [spec, role, bits] : cases) {
    const auto codec = make_codec(spec, CodecParams{128, kT, 0, role});
    EXPECT_DOUBLE_EQ(codec->bits_per_element(), bits) << spec << (role == Role::key ? " key" : " value");
  }
}

TEST(KiviCodec, PartialKeyBlocksTakeRangesFromTheirTokensOnly) {
  KVQ_FRESH_SEED();
  const int d = 128, n = 17;
  auto x = gaussian_vectors(n, d, seed);
  for (auto& v : x) v = 5.0f + 0.25f * v;  // all positive: padding zeros inside the ranges would show
  const auto codec = make_codec("kivi:2", CodecParams{d, kT, seed, Role::key});
  const auto block = encode(*codec, x, n);
  const layout::Kivi l{static_cast<size_t>(d), kT, 2, 32, true};
  for (int c = 0; c < d; ++c) EXPECT_GT(read_f16(block.data() + l.mins_offset() + 2 * c), 3.0) << "channel " << c;
  CodeTally tally;
  ASSERT_NO_FATAL_FAILURE(check_kivi_block(*codec, x, n, block, tally));
}

TEST(KiviCodec, ConstantAndZeroRanges) {
  KVQ_FRESH_SEED();
  const int d = 64;
  const layout::Kivi l{static_cast<size_t>(d), kT, 2, 32, true};
  auto keys = gaussian_vectors(kT, d, seed);
  for (int t = 0; t < kT; ++t) {
    keys[static_cast<size_t>(t) * d + 0] = 0.1f;  // constant channel, not an fp16 value
    keys[static_cast<size_t>(t) * d + 1] = 0.5f;  // constant channel, an exact fp16 value
  }
  const auto key_codec = make_codec("kivi:2", CodecParams{d, kT, seed, Role::key});
  const auto key_block = encode(*key_codec, keys, kT);
  CodeTally tally;
  ASSERT_NO_FATAL_FAILURE(check_kivi_block(*key_codec, keys, kT, key_block, tally));
  EXPECT_EQ(read_f16(key_block.data() + l.scales_offset() + 2), 0.0) << "an exact constant needs no scale";
  const auto key_hat = decode(*key_codec, key_block, kT);
  for (int t = 0; t < kT; ++t) EXPECT_EQ(key_hat[static_cast<size_t>(t) * d + 1], 0.5f);

  auto values = gaussian_vectors(kT, d, seed);
  std::fill(values.begin(), values.begin() + d, 0.0f);  // token 0: a zero vector
  const auto value_codec = make_codec("kivi:2", CodecParams{d, kT, seed, Role::value});
  const auto value_block = encode(*value_codec, values, kT);
  ASSERT_NO_FATAL_FAILURE(check_kivi_block(*value_codec, values, kT, value_block, tally));
  const auto value_hat = decode(*value_codec, value_block, kT);
  for (int c = 0; c < d; ++c) EXPECT_EQ(value_hat[c], 0.0f) << "a zero value group decodes to zeros";
}

TEST(KiviCodec, RangesBeyondFp16AreRejected) {
  KVQ_FRESH_SEED();
  for (Role role : {Role::key, Role::value}) {
    const auto codec = make_codec("kivi:4", CodecParams{64, kT, seed, role});
    auto x = gaussian_vectors(kT, 64, seed);
    x[3 * 64 + 5] = -1e6f;
    try {
      encode(*codec, x, kT);
      FAIL() << "a minimum below -65504 must be rejected";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(role == Role::key ? "key channel 5" : "value token 3"), std::string::npos)
          << e.what();
    }
  }
}

TEST(KiviSpecs, BadSpecsGiveClearErrors) {
  const auto expect_error = [](const std::string& spec, int d, const std::string& needle) {
    for (Role role : {Role::key, Role::value}) {
      const std::string what = error_of(spec, d, role);
      EXPECT_NE(what.find(needle), std::string::npos) << spec << " at d=" << d << ": " << what;
    }
  };
  expect_error("kivi:5", 128, "5 bits unsupported");
  expect_error("kivi:1", 128, "1 bits unsupported");
  expect_error("kivi", 128, "needs a bit width");
  expect_error("kivi:2,g=7", 128, "value group size 7 unsupported");
  expect_error("kivi:2,g=x", 128, "is not an integer");
  expect_error("kivi:2,g=128", 96, "does not divide head dimension 96");
  expect_error("kivi:2,rot=hadamard", 128, "unknown option 'rot'");
  expect_error("kivi:2/2", 128, "at most 1 argument");
  EXPECT_NE(error_of("kivi:3,g=16", 80, Role::key).find("multiple of 32"), std::string::npos);
  EXPECT_NO_THROW(make_codec("kivi:3,g=16", CodecParams{80, 64, 0, Role::value}));
}

// ---- the fused kernels of both families on partial blocks (the contract test covers full ones) ----------------

TEST(IntGroupAndKiviKernels, FusedScoresAndAccumulateMatchTheDecodedBlock) {
  KVQ_FRESH_SEED();
  constexpr int kQ = 3, kN = 23;
  for (const char* spec : {"int4", "int4:16", "int8:64", "kivi:2", "kivi:4,g=16"})
    for (Role role : {Role::key, Role::value}) {
      SCOPED_TRACE(std::string(spec) + (role == Role::key ? " key" : " value"));
      const int d = 128;
      const auto codec = make_codec(spec, CodecParams{d, kT, seed, role});
      const auto x = key_like(d, kN, seed);
      const auto block = encode(*codec, x, kN);
      const auto xhat = decode(*codec, block, kN);
      const auto q = gaussian_vectors(kQ, d, derive_seed(seed, 5));
      std::vector<float> s(static_cast<size_t>(kQ) * kT, NAN);
      codec->prepare(q.data(), kQ)->scores(block.data(), kN, s.data());
      std::vector<float> w(static_cast<size_t>(kQ) * kT, NAN);  // weights past kN must not be read
      Rng rng(derive_seed(seed, 6));
      for (int i = 0; i < kQ; ++i)
        for (int t = 0; t < kN; ++t) w[static_cast<size_t>(i) * kT + t] = static_cast<float>(rng.uniform());
      std::vector<float> acc(static_cast<size_t>(kQ) * codec->space_dim(), 1.0f), out(static_cast<size_t>(kQ) * d);
      codec->accumulate(w.data(), kQ, block.data(), kN, acc.data());
      for (auto& a : acc) a -= 1.0f;  // accumulate adds to what acc holds
      codec->from_space(acc.data(), kQ, out.data());
      for (int i = 0; i < kQ; ++i) {
        double wnorm = 0;
        for (int t = 0; t < kN; ++t) {
          double dot = 0, kk = 0, qq = 0;
          for (int c = 0; c < d; ++c) {
            const double kc = xhat[static_cast<size_t>(t) * d + c], qc = q[static_cast<size_t>(i) * d + c];
            dot += qc * kc, kk += kc * kc, qq += qc * qc;
          }
          ASSERT_NEAR(s[static_cast<size_t>(i) * kT + t], dot, 1e-5 * std::sqrt(qq * kk))
              << "query " << i << " token " << t;
          wnorm += w[static_cast<size_t>(i) * kT + t] * std::sqrt(kk);
        }
        for (int c = 0; c < d; ++c) {
          double ref = 0;
          for (int t = 0; t < kN; ++t) ref += w[static_cast<size_t>(i) * kT + t] * xhat[static_cast<size_t>(t) * d + c];
          ASSERT_NEAR(out[static_cast<size_t>(i) * d + c], ref, 1e-5 * wnorm + 1e-5)
              << "query " << i << " channel " << c;
        }
      }
    }
}

}  // namespace
}  // namespace kvq

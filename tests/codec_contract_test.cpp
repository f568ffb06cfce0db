// The contract every registered codec keeps, checked for each spec of codec_test_specs() on Gaussian and on
// key-like data with outlier channels, as keys and as values, at several head dimensions.
#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "codec_test_specs.hpp"
#include "kvq/codec.hpp"
#include "kvq/detail/random.hpp"
#include "kvq/detail/synthetic.hpp"
#include "kvq/error.hpp"
#include "test_seed.hpp"

namespace kvq {
namespace {

struct Case {
  std::string spec;
  int dim;
  Role role;
};

void PrintTo(const Case& c, std::ostream* os) {
  *os << c.spec << " d=" << c.dim << (c.role == Role::key ? " key" : " value");
}

std::string case_name(const testing::TestParamInfo<Case>& info) {
  std::string s = info.param.spec + "_d" + std::to_string(info.param.dim) +
                  (info.param.role == Role::key ? "_key" : "_value");
  for (char& c : s)
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  return s;
}

std::vector<Case> all_cases() {
  std::vector<Case> cases;
  for (const auto& spec : test::codec_test_specs())
    for (int dim : {64, 128, 96})
      for (Role role : {Role::key, Role::value}) cases.push_back({spec, dim, role});
  return cases;
}

// The sweep covers the registry: a codec added to it without test specs fails here.
TEST(CodecTestSpecs, CoverEveryRegisteredCodec) {
  for (const std::string& name : codec_names()) {
    bool listed = false;
    for (const std::string& spec : test::codec_test_specs()) listed = listed || CodecSpec::parse(spec).name == name;
    EXPECT_TRUE(listed) << name << " has no spec in tests/codec_test_specs.hpp";
  }
}

class CodecContract : public testing::TestWithParam<Case> {
 protected:
  static constexpr int kT = 64;
  std::unique_ptr<Codec> build(uint64_t seed, const ChannelProfile& profile) const {
    const Case& c = GetParam();
    auto codec = make_codec(c.spec, CodecParams{c.dim, kT, seed, c.role});
    if (codec->needs_training()) {
      const auto train = sample_profile(profile, 4096, seed + 1);
      codec->train(train.data(), 4096);
    }
    return codec;
  }
};

double dot(const float* a, const float* b, int d) {
  double s = 0;
  for (int j = 0; j < d; ++j) s += static_cast<double>(a[j]) * b[j];
  return s;
}

TEST_P(CodecContract, SizesAreConsistent) {
  KVQ_FRESH_SEED();
  const auto codec = build(seed, key_like_profile(GetParam().dim, seed));
  EXPECT_GT(codec->block_bytes(), 0u);
  EXPECT_DOUBLE_EQ(codec->bits_per_element(), 8.0 * codec->block_bytes() / (kT * GetParam().dim));
  EXPECT_GE(codec->space_dim(), 1);
  EXPECT_EQ(CodecSpec::parse(codec->spec().str()), codec->spec());
}

TEST_P(CodecContract, DeterministicAndScoresMatchDecodedKeys) {
  KVQ_FRESH_SEED();
  const int d = GetParam().dim;
  for (bool outliers : {false, true}) {
    SCOPED_TRACE(outliers ? "key-like data with outliers" : "gaussian data");
    const ChannelProfile profile =
        outliers ? key_like_profile(d, seed) : ChannelProfile{std::vector<float>(d, 0.f), std::vector<float>(d, 1.f), {}};
    const auto codec = build(seed, profile);
    const auto x = sample_profile(profile, kT, seed + 2);
    std::vector<uint8_t> a(codec->block_bytes(), 0xAB), b(codec->block_bytes(), 0x11);
    codec->encode(x.data(), kT, a.data());
    codec->encode(x.data(), kT, b.data());
    ASSERT_EQ(a, b) << "encode must be deterministic and write every byte of the block";
    std::vector<float> x1(static_cast<size_t>(kT) * d), x2(x1.size());
    codec->decode(a.data(), kT, x1.data());
    codec->decode(a.data(), kT, x2.data());
    ASSERT_EQ(x1, x2);
    for (float v : x1) ASSERT_TRUE(std::isfinite(v));

    // Scores: <q_i, decode(k_t)> to 1e-5 of |q_i| |k^_t|, for a GQA group of 4 queries.
    constexpr int kQ = 4;
    const auto q = gaussian_vectors(kQ, d, seed + 3);
    auto scorer = codec->prepare(q.data(), kQ);
    std::vector<float> s(static_cast<size_t>(kQ) * kT, NAN);
    scorer->scores(a.data(), kT, s.data());
    for (int i = 0; i < kQ; ++i)
      for (int t = 0; t < kT; ++t) {
        const float* qi = q.data() + i * d;
        const float* kt = x1.data() + static_cast<size_t>(t) * d;
        const double ref = dot(qi, kt, d);
        const double scale = std::sqrt(dot(qi, qi, d) * dot(kt, kt, d)) + 1e-30;
        ASSERT_NEAR(s[i * kT + t], ref, 1e-5 * scale) << "query " << i << " token " << t;
      }

    // Accumulate: from_space(sum_t w_t y_t) = sum_t w_t decode(v_t), to 1e-5 of sum_t |w_t| |v^_t|.
    std::vector<float> w(static_cast<size_t>(kQ) * kT);
    Rng rng(seed + 4);
    for (auto& v : w) v = static_cast<float>(rng.uniform());
    std::vector<float> acc(static_cast<size_t>(kQ) * codec->space_dim(), 0.f), out(static_cast<size_t>(kQ) * d);
    codec->accumulate(w.data(), kQ, a.data(), kT, acc.data());
    codec->from_space(acc.data(), kQ, out.data());
    for (int i = 0; i < kQ; ++i) {
      double scale = 0;
      for (int t = 0; t < kT; ++t) {
        const float* vt = x1.data() + static_cast<size_t>(t) * d;
        scale += w[i * kT + t] * std::sqrt(dot(vt, vt, d));
      }
      for (int j = 0; j < d; ++j) {
        double ref = 0;
        for (int t = 0; t < kT; ++t) ref += static_cast<double>(w[i * kT + t]) * x1[static_cast<size_t>(t) * d + j];
        ASSERT_NEAR(out[i * d + j], ref, 1e-5 * scale) << "query " << i << " channel " << j;
      }
    }
  }
}

TEST_P(CodecContract, PartialBlocksDecodeTheirTokens) {
  KVQ_FRESH_SEED();
  const int d = GetParam().dim;
  const auto profile = key_like_profile(d, seed);
  const auto codec = build(seed, profile);
  const auto x = sample_profile(profile, kT, seed + 5);
  std::vector<uint8_t> block(codec->block_bytes());
  for (int n : {1, 17, kT - 1}) {
    codec->encode(x.data(), n, block.data());
    std::vector<float> xhat(static_cast<size_t>(n) * d);
    codec->decode(block.data(), n, xhat.data());
    double err = 0, ref = 0;
    for (size_t i = 0; i < xhat.size(); ++i) {
      err += (x[i] - xhat[i]) * static_cast<double>(x[i] - xhat[i]);
      ref += static_cast<double>(x[i]) * x[i];
    }
    // Every codec here keeps at least a coarse picture of its input (1-bit sketches: relative error < 1.5).
    EXPECT_LT(err / ref, 1.5) << n << " tokens";
  }
}

TEST_P(CodecContract, RejectsBadInput) {
  KVQ_FRESH_SEED();
  const int d = GetParam().dim;
  const auto codec = build(seed, key_like_profile(d, seed));
  auto x = gaussian_vectors(kT, d, seed);
  std::vector<uint8_t> block(codec->block_bytes());
  EXPECT_THROW(codec->encode(x.data(), kT + 1, block.data()), Error);
  EXPECT_THROW(codec->encode(x.data(), -1, block.data()), Error);
  x[5 * d + 3] = std::numeric_limits<float>::quiet_NaN();
  try {
    codec->encode(x.data(), kT, block.data());
    FAIL() << "NaN input must be rejected";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("row 5 channel 3"), std::string::npos) << e.what();
  }
  x[5 * d + 3] = std::numeric_limits<float>::infinity();
  EXPECT_THROW(codec->encode(x.data(), kT, block.data()), Error);
  EXPECT_THROW(codec->prepare(x.data() + 5 * d, 1), Error);
  EXPECT_THROW(codec->prepare(x.data(), 0), Error);
}

INSTANTIATE_TEST_SUITE_P(AllCodecs, CodecContract, testing::ValuesIn(all_cases()), case_name);

TEST(CodecRegistry, UnknownCodecsAndBadDimensionsGiveClearErrors) {
  try {
    make_codec("nosuch:3", CodecParams{});
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unknown codec 'nosuch'"), std::string::npos) << e.what();
  }
  EXPECT_THROW(make_codec("f16", CodecParams{100, 64, 0, Role::key}), Error);
  EXPECT_THROW(make_codec("f16", CodecParams{128, 0, 0, Role::key}), Error);
  EXPECT_THROW(make_codec("f16:3", CodecParams{}), Error);
  EXPECT_THROW(make_codec("f16,zzz=1", CodecParams{}), Error);
  EXPECT_THROW(CodecSpec::parse("int4:x"), Error);
  EXPECT_THROW(CodecSpec::parse("int4,rot"), Error);
  EXPECT_THROW(CodecSpec::parse(""), Error);
}

TEST(CodecSpec, ParsesArgumentsAndOptions) {
  const CodecSpec s = CodecSpec::parse("vecinfer:10/4,rot=srft");
  EXPECT_EQ(s.name, "vecinfer");
  EXPECT_EQ(s.args, (std::vector<int>{10, 4}));
  EXPECT_EQ(s.option("rot", ""), "srft");
  EXPECT_EQ(s.str(), "vecinfer:10/4,rot=srft");
}

}  // namespace
}  // namespace kvq

// int8/int4's learned rotation (learn=K): Householder reflectors over the base rotation, learned on examples to
// lower the group maxima (codec/reflector_learning.hpp).
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "codec/reflector_learning.hpp"
#include "expect_error.hpp"
#include "kvq/codec.hpp"
#include "kvq/detail/random.hpp"
#include "kvq/detail/synthetic.hpp"
#include "kvq/rotation.hpp"
#include "test_seed.hpp"

namespace kvq {
namespace {

using test::expect_error;

constexpr int kDim = 128;

CodecParams key_params(uint64_t seed) {
  CodecParams p;
  p.dim = kDim;
  p.block_tokens = 64;
  p.role = Role::key;
  p.seed = seed;
  return p;
}

// Tokens along one fixed direction, large and of random sign, plus small noise: the base rotation leaves that
// direction's spread over the channels uneven (a Gaussian-like profile), which a learned rotation can flatten.
std::vector<float> one_direction(size_t n, uint64_t seed) {
  Rng rng(seed);
  std::vector<float> w(kDim);
  for (float& e : w) e = static_cast<float>(rng.normal());
  std::vector<float> x(n * kDim);
  for (size_t t = 0; t < n; ++t) {
    const double a = 10 * rng.normal();
    for (int c = 0; c < kDim; ++c)
      x[t * kDim + c] = static_cast<float>(a * w[c] / std::sqrt(kDim) + 0.1 * rng.normal());
  }
  return x;
}

// The mean squared reconstruction error of a codec over n tokens (encoded a block at a time).
double reconstruction_mse(const Codec& codec, const std::vector<float>& x) {
  const size_t n = x.size() / kDim, T = static_cast<size_t>(codec.block_tokens());
  std::vector<uint8_t> block(codec.block_bytes());
  std::vector<float> y(T * kDim);
  double sum = 0;
  for (size_t t0 = 0; t0 < n; t0 += T) {
    const int m = static_cast<int>(std::min(T, n - t0));
    codec.encode(x.data() + t0 * kDim, m, block.data());
    codec.decode(block.data(), m, y.data());
    for (size_t i = 0; i < static_cast<size_t>(m) * kDim; ++i) sum += std::pow(y[i] - x[t0 * kDim + i], 2);
  }
  return sum / static_cast<double>(x.size());
}

TEST(LearnedRotation, NoStepsGiveTheIdentity) {
  KVQ_FRESH_SEED();
  const std::vector<float> y = gaussian_vectors(64, kDim, seed);
  detail::ReflectorLearning how;
  how.reflectors = 8;
  how.steps = 0;
  how.seed = seed;
  const auto reflectors = detail::learn_reflectors(y.data(), 64, kDim, how);
  ASSERT_EQ(reflectors.size(), 8u);
  const std::vector<float> m = make_householder(kDim, reflectors)->matrix();
  for (int i = 0; i < kDim; ++i)
    for (int j = 0; j < kDim; ++j) EXPECT_NEAR(m[i * kDim + j], i == j ? 1.0f : 0.0f, 1e-5f) << i << "," << j;
}

// Where the base rotation leaves the channels uneven, the learned one lowers the group maxima and int4's error on
// tokens it did not see: tokens along one direction (measured 10-25x lower), and key-like tokens, whose channel
// means are such a direction (measured 0.47-0.55x).
TEST(LearnedRotation, LowersTheErrorWhereTheBaseRotationLeavesItUneven) {
  KVQ_FRESH_SEED();
  const std::vector<float> train = one_direction(2048, seed), test = one_direction(2048, seed + 1);
  auto base = make_codec("int4", key_params(seed));
  auto learned = make_codec("int4,learn=16", key_params(seed));
  base->train(train.data(), 2048);
  learned->train(train.data(), 2048);
  const double e_base = reconstruction_mse(*base, test), e_learned = reconstruction_mse(*learned, test);
  EXPECT_LT(e_learned, 0.5 * e_base) << "base " << e_base << ", learned " << e_learned;

  const ChannelProfile profile = key_like_profile(kDim, seed + 2);
  const std::vector<float> keys = sample_profile(profile, 2048, seed + 3);
  const std::vector<float> held = sample_profile(profile, 2048, seed + 4);
  base->train(keys.data(), 2048);
  learned->train(keys.data(), 2048);
  const double k_base = reconstruction_mse(*base, held), k_learned = reconstruction_mse(*learned, held);
  EXPECT_LT(k_learned, 0.8 * k_base) << "base " << k_base << ", learned " << k_learned;
}

TEST(LearnedRotation, StateRecreatesTheCodec) {
  KVQ_FRESH_SEED();
  const std::vector<float> train = one_direction(512, seed), x = one_direction(64, seed + 1);
  auto a = make_codec("int8:16,learn=6", key_params(seed));
  a->train(train.data(), 512);
  const std::vector<uint8_t> state = a->state();
  ASSERT_EQ(state.size(), (1 + 6) * kDim * sizeof(float));
  auto b = make_codec("int8:16,learn=6", key_params(seed));
  b->load_state(state);
  std::vector<uint8_t> ba(a->block_bytes()), bb(b->block_bytes());
  a->encode(x.data(), 64, ba.data());
  b->encode(x.data(), 64, bb.data());
  EXPECT_EQ(ba, bb);
  EXPECT_EQ(b->state(), state);

  // lambda alone (a file written before the rotation was learned) is accepted: the base rotation
  auto c = make_codec("int8:16,learn=6", key_params(seed));
  c->load_state(std::vector<uint8_t>(state.begin(), state.begin() + kDim * sizeof(float)));
  EXPECT_EQ(c->state().size(), kDim * sizeof(float));
}

TEST(LearnedRotation, RefusesBadSpecsAndStates) {
  const CodecParams p = key_params(1);
  expect_error([&] { make_codec("int4,learn=0", p); }, "not an even count of reflectors in [2, 128]");
  expect_error([&] { make_codec("int4,learn=3", p); }, "learn=3");
  expect_error([&] { make_codec("int4,learn=x", p); }, "learn=x");
  expect_error([&] { make_codec("int4,learn=130", p); }, "learn=130");
  auto codec = make_codec("int4,learn=2", p);
  std::vector<uint8_t> block(codec->block_bytes());
  const std::vector<float> x(kDim, 1.0f);
  expect_error([&] { codec->encode(x.data(), 1, block.data()); }, "train() must be called before encode");
  expect_error([&] { codec->load_state(std::vector<uint8_t>(5 * kDim * sizeof(float))); },
               "or 1536 (and 2 learned reflectors)");
  std::vector<float> floats(3 * kDim, 1.0f);
  floats[kDim + 5] = NAN;
  std::vector<uint8_t> bytes(floats.size() * sizeof(float));
  std::memcpy(bytes.data(), floats.data(), bytes.size());
  expect_error([&] { codec->load_state(bytes); }, "non-finite");
  std::fill(floats.begin() + kDim, floats.end(), 0.0f);
  std::memcpy(bytes.data(), floats.data(), bytes.size());
  expect_error([&] { codec->load_state(bytes); }, "zero vector");
}

}  // namespace
}  // namespace kvq

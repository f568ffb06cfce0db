// CUDA decode attention against the double-precision reference over the decoded cache, for every codec pair with a
// kernel: GQA groups 1/4/8, d = 64/128/256, T = 64/128, windows (R), lengths that are not multiples of T, empty and
// one-token sequences, several sequences in one call, Gaussian and key-like (outlier) data; the device cache's own
// appends and the errors it owes its callers.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "attention_test_util.hpp"
#include "gpu_test.hpp"
#include "kvq/cuda.hpp"
#include "kvq/detail/cuda_bench_support.hpp"
#include "kvq/error.hpp"
#include "test_seed.hpp"

namespace kvq {
namespace {

using test::Shape;

// Every pair of the default build (src/cuda/decode_pairs.cmake), vecinfer keys also with norm=1.
const std::vector<std::pair<std::string, std::string>> kPairs = {
    {"f16", "f16"},
    {"bf16", "bf16"},
    {"int4", "int4"},
    {"int8", "int8"},
    {"kivi:2", "kivi:2"},
    {"kivi:4", "kivi:4"},
    {"turbo_mse:1", "turbo_mse:1"},
    {"turbo_mse:2", "turbo_mse:2"},
    {"turbo_mse:3", "turbo_mse:3"},
    {"turbo_mse:4", "turbo_mse:4"},
    {"kivi:4", "int4"},
    {"int8", "int4"},
    {"int8", "turbo_mse:3"},
    {"int4", "turbo_mse:2"},
    {"turbo_mse:4", "turbo_mse:2"},
    {"kivi:4", "kivi:2"},
    {"f16", "int4"},
    {"kivi:3", "kivi:3"},
    {"kivi:3", "turbo_mse:2"},
    {"kivi:3", "int4"},
    {"kivi:4", "turbo_mse:2"},
    {"kivi:3", "kivi:2"},
    {"qjl", "qjl"},
    {"qjl", "int4"},
    {"qjl:256", "int4"},
    {"qjl:256", "qjl:256"},
    {"turbo_prod:4", "turbo_prod:4"},
    {"turbo_prod:4", "int4"},
    {"turbo_prod:4", "turbo_mse:3"},
    {"turbo_prod:2", "turbo_prod:2"},
    {"turbo_prod:3", "turbo_prod:3"},
    {"turbo_prod:3", "int4"},
    {"turbo_rvq:1", "turbo_rvq:1"},
    {"turbo_rvq:2", "turbo_rvq:2"},
    {"turbo_rvq:3", "turbo_rvq:3"},
    {"turbo_rvq:4", "turbo_rvq:4"},
    {"turbo_rvq:2", "int4"},
    {"vecinfer:8/4", "vecinfer:8/4"},
    {"vecinfer:10/4", "vecinfer:10/4"},
    {"vecinfer:12/8", "vecinfer:12/8"},
    {"vecinfer:8/4,norm=1", "vecinfer:8/4"},
    {"vecinfer:12/8,norm=1", "vecinfer:12/8"},
};

// Runs the device kernel on the scenario's cache (layer 1) and returns its output.
std::vector<float> device_decode(const KVCache& dev, const std::vector<SeqId>& ids,
                                 const std::vector<float>& q, int splits = 0) {
  cuda::DeviceFloats q_dev(q.size()), out_dev(q.size());
  q_dev.upload(q);
  out_dev.fill(NAN);  // every element must be written
  AttentionOptions options;
  options.splits = splits;
  decode_attention(dev, 1, ids, {q_dev.data(), q_dev.size()}, {out_dev.data(), out_dev.size()}, options);
  return out_dev.download();
}

// |got - want| within 1e-3 of sum_t p_t |v_t| (plus fp32 score rounding), row by row, no NaN.
void expect_matches(const Shape& shape, const std::string& k, const std::string& v, uint64_t seed, int splits = 0,
                    bool center_keys = false) {
  SCOPED_TRACE(k + "/" + v + ", " + test::describe(shape) + ", splits " + std::to_string(splits) +
               (center_keys ? ", centered keys" : ""));
  const test::Scenario sc = test::build(shape, k, v, seed, center_keys);
  const KVCache dev = sc.cache.to(Device::cuda());
  const auto q = test::queries(shape, sc.ids.size(), seed + 99);
  const std::vector<float> got = device_decode(dev, sc.ids, q, splits);
  for (float x : got) ASSERT_TRUE(std::isfinite(x));
  const test::Reference ref = test::reference_decode(sc, q, shape.G, true);
  EXPECT_LE(test::worst(got, ref.out, ref, static_cast<size_t>(shape.d), 1e-3, true), 1.0);
  // And the CPU's fused kernels on the same cache, which agree with the reference to 1e-5.
  const std::vector<float> cpu = test::decode(sc, q, nullptr);
  EXPECT_LE(test::worst(got, cpu, ref, static_cast<size_t>(shape.d), 1e-3, true), 1.0);
}

TEST(CudaDecodeAttention, EveryPairMatchesTheReference) {
  KVQ_REQUIRE_GPU();
  KVQ_FRESH_SEED();
  for (const auto& [k, v] : kPairs) {
    expect_matches({128, 64, 0, 2, 4, {0, 1, 63, 200, 700}, true}, k, v, seed);
    expect_matches({128, 64, 64, 2, 4, {5, 130, 1000}, false}, k, v, seed + 1);
    expect_matches({128, 64, 64, 2, 4, {5, 130, 1000}, true}, k, v, seed + 2, 0, true);
  }
}

// Every key codec with kernel traits against every value codec: each pair this build has (all of them with
// -DKVQ_CUDA_ALL_PAIRS=ON) matches the reference; the default pairs are among them.
TEST(CudaDecodeAttention, EveryBuiltPairMatchesTheReference) {
  KVQ_REQUIRE_GPU();
  KVQ_FRESH_SEED();
  const std::vector<std::string> codecs = {"f16",    "bf16",        "int4",        "int8",        "kivi:2",    "kivi:3",
                                           "kivi:4", "turbo_mse:1", "turbo_mse:2", "turbo_mse:3", "turbo_mse:4"};
  const Shape shape{128, 64, 0, 2, 4, {1, 130, 700}, true};
  size_t built = 0, defaults = 0;
  for (const std::string& k : codecs)
    for (const std::string& v : codecs) {
      try {
        attention_kernel(KVCache(test::config_for(shape, k, v, seed), Device::cuda()), 1);
      } catch (const Error&) {
        continue;  // not in this build
      }
      ++built;
      defaults += std::count(kPairs.begin(), kPairs.end(), std::make_pair(k, v)) > 0;
      expect_matches(shape, k, v, seed);
    }
  const auto in_product = [&](const std::pair<std::string, std::string>& p) {
    return std::count(codecs.begin(), codecs.end(), p.first) > 0 && std::count(codecs.begin(), codecs.end(), p.second) > 0;
  };
  const size_t listed = static_cast<size_t>(std::count_if(kPairs.begin(), kPairs.end(), in_product));
  EXPECT_EQ(defaults, listed);
  EXPECT_GE(built, listed);
}

TEST(CudaDecodeAttention, HeadDimensionsGroupsAndPageSizes) {
  KVQ_REQUIRE_GPU();
  KVQ_FRESH_SEED();
  for (const auto& [k, v] : kPairs) {
    expect_matches({64, 64, 0, 3, 1, {77, 300}, true}, k, v, seed);
    expect_matches({256, 128, 128, 1, 8, {1, 129, 600}, true}, k, v, seed + 2);
    expect_matches({128, 128, 0, 1, 8, {1000}, false}, k, v, seed + 3);
  }
}

TEST(CudaDecodeAttention, SplitCountsGiveTheSameAnswer) {
  KVQ_REQUIRE_GPU();
  KVQ_FRESH_SEED();
  for (int splits : {1, 3, 64}) expect_matches({128, 64, 0, 2, 4, {900, 64, 0}, true}, "int4", "int4", seed, splits);
}

// The options the CPU refuses are refused too (sliding windows: sliding_window_test.cpp).
TEST(CudaDecodeAttention, BadOptionsAreRefused) {
  KVQ_REQUIRE_GPU();
  KVQ_FRESH_SEED();
  const Shape shape{128, 64, 0, 2, 4, {700}, true};
  const test::Scenario sc = test::build(shape, "int4", "int4", seed);
  const KVCache dev = sc.cache.to(Device::cuda());
  for (const float scale : {-1.0f, NAN, INFINITY}) {
    AttentionOptions bad;
    bad.scale = scale;
    EXPECT_THROW(DecodePlan(dev, 1, sc.ids, shape.H * shape.G, bad), Error);
  }
}

// A plan run again on the same arrays replays a captured graph: new query values in the same array give the new
// answer, and other arrays work too.
TEST(CudaDecodeAttention, RepeatedRunsOfAPlanFollowTheirInputs) {
  KVQ_REQUIRE_GPU();
  KVQ_FRESH_SEED();
  const Shape shape{128, 64, 64, 2, 4, {700, 90}, true};
  const test::Scenario sc = test::build(shape, "int4", "int4", seed);
  const KVCache dev = sc.cache.to(Device::cuda());
  const int n_q = shape.H * shape.G;
  DecodePlan plan(dev, 1, sc.ids, n_q);
  cuda::DeviceFloats q_dev(sc.ids.size() * static_cast<size_t>(n_q * shape.d)), out_dev(q_dev.size()),
      other_out(q_dev.size());
  for (int call = 0; call < 4; ++call) {
    SCOPED_TRACE("call " + std::to_string(call));
    const auto q = test::queries(shape, sc.ids.size(), seed + 20 + static_cast<uint64_t>(call));
    q_dev.upload(q);
    cuda::DeviceFloats& out = call == 3 ? other_out : out_dev;
    out.fill(NAN);
    plan.run({q_dev.data(), q_dev.size()}, {out.data(), out.size()});
    const std::vector<float> got = out.download();
    const test::Reference ref = test::reference_decode(sc, q, shape.G, true);
    EXPECT_LE(test::worst(got, ref.out, ref, static_cast<size_t>(shape.d), 1e-3, true), 1.0);
  }
}

// Appends on the device cache (token by token and in chunks) give what the host cache holds after the same appends,
// with keys as they are and centered (cache.hpp).
TEST(CudaDeviceCache, AppendsMatchTheHostCache) {
  KVQ_REQUIRE_GPU();
  KVQ_FRESH_SEED();
  for (const bool center : {false, true})
  for (const auto& [k, v] : kPairs) {
    SCOPED_TRACE(k + "/" + v + (center ? ", centered keys" : ""));
    const Shape shape{128, 64, 64, 2, 4, {0, 300}, true};
    const test::Scenario sc = test::build(shape, k, v, seed, center);  // the host cache and its tokens
    KVCache trained(sc.cfg);                                     // the same codecs, trained the same way, empty
    test::train_if_needed(trained, seed, 1);
    KVCache dev = trained.to(Device::cuda());
    std::vector<SeqId> ids;
    for (size_t s = 0; s < sc.ids.size(); ++s) {
      ids.push_back(dev.add_sequence());
      const test::Tokens& t = sc.tokens[s];
      const size_t row = static_cast<size_t>(shape.H * shape.d), n = shape.lengths[s];
      for (size_t i = 0; i < n;) {  // chunks of 1, 37, 1, 37, ...
        const size_t step = std::min(n - i, i % 2 ? size_t{1} : size_t{37});
        dev.append(ids.back(), 1, t.keys.data() + i * row, t.values.data() + i * row, step);
        i += step;
      }
      EXPECT_EQ(dev.length(ids.back(), 1), n);
    }
    const auto q = test::queries(shape, ids.size(), seed + 5);
    const std::vector<float> got = device_decode(dev, ids, q);
    const test::Reference ref = test::reference_decode(sc, q, shape.G, true);
    EXPECT_LE(test::worst(got, ref.out, ref, static_cast<size_t>(shape.d), 1e-3, true), 1.0);
  }
}

// A sequence built by repeating another's pages attends over the repeated tokens.
TEST(CudaDeviceCache, RepeatedSequenceIsTheTokensRepeated) {
  KVQ_REQUIRE_GPU();
  KVQ_FRESH_SEED();
  const Shape shape{128, 64, 0, 2, 4, {128}, true};
  const test::Scenario sc = test::build(shape, "int4", "int4", seed);
  KVCache dev = sc.cache.to(Device::cuda(), 64);
  const std::vector<SeqId> ids = {cuda::add_sequence_repeating(dev, sc.ids[0], 384)};
  EXPECT_EQ(dev.length(ids[0], 1), 384u);
  const auto q = test::queries(shape, 1, seed + 1);
  const std::vector<float> got = device_decode(dev, ids, q);
  const size_t d = 128;
  test::Reference ref(q.size() / d, d);
  for (int h = 0; h < shape.H; ++h) {
    const test::Tokens one = test::decoded_head(sc.cache, sc.ids[0], 1, h);
    test::Tokens three;
    for (int r = 0; r < 3; ++r) {
      three.keys.insert(three.keys.end(), one.keys.begin(), one.keys.end());
      three.values.insert(three.values.end(), one.values.begin(), one.values.end());
    }
    for (int j = 0; j < shape.G; ++j) {
      const size_t row = static_cast<size_t>(h * shape.G + j);
      test::reference_row(ref, row, q.data() + row * d, three, 384, 384, 128);
    }
  }
  EXPECT_LE(test::worst(got, ref.out, ref, d, 1e-3, true), 1.0);
}

// The device cache goes on with the host cache's ids, also where the newest sequence was removed.
TEST(CudaDeviceCache, SequenceIdsContinueTheHostCache) {
  KVQ_REQUIRE_GPU();
  KVQ_FRESH_SEED();
  const Shape shape{128, 64, 0, 2, 4, {128}, true};
  test::Scenario sc = test::build(shape, "int4", "int4", seed);
  sc.cache.remove_sequence(sc.cache.add_sequence());
  KVCache dev = sc.cache.to(Device::cuda(), 64);
  EXPECT_EQ(dev.sequences(), sc.cache.sequences());
  EXPECT_EQ(dev.to(Device::cpu()).next_sequence_id(), sc.cache.next_sequence_id());
  EXPECT_EQ(dev.add_sequence(), sc.cache.add_sequence());
}

TEST(CudaDeviceCache, ErrorsNameTheProblem) {
  KVQ_REQUIRE_GPU();
  KVQ_FRESH_SEED();
  const Shape shape{128, 64, 0, 2, 4, {100}, true};
  const test::Scenario sc = test::build(shape, "f32", "f32", seed);
  const KVCache f32 = sc.cache.to(Device::cuda());
  try {
    attention_kernel(f32, 1);
    ADD_FAILURE() << "a pair without a kernel must throw";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("no kernel for key codec 'f32' with value codec 'f32'"), std::string::npos) << what;
    for (const auto& [k, v] : kPairs) {  // what exists, by codec id (a spec's options are not part of it)
      std::string listed = " ";
      listed.append(k, 0, k.find(',')).append("/").append(v);
      EXPECT_NE(what.find(listed), std::string::npos) << what;
    }
  }
  // A mixed pair outside the default build names the option that builds it.
  const test::Scenario mixed = test::build(shape, "int4", "f16", seed);
  const KVCache int4_f16 = mixed.cache.to(Device::cuda());
  try {
    EXPECT_EQ(attention_kernel(int4_f16, 1), "cuda_int4_f16");  // a build with every pair
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("-DKVQ_CUDA_ALL_PAIRS=ON"), std::string::npos) << e.what();
  }
  const test::Scenario ok = test::build(shape, "int4", "int4", seed);
  const KVCache dev = ok.cache.to(Device::cuda());
  EXPECT_EQ(attention_kernel(dev, 1), "cuda_int4_int4");
  cuda::DeviceFloats q(3 * 128), out(3 * 128);
  EXPECT_THROW(decode_attention(dev, 1, ok.ids, {q.data(), q.size()}, {out.data(), out.size()}), Error);  // GQA group 3/2
  EXPECT_THROW(decode_attention(dev, 5, ok.ids, {q.data(), q.size()}, {out.data(), out.size()}), Error);  // no layer 5
  const std::vector<SeqId> unknown = {42};
  EXPECT_THROW(decode_attention(dev, 1, unknown, {q.data(), q.size()}, {out.data(), out.size()}), Error);

  CacheConfig small = test::config_for(shape, "int4", "int4", seed);
  small.capacity_pages = 1;
  KVCache full(small, Device::cuda());
  const SeqId s = full.add_sequence();
  const test::Tokens t = test::make_tokens(small, 200, seed, true);
  EXPECT_THROW(full.append(s, 0, t.keys.data(), t.values.data(), 200), Error);  // needs 3 pages
  EXPECT_EQ(full.length(s, 0), 0u);  // nothing changed
  std::vector<float> nan_keys(t.keys.begin(), t.keys.begin() + 256);
  nan_keys[7] = NAN;
  EXPECT_THROW(full.append(s, 0, nan_keys.data(), t.values.data(), 1), Error);
  EXPECT_THROW(KVCache(small, Device::cuda(99)), Error);  // no such device
}

}  // namespace
}  // namespace kvq

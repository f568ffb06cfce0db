// Sink tokens (CacheConfig::sink_tokens) on a CUDA cache. A CPU cache and a CUDA cache made from it before any
// token take the same batched appends (prefill chunks, then one-token decode steps; sequences shorter than S, chunks
// that end inside the sinks and chunks that cross their end): the device's sinks must equal the CPU's bit for bit
// (the same f16 rounding), and its decode attention must match the CPU's decode over the device cache copied back
// and the double-precision reference over that copy, with and without sliding windows, centered keys, S = 1 and 4.
// A CPU cache with sinks copied to the device (to) decodes alike; tokens f16 cannot hold or NaN in the sinks are
// refused with the cache unchanged; DecodeStep runs with full sinks and refuses sequences whose sinks are not.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "attention_test_util.hpp"
#include "expect_error.hpp"
#include "gpu_test.hpp"
#include "kvq/cuda.hpp"
#include "temp_file.hpp"
#include "test_seed.hpp"

namespace kvq {
namespace {

constexpr int kLayer = 1;

struct SinkCase {
  std::string key, value;
  int sinks = 1;
  int residual = 0;
  bool center = false;
};

CacheConfig config_of(const SinkCase& c, uint64_t seed) {
  CacheConfig cfg;
  cfg.n_layers = 2;
  cfg.n_kv_heads = 2;
  cfg.head_dim = 128;
  cfg.block_tokens = 64;
  cfg.residual_tokens = c.residual;
  cfg.key_codec = c.key;
  cfg.value_codec = c.value;
  cfg.capacity_pages = 64;
  cfg.center_keys = c.center;
  cfg.sink_tokens = c.sinks;
  cfg.seed = seed;
  return cfg;
}

// The same batched append on both caches: chunk[i] tokens of sequence i from tokens[i] at done[i].
void append_both(KVCache& cpu, KVCache& dev, const std::vector<SeqId>& ids, const std::vector<test::Tokens>& tokens,
                 std::vector<size_t>& done, const std::vector<size_t>& chunk) {
  const size_t row = static_cast<size_t>(cpu.config().n_kv_heads) * cpu.config().head_dim;
  std::vector<float> keys, values;
  for (size_t i = 0; i < ids.size(); ++i) {
    const float* k = tokens[i].keys.data() + done[i] * row;
    const float* v = tokens[i].values.data() + done[i] * row;
    cpu.append(ids[i], kLayer, k, v, chunk[i]);
    keys.insert(keys.end(), k, k + chunk[i] * row);
    values.insert(values.end(), v, v + chunk[i] * row);
    done[i] += chunk[i];
  }
  if (keys.empty()) return;
  cuda::DeviceFloats k_dev(keys.size()), v_dev(values.size());
  k_dev.upload(keys);
  v_dev.upload(values);
  dev.append_device_batch(ids, kLayer, k_dev.data(), v_dev.data(), chunk);
}

// The device's sinks equal the CPU's bit for bit, and its lengths and sink bytes.
void expect_same_sinks(const KVCache& cpu, const KVCache& dev, const std::vector<SeqId>& ids) {
  const KVCache back = dev.to(Device::cpu());
  const size_t d = static_cast<size_t>(cpu.config().head_dim), H = static_cast<size_t>(cpu.config().n_kv_heads);
  for (const SeqId id : ids) {
    SCOPED_TRACE("sequence " + std::to_string(id));
    ASSERT_EQ(back.length(id, kLayer), cpu.length(id, kLayer));
    const LayerView a = cpu.view(id, kLayer), b = back.view(id, kLayer);
    ASSERT_EQ(a.sink_count, b.sink_count);
    ASSERT_EQ(a.pages.size(), b.pages.size());
    ASSERT_EQ(a.residual_count, b.residual_count);
    for (size_t h = 0; h < H && a.sink_count > 0; ++h) {
      const size_t n = static_cast<size_t>(a.sink_count) * d * sizeof(uint16_t);
      ASSERT_EQ(std::memcmp(a.sink_keys + h * a.sink_stride, b.sink_keys + h * b.sink_stride, n), 0) << "keys " << h;
      ASSERT_EQ(std::memcmp(a.sink_values + h * a.sink_stride, b.sink_values + h * b.sink_stride, n), 0)
          << "values " << h;
    }
  }
  EXPECT_EQ(dev.memory().sink_bytes, cpu.memory().sink_bytes);
}

// Device decode against the CPU's decode over the device cache copied back and the double-precision reference
// over that copy, at the sliding-window test's tolerance.
void expect_decode_matches(const KVCache& dev, const std::vector<SeqId>& ids, int G, size_t window, uint64_t seed) {
  SCOPED_TRACE("window " + std::to_string(window));
  const CacheConfig& cfg = dev.config();
  const size_t d = static_cast<size_t>(cfg.head_dim);
  const test::Shape shape{cfg.head_dim, cfg.block_tokens, cfg.residual_tokens, cfg.n_kv_heads, G, {}, true};
  const std::vector<float> q = test::queries(shape, ids.size(), seed);
  AttentionOptions options;
  options.window = window;
  cuda::DeviceFloats q_dev(q.size()), out_dev(q.size());
  q_dev.upload(q);
  out_dev.fill(NAN);  // every element must be written
  decode_attention(dev, kLayer, ids, {q_dev.data(), q_dev.size()}, {out_dev.data(), out_dev.size()}, options);
  const std::vector<float> got = out_dev.download();
  for (const float x : got) ASSERT_TRUE(std::isfinite(x));
  const test::Scenario back{cfg, dev.to(Device::cpu()), ids, {}};
  std::vector<float> cpu(q.size(), NAN);
  decode_attention(back.cache, kLayer, ids, q, cpu, options);
  const test::Reference ref = test::reference_decode(back, q, G, true, window);
  EXPECT_LE(test::worst(got, ref.out, ref, d, 1e-3, true), 1.0) << "against the reference";
  EXPECT_LE(test::worst(got, cpu, ref, d, 1e-3, true), 1.0) << "against the CPU";
}

// Prompts of 1, 2, 3, 60, 130 and 250 tokens in two batched chunks each, then 6 batched one-token steps; the
// sinks and decode attention checked after each append.
void run_case(const SinkCase& c, uint64_t seed) {
  SCOPED_TRACE(c.key + "/" + c.value + ", S = " + std::to_string(c.sinks) + ", R = " + std::to_string(c.residual) +
               (c.center ? ", centered" : ""));
  const CacheConfig cfg = config_of(c, seed);
  KVCache cpu(cfg);
  test::train_if_needed(cpu, seed, kLayer);
  KVCache dev = cpu.to(Device::cuda());
  const std::vector<size_t> prompts = {1, 2, 3, 60, 130, 250};
  constexpr size_t kSteps = 6;
  std::vector<SeqId> ids;
  std::vector<test::Tokens> tokens;
  for (size_t i = 0; i < prompts.size(); ++i) {
    ids.push_back(cpu.add_sequence());
    ASSERT_EQ(dev.add_sequence(), ids.back());
    tokens.push_back(test::make_tokens(cfg, prompts[i] + kSteps, seed + 10 * i, true));
  }
  std::vector<size_t> done(ids.size(), 0), first(ids.size()), second(ids.size());
  for (size_t i = 0; i < ids.size(); ++i) {
    first[i] = prompts[i] / 2;
    second[i] = prompts[i] - first[i];
  }
  const auto check = [&](const std::string& when) {
    SCOPED_TRACE(when);
    expect_same_sinks(cpu, dev, ids);
    for (const size_t window : {size_t{0}, size_t{2}, size_t{100}}) expect_decode_matches(dev, ids, 4, window, seed);
  };
  append_both(cpu, dev, ids, tokens, done, first);
  check("after the first prefill chunk");
  append_both(cpu, dev, ids, tokens, done, second);
  check("after the prefill");
  for (size_t s = 0; s < kSteps && !::testing::Test::HasFailure(); ++s) {
    append_both(cpu, dev, ids, tokens, done, std::vector<size_t>(ids.size(), 1));
    check("after step " + std::to_string(s));
  }
}

// The build's default pairs and those of a -DKVQ_CUDA_PAIRS build (f16, int4, turbo_mse:3).
const std::vector<SinkCase> kCases = {
    {"f16", "f16", 1},          {"int4", "int4", 1},          {"int4", "int4", 4, 64},
    {"turbo_mse:3", "turbo_mse:3", 1}, {"turbo_mse:3", "turbo_mse:3", 4, 0, true}, {"int4", "int4", 4, 0, true}};

TEST(CudaSinkTokens, AppendsAndDecodeMatchTheCpu) {
  KVQ_REQUIRE_GPU();
  KVQ_FRESH_SEED();
  for (const SinkCase& c : kCases) run_case(c, seed);
}

// A CPU cache with sinks, copied to the device: its decode matches the CPU's, windows that hide the sinks included;
// saved from the device and loaded onto it, it holds the same sinks.
TEST(CudaSinkTokens, CopiedCacheDecodesAsTheCpu) {
  KVQ_REQUIRE_GPU();
  KVQ_FRESH_SEED();
  for (const int S : {1, 4}) {
    const test::Shape shape{128, 64, 0, 2, 4, {2, 4, 5, 100, 300}, true};
    CacheConfig cfg = test::config_for(shape, "int4", "int4", seed);
    cfg.sink_tokens = S;
    KVCache cpu(cfg);
    std::vector<SeqId> ids;
    for (size_t i = 0; i < shape.lengths.size(); ++i) {
      ids.push_back(cpu.add_sequence());
      test::append_range(cpu, ids.back(), kLayer, test::make_tokens(cfg, shape.lengths[i], seed + i, true), 0,
                         shape.lengths[i]);
    }
    const KVCache dev = cpu.to(Device::cuda());
    expect_same_sinks(cpu, dev, ids);
    for (const size_t window : {size_t{0}, size_t{1}, size_t{3}, size_t{99}, size_t{298}})
      expect_decode_matches(dev, ids, 4, window, seed + static_cast<uint64_t>(S));
    const test::TempFile file("cuda-sinks.kvq");
    dev.save(file.path().string());
    const KVCache loaded = KVCache::load(file.path().string(), Device::cuda());
    expect_same_sinks(cpu, loaded, ids);
    expect_decode_matches(loaded, ids, 4, 0, seed);
  }
}

// Tokens f16 cannot hold, and NaN, in the sinks: refused naming the sequence, nothing changed.
TEST(CudaSinkTokens, BadSinkTokensAreRefused) {
  KVQ_REQUIRE_GPU();
  KVQ_FRESH_SEED();
  const CacheConfig cfg = config_of({"int4", "int4", 2}, seed);
  KVCache dev(cfg, Device::cuda());
  const SeqId a = dev.add_sequence(), b = dev.add_sequence();
  test::Tokens t = test::make_tokens(cfg, 6, seed, true);
  const size_t row = static_cast<size_t>(cfg.n_kv_heads) * cfg.head_dim;
  for (const float bad : {1e5f, NAN}) {
    test::Tokens x = t;
    x.values[4 * row + 7] = bad;  // sequence b's second token: a sink
    cuda::DeviceFloats k_dev(x.keys.size()), v_dev(x.values.size());
    k_dev.upload(x.keys);
    v_dev.upload(x.values);
    const std::vector<SeqId> ids = {a, b};
    const std::vector<size_t> n = {3, 3};
    test::expect_error([&] { dev.append_device_batch(ids, kLayer, k_dev.data(), v_dev.data(), n); },
                       "sequence " + std::to_string(b));
    EXPECT_EQ(dev.length(a, kLayer), 0u);
    EXPECT_EQ(dev.length(b, kLayer), 0u);
  }
  dev.append(a, kLayer, t.keys.data(), t.values.data(), 6);
  EXPECT_EQ(dev.length(a, kLayer), 6u);
  EXPECT_EQ(dev.view(a, kLayer).sink_count, 2);
}

// DecodeStep: with every sequence's sinks full, its steps equal append_device_batch then decode_attention on a
// twin; a sequence whose sinks are not full is refused by prepare().
TEST(CudaSinkTokens, DecodeStepRunsWithFullSinks) {
  KVQ_REQUIRE_GPU();
  KVQ_FRESH_SEED();
  const CacheConfig cfg = config_of({"int4", "int4", 4}, seed);
  KVCache eager(cfg, Device::cuda()), stepped(cfg, Device::cuda());
  std::vector<SeqId> ids;
  for (const size_t n : {4, 5, 70}) {
    ids.push_back(eager.add_sequence());
    ASSERT_EQ(stepped.add_sequence(), ids.back());
    const test::Tokens t = test::make_tokens(cfg, n, seed + n, true);
    for (int l = 0; l < cfg.n_layers; ++l) {
      eager.append(ids.back(), l, t.keys.data(), t.values.data(), n);
      stepped.append(ids.back(), l, t.keys.data(), t.values.data(), n);
    }
  }
  const int n_q = 4 * cfg.n_kv_heads;
  const std::vector<int> layers = {0, 1};
  const std::vector<AttentionOptions> options(layers.size());
  cuda::DecodeStep step(stepped, ids, layers, n_q, options, 400);
  const size_t B = ids.size(), row = static_cast<size_t>(cfg.n_kv_heads) * cfg.head_dim;
  cuda::DeviceFloats k_dev(B * row), v_dev(B * row), q_dev(B * static_cast<size_t>(n_q) * cfg.head_dim),
      out_dev(q_dev.size()), eager_out(q_dev.size());
  const std::vector<size_t> ones(B, 1);
  for (int s = 0; s < 70 && !::testing::Test::HasFailure(); ++s) {
    step.prepare();
    for (const int l : layers) {
      const test::Tokens t = test::make_tokens(cfg, B, seed + 1000 + static_cast<uint64_t>(2 * s + l), true);
      k_dev.upload(t.keys);
      v_dev.upload(t.values);
      q_dev.upload(gaussian_vectors(B * static_cast<size_t>(n_q), cfg.head_dim, seed + static_cast<uint64_t>(s)));
      step.run(l, k_dev.data(), v_dev.data(), q_dev.data(), out_dev.data());
      eager.append_device_batch(ids, l, k_dev.data(), v_dev.data(), ones);
      decode_attention(eager, l, ids, {q_dev.data(), q_dev.size()}, {eager_out.data(), eager_out.size()});
      const std::vector<float> got = out_dev.download(), want = eager_out.download();
      float scale = 1, worst = 0;
      for (size_t i = 0; i < got.size(); ++i) {
        ASSERT_TRUE(std::isfinite(got[i]));
        scale = std::max(scale, std::fabs(want[i]));
        worst = std::max(worst, std::fabs(got[i] - want[i]));
      }
      EXPECT_LE(worst, 1e-5f * scale) << "step " << s << " layer " << l;
    }
  }
  step.check();

  const SeqId short_one = stepped.add_sequence();
  const test::Tokens t = test::make_tokens(cfg, 2, seed, true);
  for (int l = 0; l < cfg.n_layers; ++l) stepped.append(short_one, l, t.keys.data(), t.values.data(), 2);
  const std::vector<SeqId> with_short = {ids[0], short_one};
  cuda::DecodeStep refused(stepped, with_short, layers, n_q, options, 400);
  test::expect_error([&] { refused.prepare(); }, "2 of its 4 sink tokens");
}

}  // namespace
}  // namespace kvq

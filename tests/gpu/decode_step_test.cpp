// DecodeStep against what it stands for: per step, append_device_batch of one token per sequence then
// decode_attention, on a twin cache given the same tokens. The caches must stay equal byte for byte (pages, fp32
// windows, key offsets: the same kernels write them) and the outputs equal up to the split-K partition (a step's
// grid is made for max_tokens, the eager plan's for the lengths now: the partial sums fold in another order, fp32,
// so 1e-5 of the output's scale). Steps run eagerly and as a captured CUDA graph replayed every step, across page
// boundaries, with fp32 windows of 0 and 64 tokens, centered keys, sliding windows and several codec pairs; errors
// (NaN, an exhausted pool, max_tokens) are reported as the header promises.
#include <gtest/gtest.h>

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "gpu_test.hpp"
#include "kvq/cuda.hpp"
#include "kvq/error.hpp"
#include "test_seed.hpp"

namespace kvq {
namespace {

struct StepCase {
  std::string key, value;
  int residual = 0;
  bool center = false;
  size_t window = 0;
};

constexpr int kLayers = 2, kHeads = 2, kGroup = 4, kDim = 128, kT = 64;
constexpr size_t kMaxTokens = 400;

CacheConfig config_of(const StepCase& c) {
  CacheConfig cfg;
  cfg.n_layers = kLayers;
  cfg.n_kv_heads = kHeads;
  cfg.head_dim = kDim;
  cfg.block_tokens = kT;
  cfg.key_codec = c.key;
  cfg.value_codec = c.value;
  cfg.residual_tokens = c.residual;
  cfg.capacity_pages = 64;
  cfg.center_keys = c.center;
  return cfg;
}

// Normal values with a few outlier channels (keys' channel 3 and 70 ten times larger), as real keys have.
std::vector<float> tokens(std::mt19937_64& rng, size_t n, bool outliers) {
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::vector<float> x(n * kHeads * kDim);
  for (size_t i = 0; i < x.size(); ++i) {
    const size_t c = i % kDim;
    x[i] = normal(rng) * (outliers && (c == 3 || c == 70) ? 10.0f : 1.0f) + (outliers ? 0.5f : 0.0f);
  }
  return x;
}

void expect_same_caches(const KVCache& a, const KVCache& b, const std::vector<SeqId>& ids) {
  const KVCache ha = a.to(Device::cpu()), hb = b.to(Device::cpu());
  for (const SeqId id : ids)
    for (int l = 0; l < kLayers; ++l) {
      SCOPED_TRACE("sequence " + std::to_string(id) + " layer " + std::to_string(l));
      const LayerView va = ha.view(id, l), vb = hb.view(id, l);
      ASSERT_EQ(va.pages.size(), vb.pages.size());
      ASSERT_EQ(va.residual_count, vb.residual_count);
      for (size_t j = 0; j < va.pages.size(); ++j)
        ASSERT_EQ(std::memcmp(ha.page(va.pages[j]), hb.page(vb.pages[j]), ha.page_bytes()), 0) << "page " << j;
      for (int h = 0; h < kHeads; ++h) {
        const size_t n = static_cast<size_t>(va.residual_count) * kDim * sizeof(float);
        ASSERT_EQ(std::memcmp(va.residual_key(h), vb.residual_key(h), n), 0) << "window keys, head " << h;
        ASSERT_EQ(std::memcmp(va.residual_value(h), vb.residual_value(h), n), 0) << "window values, head " << h;
      }
      ASSERT_EQ(va.key_offset == nullptr, vb.key_offset == nullptr);
      if (va.key_offset) {
        ASSERT_EQ(std::memcmp(va.key_offset, vb.key_offset, kHeads * kDim * sizeof(float)), 0) << "key offset";
      }
    }
}

void expect_close(const std::vector<float>& got, const std::vector<float>& want) {
  ASSERT_EQ(got.size(), want.size());
  float scale = 0, worst = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_TRUE(std::isfinite(got[i])) << "element " << i;
    scale = std::max(scale, std::fabs(want[i]));
    worst = std::max(worst, std::fabs(got[i] - want[i]));
  }
  EXPECT_LE(worst, 1e-5f * std::max(scale, 1.0f));
}

// Twin caches with the same prefill (prompts of 0, 5, 63, 64 and 200 tokens), then `steps` steps: eager
// append + decode on one, DecodeStep on the other (captured once and replayed when `graph`).
void run_steps(const StepCase& c, int steps, bool graph, uint64_t seed) {
  SCOPED_TRACE(c.key + "/" + c.value + ", R = " + std::to_string(c.residual) + (c.center ? ", centered" : "") +
               ", window " + std::to_string(c.window) + (graph ? ", graph" : ", eager"));
  std::mt19937_64 rng(seed);
  KVCache eager(config_of(c), Device::cuda()), stepped(config_of(c), Device::cuda());
  std::vector<SeqId> ids;
  const std::vector<size_t> prompts = {0, 5, 63, 64, 200};
  for (const size_t n : prompts) {
    ids.push_back(eager.add_sequence());
    ASSERT_EQ(stepped.add_sequence(), ids.back());
    if (n == 0) continue;
    for (int l = 0; l < kLayers; ++l) {
      const std::vector<float> k = tokens(rng, n, true), v = tokens(rng, n, false);
      eager.append(ids.back(), l, k.data(), v.data(), n);
      stepped.append(ids.back(), l, k.data(), v.data(), n);
    }
  }
  const size_t B = ids.size(), n_q = static_cast<size_t>(kHeads * kGroup);
  AttentionOptions options;
  options.window = c.window;
  const std::vector<int> layers = {0, 1};
  const std::vector<AttentionOptions> per_layer(layers.size(), options);
  cuda::DecodeStep step(stepped, ids, layers, static_cast<int>(n_q), per_layer, kMaxTokens);

  cudaStream_t stream = nullptr;
  ASSERT_EQ(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), cudaSuccess);
  cuda::DeviceFloats k_dev(B * kHeads * kDim), v_dev(k_dev.size()), q_dev(B * n_q * kDim), out_dev(q_dev.size()),
      eager_out(q_dev.size());
  std::vector<cuda::DeviceFloats> ks, vs, qs, outs;  // per layer: the arrays a captured graph reads and writes
  for (int l = 0; l < kLayers; ++l) {
    ks.emplace_back(k_dev.size());
    vs.emplace_back(k_dev.size());
    qs.emplace_back(q_dev.size());
    outs.emplace_back(q_dev.size());
  }
  cudaGraphExec_t exec = nullptr;
  const std::vector<size_t> ones(B, 1);
  for (int s = 0; s < steps; ++s) {
    SCOPED_TRACE("step " + std::to_string(s));
    std::vector<std::vector<float>> k(kLayers), v(kLayers), q(kLayers);
    for (int l = 0; l < kLayers; ++l) {
      k[l] = tokens(rng, B, true);
      v[l] = tokens(rng, B, false);
      std::normal_distribution<float> normal(0.0f, 1.0f);
      q[l].resize(q_dev.size());
      for (float& x : q[l]) x = normal(rng);
      ks[l].upload(k[l]);
      vs[l].upload(v[l]);
      qs[l].upload(q[l]);
      outs[l].fill(NAN);
    }
    step.prepare(stream);
    if (!graph || exec == nullptr) {
      if (graph) {
        ASSERT_EQ(cudaStreamBeginCapture(stream, cudaStreamCaptureModeThreadLocal), cudaSuccess);
      }
      for (int l = 0; l < kLayers; ++l)
        step.run(l, ks[l].data(), vs[l].data(), qs[l].data(), outs[l].data(), stream);
      if (graph) {
        cudaGraph_t g = nullptr;
        ASSERT_EQ(cudaStreamEndCapture(stream, &g), cudaSuccess);
        ASSERT_EQ(cudaGraphInstantiate(&exec, g, 0), cudaSuccess);
        cudaGraphDestroy(g);
      }
    }
    if (graph) {
      ASSERT_EQ(cudaGraphLaunch(exec, stream), cudaSuccess);
    }
    ASSERT_EQ(cudaStreamSynchronize(stream), cudaSuccess);
    for (int l = 0; l < kLayers; ++l) {
      SCOPED_TRACE("layer " + std::to_string(l));
      k_dev.upload(k[l]);
      v_dev.upload(v[l]);
      q_dev.upload(q[l]);
      eager.append_device_batch(ids, l, k_dev.data(), v_dev.data(), ones);
      decode_attention(eager, l, ids, {q_dev.data(), q_dev.size()}, {eager_out.data(), eager_out.size()}, options);
      expect_close(outs[l].download(), eager_out.download());
      if (::testing::Test::HasFailure()) break;
    }
    if (::testing::Test::HasFailure()) break;
  }
  step.check(stream);
  if (exec) cudaGraphExecDestroy(exec);
  cudaStreamDestroy(stream);
  for (const SeqId id : ids) EXPECT_EQ(stepped.length(id, 0), eager.length(id, 0));
  expect_same_caches(eager, stepped, ids);
  EXPECT_EQ(step.steps(), static_cast<size_t>(steps));
}

const std::vector<StepCase> kCases = {
    {"f16", "f16"},          {"int4", "int4"},         {"int8", "int8", 64},
    {"kivi:2", "kivi:2"},    {"kivi:4", "int4", 0, true}, {"turbo_mse:3", "turbo_mse:3", 64, true},
    {"int4", "int4", 0, false, 100}, {"kivi:2", "kivi:2", 64, false, 150}};

TEST(CudaDecodeStep, EagerStepsEqualAppendThenDecode) {
  KVQ_REQUIRE_GPU();
  KVQ_FRESH_SEED();
  for (const StepCase& c : kCases) run_steps(c, 140, false, seed);
}

TEST(CudaDecodeStep, CapturedStepsReplayedEqualAppendThenDecode) {
  KVQ_REQUIRE_GPU();
  KVQ_FRESH_SEED();
  for (const StepCase& c : kCases) run_steps(c, 140, true, seed + 1);
}

struct SmallStep {
  KVCache cache;
  std::vector<SeqId> ids;
  explicit SmallStep(size_t capacity_pages) : cache([&] {
    CacheConfig cfg = config_of({"int4", "int4"});
    cfg.capacity_pages = capacity_pages;
    return cfg;
  }(), Device::cuda()) {
    ids = {cache.add_sequence(), cache.add_sequence()};
  }
};

TEST(CudaDecodeStep, ANanTokenIsReportedAndEndsTheSteps) {
  KVQ_REQUIRE_GPU();
  SmallStep s(8);
  const std::vector<int> layers = {0, 1};
  const std::vector<AttentionOptions> options(2);
  cuda::DecodeStep step(s.cache, s.ids, layers, kHeads * kGroup, options, 256);
  cuda::DeviceFloats k(2 * kHeads * kDim), v(k.size()), q(2 * kHeads * kGroup * kDim), out(q.size());
  v.fill(0.5f);
  q.fill(0.1f);
  std::vector<float> keys(k.size(), 1.0f);
  keys[kHeads * kDim + 5] = NAN;  // sequence 1, head 0, channel 5
  k.upload(keys);
  step.prepare();
  step.run(1, k.data(), v.data(), q.data(), out.data());
  step.run(0, v.data(), v.data(), q.data(), out.data());
  try {
    step.check();
    FAIL() << "no error";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("layer 1"), std::string::npos) << what;
    EXPECT_NE(what.find("sequence " + std::to_string(s.ids[1])), std::string::npos) << what;
    EXPECT_NE(what.find("channel 5"), std::string::npos) << what;
    EXPECT_NE(what.find("NaN"), std::string::npos) << what;
  }
  EXPECT_THROW(step.prepare(), Error);
}

TEST(CudaDecodeStep, AFullPoolOrMaxTokensStopsAStepBeforeItChangesAnything) {
  KVQ_REQUIRE_GPU();
  SmallStep s(2);  // one page for each of two layers of one sequence
  const std::vector<int> layers = {0, 1};
  const std::vector<AttentionOptions> options(2);
  cuda::DecodeStep step(s.cache, s.ids, layers, kHeads * kGroup, options, 100);
  cuda::DeviceFloats k(2 * kHeads * kDim), q(2 * kHeads * kGroup * kDim), out(q.size());
  k.fill(0.25f);
  q.fill(0.1f);
  for (int t = 0; t < kT - 1; ++t) {  // windows of T - 1 tokens: the next step encodes 4 pages
    step.prepare();
    for (int l : layers) step.run(l, k.data(), k.data(), q.data(), out.data());
  }
  step.check();
  EXPECT_THROW(step.prepare(), Error);
  EXPECT_EQ(s.cache.length(s.ids[0], 0), static_cast<size_t>(kT - 1));
  EXPECT_EQ(s.cache.free_pages(), 2u);

  SmallStep t(8);
  cuda::DecodeStep capped(t.cache, t.ids, layers, kHeads * kGroup, options, 3);
  for (int i = 0; i < 3; ++i) {
    capped.prepare();
    for (int l : layers) capped.run(l, k.data(), k.data(), q.data(), out.data());
  }
  EXPECT_THROW(capped.prepare(), Error);
  capped.check();
  EXPECT_EQ(t.cache.length(t.ids[1], 1), 3u);
}

TEST(CudaDecodeStep, BadArgumentsAreErrors) {
  KVQ_REQUIRE_GPU();
  SmallStep s(8);
  const std::vector<int> layers = {0};
  const std::vector<AttentionOptions> one(1), two(2);
  EXPECT_THROW(cuda::DecodeStep(s.cache, {}, layers, 8, one, 10), Error);
  EXPECT_THROW(cuda::DecodeStep(s.cache, s.ids, layers, 8, two, 10), Error);
  EXPECT_THROW(cuda::DecodeStep(s.cache, s.ids, std::vector<int>{0, 0}, 8, two, 10), Error);
  EXPECT_THROW(cuda::DecodeStep(s.cache, s.ids, std::vector<int>{2}, 8, one, 10), Error);
  EXPECT_THROW(cuda::DecodeStep(s.cache, s.ids, layers, 8, one, 0), Error);
  EXPECT_THROW(cuda::DecodeStep(s.cache, s.ids, layers, 8, one, 1'000'000), Error);  // more pages than the pool
  EXPECT_THROW(cuda::DecodeStep(s.cache, s.ids, layers, 6, one, 10), Error);         // not a multiple of kv heads
  const std::vector<SeqId> twice = {s.ids[0], s.ids[0]};
  EXPECT_THROW(cuda::DecodeStep(s.cache, twice, layers, 8, one, 10), Error);
  cuda::DecodeStep step(s.cache, s.ids, layers, 8, one, 10);
  cuda::DeviceFloats x(2 * 8 * kDim);
  EXPECT_THROW(step.run(0, x.data(), x.data(), x.data(), x.data()), Error);  // not prepared
  step.prepare();
  EXPECT_THROW(step.run(1, x.data(), x.data(), x.data(), x.data()), Error);      // not a layer of the step
  EXPECT_THROW(step.run(0, x.data() + 1, x.data(), x.data(), x.data()), Error);  // keys not 16-byte aligned
}

}  // namespace
}  // namespace kvq

// CUDA decode attention with a sliding window (AttentionOptions::window, Gemma 3's local layers) against the CPU's
// decode attention over the same cache (KVCache::to copies it to the device) and the double-precision reference over the
// window's decoded tokens: windows that start inside a page, on a page boundary, inside the fp32 window, or before
// the sequence; batches of sequences of different lengths, GQA groups 1-8; the tolerance of the device-vs-CPU decode
// tests. A window that covers every sequence gives the no-window result bit for bit.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "attention_test_util.hpp"
#include "gpu_test.hpp"
#include "kvq/cuda.hpp"
#include "test_seed.hpp"

namespace kvq {
namespace {

using test::Shape;

// Codec pairs of the default build: f16 (copy engine), the int and kivi formats, turbo_mse, turbo_prod (a value
// space in parts: two warps per range) and vecinfer (codebook in shared memory, trained).
const std::vector<std::pair<std::string, std::string>> kWindowPairs = {
    {"f16", "f16"},       {"int4", "int4"},
    {"int8", "int8"},     {"kivi:2", "kivi:2"},
    {"kivi:4", "int4"},   {"turbo_mse:3", "turbo_mse:3"},
    {"turbo_prod:4", "turbo_prod:4"}, {"vecinfer:10/4", "vecinfer:10/4"},
    {"kivi:3", "kivi:3"}};

std::vector<float> device_decode(const KVCache& dev, const std::vector<SeqId>& ids,
                                 const std::vector<float>& q, const AttentionOptions& options) {
  cuda::DeviceFloats q_dev(q.size()), out_dev(q.size());
  q_dev.upload(q);
  out_dev.fill(NAN);  // every element must be written
  decode_attention(dev, 1, ids, {q_dev.data(), q_dev.size()}, {out_dev.data(), out_dev.size()}, options);
  return out_dev.download();
}

// The device against the windowed reference and the CPU kernels at 1e-3 (plus fp32 score rounding), per window.
void expect_windows_match(const Shape& shape, const std::string& k, const std::string& v, uint64_t seed,
                          const std::vector<size_t>& windows, int splits = 0) {
  const test::Scenario sc = test::build(shape, k, v, seed);
  const KVCache dev = sc.cache.to(Device::cuda());
  const size_t d = static_cast<size_t>(shape.d);
  for (const size_t window : windows) {
    SCOPED_TRACE(k + "/" + v + ", " + test::describe(shape) + ", window " + std::to_string(window) + ", splits " +
                 std::to_string(splits));
    const auto q = test::queries(shape, sc.ids.size(), seed + window);
    AttentionOptions options;
    options.window = window;
    options.splits = splits;
    const std::vector<float> got = device_decode(dev, sc.ids, q, options);
    for (float x : got) ASSERT_TRUE(std::isfinite(x));
    std::vector<float> cpu(q.size(), NAN);
    decode_attention(sc.cache, 1, sc.ids, q, cpu, options);
    const test::Reference ref = test::reference_decode(sc, q, shape.G, true, window);
    EXPECT_LE(test::worst(got, ref.out, ref, d, 1e-3, true), 1.0) << "against the reference";
    EXPECT_LE(test::worst(got, cpu, ref, d, 1e-3, true), 1.0) << "against the CPU";
  }
}

// Gemma 3's local layers: window 512, head dimension 256, one kv head for four query heads, a batch of contexts
// shorter than, equal to, one past and far beyond the window.
TEST(CudaSlidingWindow, GemmaWindowMatchesTheCpu) {
  KVQ_REQUIRE_GPU();
  KVQ_FRESH_SEED();
  for (const auto& [k, v] : kWindowPairs) {
    expect_windows_match({256, 64, 0, 1, 4, {300, 512, 513, 2000, 5000}, true}, k, v, seed, {512});
    expect_windows_match({128, 128, 0, 2, 8, {300, 512, 513, 2000, 5000}, true}, k, v, seed + 1, {512});
  }
}

// Windows that are not whole pages or chunks (1, 100, 511), one longer than every sequence (5000), and fp32 windows
// of 64 and 128 tokens, in which the shorter windows start; GQA groups 1, 2 and 4.
TEST(CudaSlidingWindow, WindowsInsidePagesAndTheFp32Window) {
  KVQ_REQUIRE_GPU();
  KVQ_FRESH_SEED();
  for (const auto& [k, v] : kWindowPairs) {
    expect_windows_match({128, 64, 64, 2, 4, {0, 1, 63, 200, 700, 1000}, true}, k, v, seed, {1, 100, 511, 5000});
    expect_windows_match({128, 128, 128, 1, 2, {130, 300, 777}, false}, k, v, seed + 1, {40, 100, 200, 511});
    expect_windows_match({64, 64, 0, 3, 1, {77, 300, 1000}, true}, k, v, seed + 2, {1, 64, 100, 511});
  }
}

// The split counts do not change which tokens a window sees.
TEST(CudaSlidingWindow, SplitCountsGiveTheSameAnswer) {
  KVQ_REQUIRE_GPU();
  KVQ_FRESH_SEED();
  for (int splits : {1, 3, 64})
    expect_windows_match({128, 64, 0, 2, 4, {900, 64, 0, 5000}, true}, "int4", "int4", seed, {100, 512}, splits);
}

// A window at least as long as every sequence is no window: the same kernels on the same pages, bit for bit.
TEST(CudaSlidingWindow, WindowCoveringEverySequenceIsNoWindow) {
  KVQ_REQUIRE_GPU();
  KVQ_FRESH_SEED();
  for (const auto& [k, v] : kWindowPairs) {
    SCOPED_TRACE(k + "/" + v);
    const Shape shape{128, 64, 64, 2, 4, {0, 5, 130, 1000}, true};
    const test::Scenario sc = test::build(shape, k, v, seed);
    const KVCache dev = sc.cache.to(Device::cuda());
    const auto q = test::queries(shape, sc.ids.size(), seed + 3);
    const int n_q = shape.H * shape.G;
    const std::vector<float> none = device_decode(dev, sc.ids, q, {});
    const test::Reference ref = test::reference_decode(sc, q, shape.G, true);
    EXPECT_LE(test::worst(none, ref.out, ref, static_cast<size_t>(shape.d), 1e-3, true), 1.0);
    for (const size_t window : {size_t{1000}, size_t{1} << 40}) {
      AttentionOptions options;
      options.window = window;
      EXPECT_EQ(device_decode(dev, sc.ids, q, options), none) << "window " << window;
      EXPECT_EQ(DecodePlan(dev, 1, sc.ids, n_q, options).splits(),
                DecodePlan(dev, 1, sc.ids, n_q).splits());
    }
  }
}

// A windowed plan run again on the same arrays replays its captured graph, the window-start launch included.
TEST(CudaSlidingWindow, RepeatedRunsOfAPlanFollowTheirInputs) {
  KVQ_REQUIRE_GPU();
  KVQ_FRESH_SEED();
  const Shape shape{128, 64, 64, 2, 4, {700, 90, 2000}, true};
  const test::Scenario sc = test::build(shape, "kivi:2", "kivi:2", seed);
  const KVCache dev = sc.cache.to(Device::cuda());
  const int n_q = shape.H * shape.G;
  AttentionOptions options;
  options.window = 300;
  DecodePlan plan(dev, 1, sc.ids, n_q, options);
  cuda::DeviceFloats q_dev(sc.ids.size() * static_cast<size_t>(n_q * shape.d)), out_dev(q_dev.size());
  for (int call = 0; call < 4; ++call) {
    SCOPED_TRACE("call " + std::to_string(call));
    const auto q = test::queries(shape, sc.ids.size(), seed + 20 + static_cast<uint64_t>(call));
    q_dev.upload(q);
    out_dev.fill(NAN);
    plan.run({q_dev.data(), q_dev.size()}, {out_dev.data(), out_dev.size()});
    const std::vector<float> got = out_dev.download();
    const test::Reference ref = test::reference_decode(sc, q, shape.G, true, options.window);
    EXPECT_LE(test::worst(got, ref.out, ref, static_cast<size_t>(shape.d), 1e-3, true), 1.0);
  }
}

}  // namespace
}  // namespace kvq

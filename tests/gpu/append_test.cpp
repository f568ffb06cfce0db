// The append kernels (KVCache::append_device) against the CPU encoders: every codec with a device encoder,
// fresh Gaussian and key-like (outlier) tokens (kivi also zeros of both signs as range ends), one-token appends
// and prefill chunks that cross page boundaries, centered keys. Pages are compared byte for byte where the device
// follows the CPU's float order (f32, f16, bf16, kivi, qjl, and int8/int4/turbo_mse/turbo_prod/turbo_rvq/vecinfer
// under the default Hadamard rotation: "Bytes" tests); under a dense rotation (srft, householder) the differing
// codes are counted and the reconstruction error must be within 1% of the CPU's ("Error" test). Windows must be
// equal exactly. Errors leave the cache unchanged. Batched appends (append_device_batch: many sequences of
// different lengths in one call) equal one CPU append per sequence, and an error anywhere in a batch leaves every
// sequence unchanged. The device cache copied back to the host (to(Device::cpu())) equals the CPU cache that took
// the same appends.
#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

#include "cache_test_util.hpp"
#include "codec/vecinfer.hpp"
#include "codec_test_specs.hpp"
#include "gpu_test.hpp"
#include "kvq/attention.hpp"
#include "kvq/codec.hpp"
#include "kvq/cuda.hpp"
#include "kvq/detail/random.hpp"
#include "kvq/error.hpp"
#include "test_seed.hpp"

namespace kvq {
namespace {

constexpr int kLayer = 1;

struct AppendShape {
  int d = 128, T = 64, R = 0, H = 2;
  bool center = false, key_like = true;
};

CacheConfig config_of(const AppendShape& s, const std::string& k, const std::string& v, uint64_t seed) {
  CacheConfig c;
  c.n_layers = 2;
  c.n_kv_heads = s.H;
  c.head_dim = s.d;
  c.block_tokens = s.T;
  c.residual_tokens = s.R;
  c.key_codec = k;
  c.value_codec = v;
  c.capacity_pages = 64;
  c.center_keys = s.center;
  c.seed = seed;
  return c;
}

// A host cache whose codecs are trained (int8/int4: lambda from key-like data, so it is not all 1).
KVCache trained_cache(const CacheConfig& cfg, uint64_t seed) {
  KVCache host(cfg);
  const std::string kname = CodecSpec::parse(cfg.key_codec).name;
  if (kname == "int4" || kname == "int8") {
    const size_t n = 1024;
    const auto keys = sample_profile(key_like_profile(cfg.head_dim, seed), n, seed + 3);
    const auto values = gaussian_vectors(n, cfg.head_dim, seed + 4);
    host.train_layer(kLayer, keys.data(), values.data(), n);
  }
  test::train_if_needed(host, seed, kLayer);
  return host;
}

// Slots per kv head of a device window: R + T - 1.
size_t window_slots(const KVCache& dev) {
  return static_cast<size_t>(dev.config().residual_tokens + dev.config().block_tokens - 1);
}

// The device cache's pages of (seq, layer), downloaded: n_pages x page_bytes.
std::vector<uint8_t> device_pages(const KVCache& dev, SeqId seq) {
  const LayerView v = dev.view(seq, kLayer);
  std::vector<uint8_t> out(v.pages.size() * dev.page_bytes());
  if (v.pages.size() == 0) return out;
  // Through host copies of the block table and each page.
  std::vector<PageId> table(v.pages.size());
  EXPECT_EQ(cudaMemcpy(table.data(), v.device_pages, table.size() * sizeof(PageId), cudaMemcpyDeviceToHost), cudaSuccess);
  for (size_t j = 0; j < table.size(); ++j)
    EXPECT_EQ(cudaMemcpy(out.data() + j * dev.page_bytes(), dev.page(0) + table[j] * dev.page_bytes(),
                         dev.page_bytes(), cudaMemcpyDeviceToHost),
              cudaSuccess);
  return out;
}

std::vector<float> device_window(const KVCache& dev, SeqId seq) {
  const LayerView v = dev.view(seq, kLayer);
  const CacheConfig& c = dev.config();
  std::vector<float> w(2 * static_cast<size_t>(c.n_kv_heads) * window_slots(dev) * c.head_dim);
  EXPECT_EQ(cudaMemcpy(w.data(), v.residual_keys, w.size() * sizeof(float), cudaMemcpyDeviceToHost), cudaSuccess);
  return w;
}

// The window's used slots only (the slots behind them are scratch).
std::vector<float> used_window(const KVCache& dev, SeqId seq) {
  const std::vector<float> all = device_window(dev, seq);
  const size_t d = static_cast<size_t>(dev.config().head_dim), slots = window_slots(dev);
  const size_t used = static_cast<size_t>(dev.view(seq, kLayer).residual_count);
  std::vector<float> w;
  for (size_t i = 0; i < all.size(); ++i)
    if (i / d % slots < used) w.push_back(all[i]);
  return w;
}

// Appends the same tokens in the same chunks to the host cache and (from device memory) to the device cache.
void append_both(KVCache& host, KVCache& dev, SeqId hs, SeqId ds, const test::Tokens& t,
                 const std::vector<size_t>& chunks) {
  const size_t row = static_cast<size_t>(host.config().n_kv_heads) * host.config().head_dim;
  const size_t n = t.keys.size() / row;
  cuda::DeviceFloats keys(t.keys.size()), values(t.values.size());
  keys.upload(t.keys);
  values.upload(t.values);
  for (size_t i = 0, pos = 0; pos < n; ++i) {
    const size_t step = std::min(chunks[i % chunks.size()], n - pos);
    host.append(hs, kLayer, t.keys.data() + pos * row, t.values.data() + pos * row, step);
    dev.append_device(ds, kLayer, keys.data() + pos * row, values.data() + pos * row, step);
    pos += step;
  }
  ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
}

// The window of the host cache in the device layout: keys [H][slots][d], then values.
std::vector<float> host_window(const KVCache& host, SeqId seq, size_t slots) {
  const LayerView v = host.view(seq, kLayer);
  const size_t H = static_cast<size_t>(host.config().n_kv_heads), d = static_cast<size_t>(host.config().head_dim);
  std::vector<float> w(2 * H * slots * d, 0.0f);
  for (size_t h = 0; h < H; ++h) {
    std::memcpy(w.data() + h * slots * d, v.residual_key(static_cast<int>(h)), v.residual_count * d * sizeof(float));
    std::memcpy(w.data() + (H + h) * slots * d, v.residual_value(static_cast<int>(h)),
                v.residual_count * d * sizeof(float));
  }
  return w;
}

// Windows equal in their used slots.
void expect_same_window(const KVCache& host, const KVCache& dev, SeqId hs, SeqId ds) {
  const size_t slots = window_slots(dev), d = static_cast<size_t>(host.config().head_dim);
  const int used = host.view(hs, kLayer).residual_count;
  ASSERT_EQ(dev.view(ds, kLayer).residual_count, used);
  const std::vector<float> want = host_window(host, hs, slots), got = device_window(dev, ds);
  size_t differ = 0;
  for (size_t i = 0; i < want.size(); ++i)
    if (i / d % slots < static_cast<size_t>(used) && std::memcmp(&want[i], &got[i], 4) != 0) ++differ;
  EXPECT_EQ(differ, 0u) << "window floats differ";
}

// Where byte b of a page lies: "key block of head 1, byte 70", or "padding".
std::string page_byte_place(const KVCache& host, size_t b) {
  for (int h = 0; h < host.config().n_kv_heads; ++h)
    for (const bool key : {true, false}) {
      const size_t off = key ? host.key_block_offset(h) : host.value_block_offset(h);
      const size_t bytes = (key ? host.key_codec(kLayer) : host.value_codec(kLayer)).block_bytes();
      if (b >= off && b < off + bytes)
        return std::string(key ? "key" : "value") + " block of head " + std::to_string(h) + ", byte " +
               std::to_string(b - off) + " of " + std::to_string(bytes);
    }
  return "padding";
}

// Every page byte equal.
void expect_same_pages(const KVCache& host, const KVCache& dev, SeqId hs, SeqId ds) {
  const LayerView hv = host.view(hs, kLayer);
  ASSERT_EQ(dev.view(ds, kLayer).pages.size(), hv.pages.size());
  const std::vector<uint8_t> got = device_pages(dev, ds);
  const size_t P = host.page_bytes();
  size_t differ = 0, first = got.size();
  for (size_t j = 0; j < hv.pages.size(); ++j)
    for (size_t b = 0; b < P; ++b)
      if (host.page(hv.pages[j])[b] != got[j * P + b] && differ++ == 0) first = j * P + b;
  if (differ == 0) return;
  const unsigned want = host.page(hv.pages[first / P])[first % P], have = got[first];
  ADD_FAILURE() << differ << " of " << got.size() << " page bytes differ; the first: page " << first / P << ", "
                << page_byte_place(host, first % P) << ": cpu 0x" << std::hex << want << ", device 0x" << have;
}

// Bit-exact codecs: every page byte and window float equal after the same appends of tokens t.
void expect_same_bytes(const std::string& spec, const AppendShape& s, uint64_t seed, const std::vector<size_t>& chunks,
                       const test::Tokens& t) {
  SCOPED_TRACE(spec + " d=" + std::to_string(s.d) + " T=" + std::to_string(s.T) + " R=" + std::to_string(s.R) +
               (s.key_like ? " key-like" : " gaussian") + (s.center ? " centered" : ""));
  const CacheConfig cfg = config_of(s, spec, spec, seed);
  KVCache host = trained_cache(cfg, seed);
  KVCache dev = host.to(Device::cuda());
  const SeqId hs = host.add_sequence(), ds = dev.add_sequence();
  append_both(host, dev, hs, ds, t, chunks);
  expect_same_pages(host, dev, hs, ds);
  expect_same_window(host, dev, hs, ds);
}

// The same on n_tokens of test::make_tokens.
void expect_same_bytes(const std::string& spec, const AppendShape& s, uint64_t seed, const std::vector<size_t>& chunks,
                       size_t n_tokens) {
  const CacheConfig cfg = config_of(s, spec, spec, seed);
  expect_same_bytes(spec, s, seed, chunks, test::make_tokens(cfg, n_tokens, seed + 7, s.key_like));
}

const std::vector<std::string> kExactSpecs = {
    "f32",          "f16",          "bf16",         "int8",         "int4",         "int4:16",
    "int8:64",      "kivi:2",       "kivi:4",       "kivi:2,g=64",  "turbo_mse:1",  "turbo_mse:2",
    "turbo_mse:3",  "turbo_mse:4",  "qjl",          "qjl:64",       "qjl:136",      "turbo_prod:2",
    "turbo_prod:3", "turbo_prod:4", "turbo_rvq:1",  "turbo_rvq:2",  "turbo_rvq:3",  "turbo_rvq:4",
    "vecinfer:8/4", "vecinfer:10/8", "vecinfer:12/8", "vecinfer:8/4,norm=1", "vecinfer:8/8,smooth=0",
    "kivi:3",       "kivi:3,g=16"};

TEST(CudaAppend, EveryCodecBytesEqualTheCpuEncoder) {
  KVQ_REQUIRE_GPU();
  KVQ_FRESH_SEED();
  for (const std::string& spec : kExactSpecs)
    for (const bool key_like : {false, true}) {
      AppendShape s;
      s.key_like = key_like;
      expect_same_bytes(spec, s, seed, {1, 37, 200, 1, 64}, 600);  // one-token steps and chunks across pages
    }
}

TEST(CudaAppend, WindowsHeadDimensionsAndPageSizesBytes) {
  KVQ_REQUIRE_GPU();
  KVQ_FRESH_SEED();
  // vecinfer:12/8's codebook (147 KB) fits in shared memory beside a page of 64 x 128 or 128 x 64 tokens, and
  // streams in tiles beside a page of 128 x 256.
  for (const std::string& spec :
       std::vector<std::string>{"f16", "int4", "kivi:2", "kivi:3", "turbo_mse:3", "qjl", "turbo_prod:3",
                                "turbo_rvq:2", "vecinfer:8/4", "vecinfer:12/8,norm=1"}) {
    expect_same_bytes(spec, {128, 64, 64, 2}, seed, {1}, 200);                  // decode steps, window R = 64
    expect_same_bytes(spec, {128, 64, 64, 2}, seed + 1, {300, 5, 130}, 700);   // prefill chunks behind a window
    expect_same_bytes(spec, {64, 128, 0, 3}, seed + 2, {129, 1, 256}, 600);
    expect_same_bytes(spec, {256, 128, 128, 1}, seed + 3, {1000}, 1000);
  }
}

TEST(CudaAppend, CenteredKeysBytes) {
  KVQ_REQUIRE_GPU();
  KVQ_FRESH_SEED();
  for (const std::string& spec : std::vector<std::string>{"int4", "int8", "kivi:2", "turbo_mse:3", "qjl",
                                                          "turbo_prod:3", "turbo_rvq:2", "vecinfer:8/4,norm=1"}) {
    AppendShape s;
    s.center = true;
    expect_same_bytes(spec, s, seed, {1, 37, 200, 1, 64}, 600);
    s.R = 64;
    expect_same_bytes(spec, s, seed + 1, {10, 1, 100}, 400);  // the first page's tokens partly in the window
  }
}

// kivi's ranges where the order of comparisons decides the bytes: zeros of both signs as the minimum or maximum of
// a value group or a key channel (the CPU keeps the first of equal minima and the last of equal maxima of a value
// group, the first of equal values of a key channel). Tokens [0, 300) have channels of one sign (key channels
// one-signed over a page), tokens [300, 600) rows of one sign (value groups one-signed); a fifth of the values are
// zeros of a random sign.
TEST(CudaAppend, KiviZerosOfBothSignsBytes) {
  KVQ_REQUIRE_GPU();
  KVQ_FRESH_SEED();
  AppendShape s;
  s.key_like = false;
  const size_t n = 600, H = static_cast<size_t>(s.H), d = static_cast<size_t>(s.d);
  test::Tokens t = test::make_tokens(config_of(s, "kivi:2", "kivi:2", seed), n, seed + 7, false);
  Rng rng(seed + 9);
  for (std::vector<float>* x : {&t.keys, &t.values})
    for (size_t i = 0; i < x->size(); ++i) {
      const size_t token = i / (H * d), c = i % d;
      const bool positive = token < 300 ? c % 2 == 0 : token % 2 == 0;
      float& v = (*x)[i];
      v = positive ? std::fabs(v) : -std::fabs(v);
      if (rng.next_u64() % 5 == 0) v = rng.next_u64() % 2 == 0 ? 0.0f : -0.0f;
    }
  for (const std::string& spec :
       std::vector<std::string>{"kivi:2", "kivi:4", "kivi:2,g=16", "kivi:4,g=128", "kivi:3", "kivi:3,g=64"})
    expect_same_bytes(spec, s, seed, {1, 37, 200, 1, 64}, t);
}

// Tokens whose smoothed, rotated sub-vectors lie (up to the rounding of the round trip) midway between two
// centroids: the nearest-centroid search meets near-ties everywhere, where only the CPU's distance formula, float
// order and lowest-index rule give the CPU's codes.
std::vector<float> vecinfer_near_ties(const Codec& c, size_t n, int H, uint64_t seed) {
  const auto* v = dynamic_cast<const VecInferCodec*>(&c);
  EXPECT_NE(v, nullptr);
  const int d = c.dim(), s = v->sub_dim(), K = v->centroids();
  const std::vector<float>& book = v->codebook();
  Rng rng(seed);
  std::vector<float> y(n * H * d), x(y.size());
  for (size_t j = 0; j < y.size() / s; ++j) {
    const size_t a = rng.next_u64() % K, b = rng.next_u64() % K;
    for (int i = 0; i < s; ++i) y[j * s + i] = 0.5f * (book[a * s + i] + book[b * s + i]);
  }
  c.from_space(y.data(), static_cast<int>(n * H), x.data());  // lambda ⊙ R^T y
  return x;
}

TEST(CudaAppend, VecInferNearTiesBytes) {
  KVQ_REQUIRE_GPU();
  KVQ_FRESH_SEED();
  for (const std::string& spec : std::vector<std::string>{"vecinfer:8/4", "vecinfer:10/8", "vecinfer:8/4,norm=1"}) {
    SCOPED_TRACE(spec);
    AppendShape s;
    const CacheConfig cfg = config_of(s, spec, spec, seed);
    KVCache host = trained_cache(cfg, seed);
    KVCache dev = host.to(Device::cuda());
    const SeqId hs = host.add_sequence(), ds = dev.add_sequence();
    const size_t n = 300;
    const test::Tokens t{vecinfer_near_ties(host.key_codec(kLayer), n, s.H, seed + 1),
                         vecinfer_near_ties(host.value_codec(kLayer), n, s.H, seed + 2)};
    append_both(host, dev, hs, ds, t, {1, 64, 200});
    expect_same_pages(host, dev, hs, ds);
    expect_same_window(host, dev, hs, ds);
  }
}

// Dense rotations (learned ones too: trained_cache learns them): the codes may differ where a coordinate lies at a
// rounding boundary; the reconstruction error (every decoded page token against the appended token) must be within
// 1% of the CPU encoder's.
TEST(CudaAppend, DenseRotationsReconstructionErrorWithinOnePercent) {
  KVQ_REQUIRE_GPU();
  KVQ_FRESH_SEED();
  for (const std::string& spec : std::vector<std::string>{
           "int4,rot=srft", "int8,rot=householder", "int4,learn=8", "int8:16,learn=4", "turbo_mse:3,rot=srft",
           "turbo_mse:2,rot=householder",
           "turbo_prod:3,rot=srft", "turbo_prod:2,rot=householder", "turbo_rvq:2,rot=srft",
           "vecinfer:8/4,rot=srft", "vecinfer:8/4,rot=householder,norm=1"}) {
    SCOPED_TRACE(spec);
    AppendShape s;
    const CacheConfig cfg = config_of(s, spec, spec, seed);
    KVCache host = trained_cache(cfg, seed);
    KVCache dev = host.to(Device::cuda());
    const SeqId hs = host.add_sequence(), ds = dev.add_sequence();
    const size_t n = 640;
    const test::Tokens t = test::make_tokens(cfg, n, seed + 7, true);
    append_both(host, dev, hs, ds, t, {1, 100, 300});
    const std::vector<uint8_t> got = device_pages(dev, ds);
    const LayerView hv = host.view(hs, kLayer);
    ASSERT_EQ(got.size(), hv.pages.size() * host.page_bytes());
    const size_t d = 128, T = 64, H = 2;
    double err_cpu = 0, err_dev = 0;
    size_t differ = 0;
    std::vector<float> a(T * d), b(T * d);
    for (size_t j = 0; j < hv.pages.size(); ++j)
      for (size_t h = 0; h < H; ++h)
        for (const bool key : {true, false}) {
          const Codec& c = key ? host.key_codec(kLayer) : host.value_codec(kLayer);
          const int hh = static_cast<int>(h);
          const size_t off = key ? host.key_block_offset(hh) : host.value_block_offset(hh);
          const uint8_t* cpu = host.page(hv.pages[j]) + off;
          const uint8_t* gpu = got.data() + j * host.page_bytes() + off;
          for (size_t i = 0; i < c.block_bytes(); ++i) differ += cpu[i] != gpu[i];
          c.decode(cpu, static_cast<int>(T), a.data());
          c.decode(gpu, static_cast<int>(T), b.data());
          const std::vector<float>& x = key ? t.keys : t.values;
          for (size_t tt = 0; tt < T; ++tt)
            for (size_t k = 0; k < d; ++k) {
              const double want = x[((j * T + tt) * H + h) * d + k];
              err_cpu += (a[tt * d + k] - want) * (a[tt * d + k] - want);
              err_dev += (b[tt * d + k] - want) * (b[tt * d + k] - want);
            }
        }
    std::printf("%s: %zu of %zu bytes differ, squared error %.6g (device) vs %.6g (cpu)\n", spec.c_str(), differ,
                got.size(), err_dev, err_cpu);
    EXPECT_GT(err_cpu, 0.0);
    EXPECT_LE(std::abs(err_dev - err_cpu), 0.01 * err_cpu);
    expect_same_window(host, dev, hs, ds);
  }
}

// A NaN, an Inf, or a value the codec cannot store: a clear error naming it, and the cache exactly as before.
// `too_large` is a key value beyond what the codec's fp16 fields hold (a scale, a value, a norm); 0 where every
// finite value fits (vecinfer stores only codes and a capped gamma).
TEST(CudaAppend, RejectedTokensLeaveTheCacheUnchanged) {
  KVQ_REQUIRE_GPU();
  KVQ_FRESH_SEED();
  const std::vector<std::pair<std::string, float>> cases = {
      {"int4", 1e9f},         {"f16", 1e6f},         {"qjl", 1e9f},
      {"turbo_prod:3", 1e9f}, {"turbo_rvq:2", 1e9f}, {"vecinfer:8/4,norm=1", 0.0f}};
  for (const auto& [spec, too_large] : cases) {
    SCOPED_TRACE(spec);
    AppendShape s;
    s.center = true;
    const CacheConfig cfg = config_of(s, spec, spec, seed);
    KVCache host = trained_cache(cfg, seed);
    KVCache dev = host.to(Device::cuda());
    const SeqId hs = host.add_sequence(), ds = dev.add_sequence();
    const test::Tokens t = test::make_tokens(cfg, 300, seed + 7, true);
    test::Tokens head{{t.keys.begin(), t.keys.begin() + 40 * 256}, {t.values.begin(), t.values.begin() + 40 * 256}};
    append_both(host, dev, hs, ds, head, {40});
    const std::vector<uint8_t> pages_before = device_pages(dev, ds);
    const std::vector<float> window_before = used_window(dev, ds);
    const size_t free_before = dev.free_pages();

    const size_t n = 100;  // crosses the first page boundary: the key offset would be set
    cuda::DeviceFloats keys(n * 256), values(n * 256);
    std::vector<float> bad(t.keys.begin() + 40 * 256, t.keys.begin() + 140 * 256);
    bad[(5 * 2 + 1) * 128 + 7] = NAN;  // token 5, head 1, channel 7
    keys.upload(bad);
    values.upload(std::vector<float>(t.values.begin() + 40 * 256, t.values.begin() + 140 * 256));
    try {
      dev.append_device(ds, kLayer, keys.data(), values.data(), n);
      ADD_FAILURE() << "a NaN key must be rejected";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("key of token 5 head 1 channel 7 is nan"), std::string::npos) << e.what();
    }
    bad[(5 * 2 + 1) * 128 + 7] = 0;
    if (too_large != 0) {
      bad[(70 * 2) * 128 + 3] = too_large;
      keys.upload(bad);
      try {
        dev.append_device(ds, kLayer, keys.data(), values.data(), n);
        ADD_FAILURE() << "a value beyond the codec's range must be rejected";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("beyond"), std::string::npos) << e.what();
        EXPECT_NE(std::string(e.what()).find(spec), std::string::npos) << e.what();
      }
    }
    EXPECT_EQ(dev.length(ds, kLayer), 40u);
    EXPECT_EQ(dev.free_pages(), free_before);
    EXPECT_EQ(device_pages(dev, ds), pages_before);
    EXPECT_EQ(used_window(dev, ds), window_before);
    // And it goes on as the host cache does.
    test::Tokens rest{{t.keys.begin() + 40 * 256, t.keys.end()}, {t.values.begin() + 40 * 256, t.values.end()}};
    append_both(host, dev, hs, ds, rest, {100, 1});
    expect_same_pages(host, dev, hs, ds);  // the key offset too: set by the first page that did get in
    expect_same_window(host, dev, hs, ds);
  }
}

// Every registered codec (codec_test_specs: each codec and bit width) has an append kernel that writes the CPU
// encoder's bytes: a codec registered without one fails here, named, with the reason append_device gives.
TEST(CudaAppend, EveryRegisteredCodecHasAnAppendKernel) {
  KVQ_REQUIRE_GPU();
  KVQ_FRESH_SEED();
  for (const std::string& spec : test::codec_test_specs()) {
    try {
      expect_same_bytes(spec, AppendShape{}, seed, {1, 99}, 200);
    } catch (const Error& e) {
      ADD_FAILURE() << spec << ": " << e.what();
    }
  }
}

// ---- batched appends ---------------------------------------------------------------------------------------

// Sequences appended in batches to a host cache (one append per sequence) and a device cache (one batch call).
struct BatchFixture {
  CacheConfig cfg;
  KVCache host;
  KVCache dev;
  std::vector<SeqId> hs, ds;
  std::vector<test::Tokens> tokens;  // each sequence's whole stream
  std::vector<size_t> pos;           // tokens appended so far

  BatchFixture(const CacheConfig& c, uint64_t seed, size_t n_seqs, size_t tokens_per_seq)
      : cfg(c), host(trained_cache(c, seed)), dev(host.to(Device::cuda())) {
    for (size_t i = 0; i < n_seqs; ++i) {
      hs.push_back(host.add_sequence());
      ds.push_back(dev.add_sequence());
      tokens.push_back(test::make_tokens(cfg, tokens_per_seq, seed + 100 + i, true));
      pos.push_back(0);
    }
  }
  size_t row() const { return static_cast<size_t>(cfg.n_kv_heads) * cfg.head_dim; }

  // The batch's inputs: every sequence's next n[i] tokens, concatenated.
  test::Tokens batch_input(const std::vector<size_t>& n) const {
    test::Tokens b;
    for (size_t i = 0; i < n.size(); ++i) {
      const size_t from = pos[i] * row(), to = (pos[i] + n[i]) * row();
      b.keys.insert(b.keys.end(), tokens[i].keys.begin() + from, tokens[i].keys.begin() + to);
      b.values.insert(b.values.end(), tokens[i].values.begin() + from, tokens[i].values.begin() + to);
    }
    return b;
  }
  // One device batch call with `input` (possibly altered); throws what the device throws.
  void device_batch(const test::Tokens& input, const std::vector<size_t>& n) {
    cuda::DeviceFloats k(std::max<size_t>(input.keys.size(), 1)), v(std::max<size_t>(input.values.size(), 1));
    if (!input.keys.empty()) {
      k.upload(input.keys);
      v.upload(input.values);
    }
    dev.append_device_batch(ds, kLayer, k.data(), v.data(), n);
  }
  // The same tokens to both caches.
  void append(const std::vector<size_t>& n) {
    device_batch(batch_input(n), n);
    for (size_t i = 0; i < n.size(); ++i) {
      if (n[i] == 0) continue;
      host.append(hs[i], kLayer, tokens[i].keys.data() + pos[i] * row(), tokens[i].values.data() + pos[i] * row(),
                  n[i]);
      pos[i] += n[i];
    }
  }
  void expect_same() const {
    for (size_t i = 0; i < hs.size(); ++i) {
      SCOPED_TRACE("sequence " + std::to_string(i) + " at " + std::to_string(pos[i]) + " tokens");
      expect_same_pages(host, dev, hs[i], ds[i]);
      expect_same_window(host, dev, hs[i], ds[i]);
    }
  }
};

// What a failed append must leave as it was: every sequence's pages, window and length, and the free pages.
struct DeviceState {
  std::vector<std::vector<uint8_t>> pages;
  std::vector<std::vector<float>> windows;
  std::vector<size_t> lengths;
  size_t free = 0;
  explicit DeviceState(const BatchFixture& f) : free(f.dev.free_pages()) {
    for (const SeqId s : f.ds) {
      pages.push_back(device_pages(f.dev, s));
      windows.push_back(used_window(f.dev, s));
      lengths.push_back(f.dev.length(s, kLayer));
    }
  }
  bool operator==(const DeviceState&) const = default;
};

CacheConfig batch_config(const std::string& spec, int R, bool center, size_t capacity, uint64_t seed) {
  AppendShape s;
  s.R = R;
  s.center = center;
  CacheConfig c = config_of(s, spec, spec, seed);
  c.capacity_pages = capacity;
  return c;
}

TEST(CudaAppend, BatchedAppendsBytesEqualPerSequenceCpuAppends) {
  KVQ_REQUIRE_GPU();
  KVQ_FRESH_SEED();
  for (const std::string& spec : std::vector<std::string>{"f16", "int4", "int8", "kivi:2", "turbo_mse:3"})
    for (const int R : {0, 64}) {
      SCOPED_TRACE(spec + " R=" + std::to_string(R));
      BatchFixture f(batch_config(spec, R, spec == "int4", 512, seed), seed, 7, 1200);
      // Prefill chunks of different lengths (empty, shorter than a page, on and across page boundaries), then decode
      // steps (one token each, some sequences idle), then prefill chunks onto sequences that hold windows.
      f.append({0, 1, 63, 64, 65, 200, 517});
      f.expect_same();
      for (int step = 0; step < 70; ++step) f.append({1, 1, 1, 1, static_cast<size_t>(step % 2), 1, 0});
      f.expect_same();
      f.append({300, 0, 129, 1, 64, 2, 191});
      f.expect_same();
    }
}

// Every append kernel family once, in shapes small enough for compute-sanitizer racecheck (bench/gpu/run.sh runs
// this test under it; the tests above take over 7 minutes there): one-token steps into a window, chunks across page
// boundaries, and a batch of sequences at different lengths with centered keys.
TEST(CudaAppend, SanitizerShapesEveryEncoderFamilyBytes) {
  KVQ_REQUIRE_GPU();
  KVQ_FRESH_SEED();
  for (const std::string& spec : std::vector<std::string>{"f16", "bf16", "int4", "int8", "kivi:2", "turbo_mse:3",
                                                          "qjl", "turbo_prod:3", "turbo_rvq:2", "vecinfer:8/4"})
    expect_same_bytes(spec, {64, 64, 64, 1}, seed, {1, 70, 1, 64}, 200);
  BatchFixture f(batch_config("int4", 64, true, 64, seed), seed, 3, 200);
  f.append({0, 65, 1});
  f.append({1, 1, 1});
  f.append({70, 0, 2});
  f.expect_same();
}

TEST(CudaAppend, ErrorInOneSequenceRejectsTheWholeBatch) {
  KVQ_REQUIRE_GPU();
  KVQ_FRESH_SEED();
  for (const std::string& spec : std::vector<std::string>{"int4", "f16"}) {
    SCOPED_TRACE(spec);
    BatchFixture f(batch_config(spec, 64, spec == "int4", 256, seed), seed, 4, 600);
    f.append({40, 130, 0, 10});
    const DeviceState before(f);
    const std::vector<size_t> n = {100, 5, 200, 1};  // pages in sequences 0, 2 (its first: the key offset is set)
    const size_t row = f.row(), d = 128;
    test::Tokens bad = f.batch_input(n);
    const size_t seq2 = 100 + 5;  // sequence 2's first token in the batch
    bad.keys[(seq2 + 150) * row + 1 * d + 9] = NAN;  // sequence 2, token 150, head 1, channel 9
    try {
      f.device_batch(bad, n);
      ADD_FAILURE() << "a NaN key must reject the batch";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("sequence " + std::to_string(f.ds[2])), std::string::npos) << what;
      EXPECT_NE(what.find("key of token 150 head 1 channel 9 is nan"), std::string::npos) << what;
    }
    EXPECT_TRUE(DeviceState(f) == before);
    bad = f.batch_input(n);
    bad.values[(seq2 + 3) * row + 5] = INFINITY;  // sequence 2, token 3: in its first new page
    try {
      f.device_batch(bad, n);
      ADD_FAILURE() << "an Inf value must reject the batch";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("value of token 3 head 0 channel 5 is inf"), std::string::npos) << e.what();
    }
    EXPECT_TRUE(DeviceState(f) == before);
    bad = f.batch_input(n);
    // Sequence 2, token 100: in its second new page, so not in the mean that sets its key offset (int4 reports the
    // first channel of the scale group).
    bad.keys[(seq2 + 100) * row] = spec == "f16" ? 1e6f : 1e9f;
    try {
      f.device_batch(bad, n);
      ADD_FAILURE() << "a value beyond the codec's range must reject the batch";
    } catch (const Error& e) {
      const std::string what = e.what();
      EXPECT_NE(what.find("beyond"), std::string::npos) << what;
      EXPECT_NE(what.find(spec), std::string::npos) << what;
      EXPECT_NE(what.find("sequence " + std::to_string(f.ds[2])), std::string::npos) << what;
      EXPECT_NE(what.find("key of token 100 head 0 channel 0"), std::string::npos) << what;
    }
    EXPECT_TRUE(DeviceState(f) == before);
    // A sequence named twice, an unknown sequence, mismatched counts: rejected before anything runs.
    const std::vector<SeqId> twice = {f.ds[0], f.ds[1], f.ds[0]};
    const std::vector<size_t> three = {1, 1, 1};
    cuda::DeviceFloats k(3 * row), v(3 * row);
    EXPECT_THROW(f.dev.append_device_batch(twice, kLayer, k.data(), v.data(), three), Error);
    const std::vector<SeqId> unknown = {f.ds[0], 999};
    EXPECT_THROW(f.dev.append_device_batch(unknown, kLayer, k.data(), v.data(), std::vector<size_t>{1, 1}), Error);
    EXPECT_THROW(f.dev.append_device_batch(f.ds, kLayer, k.data(), v.data(), three), Error);
    EXPECT_TRUE(DeviceState(f) == before);
    // And the batch goes on as the host cache does (the key offset set by the batch that did get in).
    f.append(n);
    f.expect_same();
  }
}

TEST(CudaAppend, ExhaustedPoolRejectsTheWholeBatch) {
  KVQ_REQUIRE_GPU();
  KVQ_FRESH_SEED();
  BatchFixture f(batch_config("int4", 0, false, 10, seed), seed, 3, 800);
  f.append({64, 100, 10});  // 2 pages taken
  const DeviceState before(f);
  const std::vector<size_t> too_many = {200, 364, 50};  // 3 + 6 + 0 new pages, 8 free
  try {
    f.device_batch(f.batch_input(too_many), too_many);
    ADD_FAILURE() << "the pool cannot hold the batch";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("exhausted"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(DeviceState(f) == before);
  f.append({200, 300, 50});  // 3 + 5 + 0: fits exactly
  f.expect_same();
  EXPECT_EQ(f.dev.free_pages(), 0u);
}

// Decode attention reads the block tables and windows a batch committed: over the batch-appended cache it equals
// decode over the device copy of the CPU cache that took the same appends.
TEST(CudaAppend, DecodeOverBatchAppendedCacheEqualsTheCopiedCpuCache) {
  KVQ_REQUIRE_GPU();
  KVQ_FRESH_SEED();
  for (const std::string& spec : std::vector<std::string>{"int4", "f16", "turbo_mse:3"}) {
    SCOPED_TRACE(spec);
    BatchFixture f(batch_config(spec, 64, spec == "int4", 256, seed), seed, 5, 800);
    f.append({0, 1, 200, 64, 333});
    for (int step = 0; step < 9; ++step) f.append({1, 1, 1, 1, 1});
    f.append({130, 0, 70, 1, 64});
    const KVCache copy = f.host.to(Device::cuda());
    const size_t n_q = 8, d = 128, n = f.ds.size();
    const std::vector<float> q = gaussian_vectors(n * n_q, static_cast<int>(d), seed + 99);
    cuda::DeviceFloats q_dev(q.size()), out_a(q.size()), out_b(q.size());
    q_dev.upload(q);
    decode_attention(f.dev, kLayer, f.ds, {q_dev.data(), q_dev.size()}, {out_a.data(), out_a.size()});
    decode_attention(copy, kLayer, f.hs, {q_dev.data(), q_dev.size()}, {out_b.data(), out_b.size()});
    EXPECT_EQ(out_a.download(), out_b.download());
  }
}

// CPU cache -> device -> batched appends on the device -> host: equal to the CPU cache that took the same appends.
TEST(CudaAppend, ToHostAfterDeviceAppendsEqualsTheCpuCache) {
  KVQ_REQUIRE_GPU();
  KVQ_FRESH_SEED();
  for (const std::string& spec : std::vector<std::string>{"int4", "f16", "turbo_mse:3", "kivi:2"}) {
    SCOPED_TRACE(spec);
    const CacheConfig cfg = batch_config(spec, 64, spec == "int4", 128, seed);
    KVCache host = trained_cache(cfg, seed);
    std::vector<test::Tokens> t;
    std::vector<SeqId> ids;
    for (size_t i = 0; i < 3; ++i) {
      ids.push_back(host.add_sequence());
      t.push_back(test::make_tokens(cfg, 700, seed + 10 + i, true));
    }
    test::append_range(host, ids[0], kLayer, t[0], 0, 150);
    test::append_range(host, ids[2], kLayer, t[2], 0, 30);
    KVCache dev = host.to(Device::cuda());
    const size_t row = 2 * 128;
    size_t pos[3] = {150, 0, 30};
    for (const std::vector<size_t>& n : std::vector<std::vector<size_t>>{{1, 64, 100}, {1, 1, 1}, {200, 300, 1}}) {
      std::vector<float> k, v;
      for (size_t i = 0; i < 3; ++i) {
        k.insert(k.end(), t[i].keys.begin() + pos[i] * row, t[i].keys.begin() + (pos[i] + n[i]) * row);
        v.insert(v.end(), t[i].values.begin() + pos[i] * row, t[i].values.begin() + (pos[i] + n[i]) * row);
        host.append(ids[i], kLayer, t[i].keys.data() + pos[i] * row, t[i].values.data() + pos[i] * row, n[i]);
        pos[i] += n[i];
      }
      cuda::DeviceFloats kd(k.size()), vd(v.size());
      kd.upload(k);
      vd.upload(v);
      dev.append_device_batch(ids, kLayer, kd.data(), vd.data(), n);
    }
    KVCache back = dev.to(Device::cpu());
    ASSERT_EQ(back.sequences(), host.sequences());
    EXPECT_EQ(back.free_pages(), host.free_pages());
    EXPECT_EQ(back.config().key_codec, host.config().key_codec);
    for (int l = 0; l < cfg.n_layers; ++l) {
      EXPECT_EQ(back.key_codec(l).trained(), host.key_codec(l).trained());
      if (host.key_codec(l).trained()) {
        EXPECT_EQ(back.key_codec(l).state(), host.key_codec(l).state());
      }
      if (host.value_codec(l).trained()) {
        EXPECT_EQ(back.value_codec(l).state(), host.value_codec(l).state());
      }
    }
    const size_t slots = window_slots(dev);
    for (const SeqId id : host.sequences())
      for (int l = 0; l < cfg.n_layers; ++l) {
        SCOPED_TRACE("sequence " + std::to_string(id) + " layer " + std::to_string(l));
        const LayerView a = host.view(id, l), b = back.view(id, l);
        ASSERT_EQ(a.pages.size(), b.pages.size());
        for (size_t j = 0; j < a.pages.size(); ++j)
          EXPECT_EQ(std::memcmp(host.page(a.pages[j]), back.page(b.pages[j]), host.page_bytes()), 0) << "page " << j;
        ASSERT_EQ(a.residual_count, b.residual_count);
        if (l == kLayer) {
          EXPECT_EQ(host_window(host, id, slots), host_window(back, id, slots));
        }
        ASSERT_EQ(a.key_offset == nullptr, b.key_offset == nullptr);
        if (a.key_offset != nullptr) {
          EXPECT_EQ(std::memcmp(a.key_offset, b.key_offset, row * sizeof(float)), 0);
        }
      }
    // The copy is a working cache: the next id and further appends go as on the original.
    const SeqId next = back.add_sequence();
    EXPECT_EQ(next, host.add_sequence());
    back.append(ids[1], kLayer, t[1].keys.data() + pos[1] * row, t[1].values.data() + pos[1] * row, 100);
    host.append(ids[1], kLayer, t[1].keys.data() + pos[1] * row, t[1].values.data() + pos[1] * row, 100);
    EXPECT_EQ(std::memcmp(back.page(back.view(ids[1], kLayer).pages.back()),
                          host.page(host.view(ids[1], kLayer).pages.back()), host.page_bytes()),
              0);
  }
}

// Decode attention over a cache built by append_device equals decode over the device copy of the host cache (the
// same bytes, the same kernel) and matches the CPU's decode attention.
TEST(CudaAppend, DecodeOverDeviceAppendedCacheMatchesTheCpuCache) {
  KVQ_REQUIRE_GPU();
  KVQ_FRESH_SEED();
  for (const std::string& spec : std::vector<std::string>{"int4", "int8", "f16", "bf16", "kivi:2", "turbo_mse:3"}) {
    SCOPED_TRACE(spec);
    AppendShape s;
    s.R = 64;
    s.center = spec == "int4";
    const CacheConfig cfg = config_of(s, spec, spec, seed);
    KVCache host = trained_cache(cfg, seed);
    KVCache dev = host.to(Device::cuda());
    std::vector<SeqId> hs, ds;
    for (size_t i = 0; i < 3; ++i) {
      hs.push_back(host.add_sequence());
      ds.push_back(dev.add_sequence());
      const test::Tokens t = test::make_tokens(cfg, 100 + 150 * i, seed + 10 * i, true);
      append_both(host, dev, hs.back(), ds.back(), t, {1, 77});
    }
    const KVCache copy = host.to(Device::cuda());
    const size_t n_q = 8, d = 128;
    const std::vector<float> q = gaussian_vectors(3 * n_q, static_cast<int>(d), seed + 99);
    cuda::DeviceFloats q_dev(q.size()), out_a(q.size()), out_b(q.size());
    q_dev.upload(q);
    decode_attention(dev, kLayer, ds, {q_dev.data(), q_dev.size()}, {out_a.data(), out_a.size()});
    decode_attention(copy, kLayer, hs, {q_dev.data(), q_dev.size()}, {out_b.data(), out_b.size()});
    const std::vector<float> a = out_a.download(), b = out_b.download();
    EXPECT_EQ(a, b);
    std::vector<float> cpu(q.size());
    decode_attention(host, kLayer, hs, q, cpu);
    double worst = 0;
    for (size_t i = 0; i < a.size(); ++i) worst = std::max(worst, static_cast<double>(std::abs(a[i] - cpu[i])));
    EXPECT_LE(worst, 2e-3);
  }
}

}  // namespace
}  // namespace kvq

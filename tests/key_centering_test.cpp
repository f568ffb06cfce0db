// Centered keys (cache.hpp): the offset is the first page's mean, the cache reads back the keys themselves once it
// is added, attention does not see it, chunking does not change it, files keep it, it cuts the quantization error
// of keys that share a large common part, and a runner's cache centers the layers chosen for it.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <vector>

#include "cache_test_util.hpp"
#include "core/crc32c.hpp"
#include "kvq/attention.hpp"
#include "kvq/cache.hpp"
#include "kvq/detail/random.hpp"
#include "model/kv_store.hpp"
#include "test_seed.hpp"

namespace kvq {
namespace {

using test::Tokens;

constexpr int kDim = 64, kHeads = 2;

CacheConfig config(const std::string& k, int R, bool center) {
  CacheConfig c;
  c.n_layers = 1;
  c.n_kv_heads = kHeads;
  c.head_dim = kDim;
  c.block_tokens = 64;
  c.key_codec = k;
  c.value_codec = "int8";
  c.residual_tokens = R;
  c.capacity_pages = 16;
  c.seed = 5;
  c.center_keys = center;
  return c;
}

// Key-like tokens (outlier channels) plus a common part of each head and channel, `scale` times the channel's
// spread with a random sign, as real keys have (Gemma 3 270M: the common part is 62-86 % of a key's norm).
Tokens offset_tokens(const CacheConfig& cfg, size_t n, uint64_t seed, float scale) {
  Tokens t = test::make_tokens(cfg, n, seed, true);
  const std::vector<float> sign = gaussian_vectors(kHeads, kDim, seed + 7);
  for (size_t e = 0; e < kHeads * kDim; ++e) {
    double ss = 0;
    for (size_t i = 0; i < n; ++i) ss += double{t.keys[i * kHeads * kDim + e]} * t.keys[i * kHeads * kDim + e];
    const float common = scale * static_cast<float>(std::sqrt(ss / static_cast<double>(n))) * (sign[e] < 0 ? -1.f : 1.f);
    for (size_t i = 0; i < n; ++i) t.keys[i * kHeads * kDim + e] += common;
  }
  return t;
}

double squared_error(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
  return s;
}

TEST(KeyCentering, OffsetIsTheFirstPageMeanAndTheKeysReadBack) {
  KVQ_FRESH_SEED();
  const CacheConfig cfg = config("int8", 0, true);
  KVCache cache(cfg);
  const Tokens t = offset_tokens(cfg, 150, seed, 8.f);
  const SeqId s = cache.add_sequence();
  test::append_range(cache, s, 0, t, 0, 63);
  EXPECT_EQ(cache.view(s, 0).key_offset, nullptr) << "no page yet";
  test::append_range(cache, s, 0, t, 63, 150);
  const LayerView v = cache.view(s, 0);
  ASSERT_NE(v.key_offset, nullptr);
  for (int h = 0; h < kHeads; ++h) {
    for (int c = 0; c < kDim; ++c) {
      double mean = 0;
      for (int i = 0; i < 64; ++i) mean += t.keys[(static_cast<size_t>(i) * kHeads + h) * kDim + c];
      EXPECT_NEAR(v.key_offset[h * kDim + c], mean / 64, 1e-5 * (1 + std::abs(mean / 64)));
    }
    // Window tokens are exact up to the subtraction's rounding; pages within int8's error of the keys themselves.
    const Tokens got = test::decoded_head(cache, s, 0, h), want = test::original_head(t, cfg, 150, h);
    for (size_t i = 128 * kDim; i < 150 * kDim; ++i) EXPECT_NEAR(got.keys[i], want.keys[i], 1e-5f * (1 + std::abs(want.keys[i])));
    double worst = 0, range = 0;
    for (size_t i = 0; i < 128 * kDim; ++i) {
      worst = std::max(worst, std::abs(static_cast<double>(got.keys[i]) - want.keys[i]));
      range = std::max(range, std::abs(static_cast<double>(want.keys[i] - v.key_offset[h * kDim + i % kDim])));
    }
    EXPECT_LT(worst, range / 127 * 1.01) << "int8 of the centered keys: half a step of their range, or less";
  }
}

TEST(KeyCentering, FloatKeysAreNotCentered) {
  KVQ_FRESH_SEED();
  for (const char* k : {"f32", "f16", "bf16"}) {
    KVCache cache(config(k, 0, true));
    const Tokens t = offset_tokens(cache.config(), 100, seed, 8.f);
    const SeqId s = cache.add_sequence();
    test::append_range(cache, s, 0, t, 0, 100);
    EXPECT_EQ(cache.view(s, 0).key_offset, nullptr) << k;
    EXPECT_EQ(cache.memory().key_offset_bytes, 0u) << k;
  }
}

TEST(KeyCentering, ChunkSizesGiveTheSameCache) {
  KVQ_FRESH_SEED();
  const CacheConfig cfg = config("int4", 64, true);
  KVCache a(cfg), b(cfg);
  const Tokens t = offset_tokens(cfg, 300, seed, 4.f);
  const SeqId sa = a.add_sequence(), sb = b.add_sequence();
  test::append_range(a, sa, 0, t, 0, 300, {1});
  test::append_range(b, sb, 0, t, 0, 300, {100, 7, 64, 1});
  const LayerView va = a.view(sa, 0), vb = b.view(sb, 0);
  ASSERT_EQ(va.pages.size(), vb.pages.size());
  ASSERT_EQ(va.residual_count, vb.residual_count);
  for (size_t j = 0; j < va.pages.size(); ++j)
    EXPECT_EQ(std::memcmp(a.page(va.pages[j]), b.page(vb.pages[j]), a.page_bytes()), 0) << "page " << j;
  EXPECT_EQ(std::memcmp(va.key_offset, vb.key_offset, kHeads * kDim * 4), 0);
  for (int h = 0; h < kHeads; ++h)
    EXPECT_EQ(std::memcmp(va.residual_key(h), vb.residual_key(h), va.residual_count * kDim * 4), 0);
  EXPECT_EQ(a.memory().key_offset_bytes, size_t{kHeads} * kDim * 4);
}

// The kernels score the centered keys; the result is attention over the keys themselves (offset added back), in
// double, to fp32 accuracy: a score carries the rounding of its fp32 sum, u * sum_c |q_c k_c| / sqrt(d), which moves
// the output by at most twice that times the largest value; the tolerance is 4x that bound (the few roundings
// around it). Measured over 2400 query rows: error / max|out| 4e-7 at the median, 9e-6 at most, 1.4e-5 once
// (scores to 320, softmax on a few tokens), below a fixed 1e-5 x max|out| that failed that once.
TEST(KeyCentering, AttentionIsThatOfTheKeysThemselves) {
  KVQ_FRESH_SEED();
  const CacheConfig cfg = config("int4", 64, true);
  KVCache cache(cfg);
  const Tokens t = offset_tokens(cfg, 333, seed, 8.f);
  const SeqId s = cache.add_sequence();
  test::append_range(cache, s, 0, t, 0, 333);
  constexpr int kGroup = 4;
  const auto q = gaussian_vectors(kHeads * kGroup, kDim, seed + 1);
  std::vector<float> out(q.size());
  decode_attention(cache, 0, std::span<const SeqId>(&s, 1), q, out);
  for (int h = 0; h < kHeads; ++h) {
    const Tokens kv = test::decoded_head(cache, s, 0, h);
    const size_t n = kv.keys.size() / kDim;
    for (int g = 0; g < kGroup; ++g) {
      const float* qr = q.data() + (h * kGroup + g) * kDim;
      std::vector<double> w(n);
      double mx = -1e300, sum = 0, magnitude = 0, vmax = 0;  // magnitude: the largest sum |q_c k_c| / sqrt(d)
      for (size_t i = 0; i < n; ++i) {
        double dot = 0, abs_sum = 0;
        for (int c = 0; c < kDim; ++c) {
          const double p = static_cast<double>(qr[c]) * kv.keys[i * kDim + c];
          dot += p;
          abs_sum += std::abs(p);
        }
        mx = std::max(mx, w[i] = dot / std::sqrt(double{kDim}));
        magnitude = std::max(magnitude, abs_sum / std::sqrt(double{kDim}));
      }
      for (double& x : w) sum += (x = std::exp(x - mx));
      std::vector<double> want(kDim, 0.0);
      for (size_t i = 0; i < n; ++i)
        for (int c = 0; c < kDim; ++c) {
          want[c] += w[i] / sum * kv.values[i * kDim + c];
          vmax = std::max(vmax, static_cast<double>(std::abs(kv.values[i * kDim + c])));
        }
      const double tolerance = 4 * 2 * std::ldexp(1.0, -24) * magnitude * vmax;
      for (int c = 0; c < kDim; ++c)
        EXPECT_NEAR(out[(h * kGroup + g) * kDim + c], want[c], tolerance) << "head " << h << " query " << g;
    }
  }
}

TEST(KeyCentering, CutsTheErrorOfKeysWithACommonPart) {
  KVQ_FRESH_SEED();
  for (const char* k : {"int4", "turbo_mse:3"}) {
    double err[2] = {};
    for (bool center : {false, true}) {
      KVCache cache(config(k, 0, center));
      const Tokens t = offset_tokens(cache.config(), 256, seed, 2.f);
      const SeqId s = cache.add_sequence();
      test::append_range(cache, s, 0, t, 0, 256);
      for (int h = 0; h < kHeads; ++h)
        err[center] += squared_error(test::decoded_head(cache, s, 0, h).keys, test::original_head(t, cache.config(), 256, h).keys);
    }
    EXPECT_LT(err[1], err[0] / 4) << k << ": centered " << err[1] << ", as they are " << err[0];
  }
}

// Centering chosen per layer (LayerCodecs::center_keys, kvq calibrate): each layer of the runner's cache attends
// as the cache of its own centering does, bit for bit, and against the fp32 store (attention over the keys
// themselves) a centered layer is closer than the same codec on the keys as they are: centering moves no score
// beyond the codec's own error, and cuts that error for keys with a common part.
TEST(KeyCentering, PerLayerCenteringIsEachLayersOwnCache) {
  KVQ_FRESH_SEED();
  constexpr int kLayers = 2, kQueryHeads = 2 * kHeads, kTokens = 200, kQueries = 100;
  const KVShape shape{kLayers, kHeads, kQueryHeads, kDim, {}};
  KVCacheSpec mixed;
  mixed.seed = 5;
  mixed.layer_codecs = {LayerCodecs{"int4", "int8", true}, LayerCodecs{"int4", "int8", false}};
  KVCacheSpec plain{"int4", "int8"}, centered{"int4", "int8"};
  plain.seed = centered.seed = 5;
  centered.center_keys = true;
  std::unique_ptr<KVStore> stores[] = {make_compressed_kv_store(shape, kTokens, mixed, nullptr),
                                       make_compressed_kv_store(shape, kTokens, centered, nullptr),
                                       make_compressed_kv_store(shape, kTokens, plain, nullptr),
                                       make_float_kv_store(shape, kTokens)};
  const auto q = gaussian_vectors(kQueries * kQueryHeads, kDim, seed + 1);  // the newest positions' queries
  double error[kLayers] = {};  // the mixed store's squared distance from the fp32 store, per layer
  for (int l = 0; l < kLayers; ++l) {
    const Tokens t = offset_tokens(config("int4", 0, true), kTokens, seed, 8.f);  // the same keys in both layers
    std::vector<float> out[4];
    for (int i = 0; i < 4; ++i) {
      stores[i]->append(l, t.keys.data(), t.values.data(), kTokens);
      out[i].resize(q.size());
      stores[i]->attend(l, q.data(), kQueries, out[i].data());
    }
    EXPECT_EQ(out[0], out[l == 0 ? 1 : 2]) << "layer " << l;
    error[l] = squared_error(out[0], out[3]);
  }
  EXPECT_LT(error[0], error[1] / 2) << "centered " << error[0] << ", as they are " << error[1];
  EXPECT_GT(stores[0]->bytes(), stores[2]->bytes()) << "the centered layer's key offsets";
}

std::vector<char> read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

std::vector<float> attend(const KVCache& cache, SeqId s, uint64_t seed) {
  const auto q = gaussian_vectors(kHeads * 2, kDim, seed);
  std::vector<float> out(q.size());
  decode_attention(cache, 0, std::span<const SeqId>(&s, 1), q, out);
  return out;
}

TEST(KeyCentering, FilesKeepTheOffsetAndReadVersion2AsUncentered) {
  KVQ_FRESH_SEED();
  const std::string path = (std::filesystem::path(testing::TempDir()) / "kvq_key_centering.kvq").string();
  {
    KVCache cache(config("int4", 0, true));
    const Tokens t = offset_tokens(cache.config(), 200, seed, 8.f);
    const SeqId s = cache.add_sequence();
    test::append_range(cache, s, 0, t, 0, 200);
    cache.save(path);
    const KVCache loaded = KVCache::load(path);
    EXPECT_TRUE(loaded.config().center_keys);
    ASSERT_NE(loaded.view(s, 0).key_offset, nullptr);
    EXPECT_EQ(std::memcmp(loaded.view(s, 0).key_offset, cache.view(s, 0).key_offset, kHeads * kDim * 4), 0);
    EXPECT_EQ(attend(loaded, s, seed), attend(cache, s, seed));
  }
  // A version 2 file is this format without the center_keys byte (payload offset 36) and the per-layer offset
  // flags (with one sequence of one layer: the last byte).
  KVCache plain(config("int4", 0, false));
  const Tokens t = offset_tokens(plain.config(), 200, seed, 8.f);
  const SeqId s = plain.add_sequence();
  test::append_range(plain, s, 0, t, 0, 200);
  plain.save(path);
  std::vector<char> v3 = read_bytes(path);
  ASSERT_EQ(v3[24 + 36], 0);
  ASSERT_EQ(v3.back(), 0);
  std::vector<char> v2(v3.begin(), v3.begin() + 24 + 36);
  v2.insert(v2.end(), v3.begin() + 24 + 37, v3.end() - 1);
  const uint32_t version = 2, crc = crc32c(v2.data() + 24, v2.size() - 24);
  const uint64_t payload = v2.size() - 24;
  std::memcpy(v2.data() + 8, &version, 4);
  std::memcpy(v2.data() + 12, &crc, 4);
  std::memcpy(v2.data() + 16, &payload, 8);
  std::ofstream(path, std::ios::binary).write(v2.data(), static_cast<std::streamsize>(v2.size()));
  const KVCache old = KVCache::load(path);
  EXPECT_FALSE(old.config().center_keys);
  EXPECT_EQ(old.view(s, 0).key_offset, nullptr);
  EXPECT_EQ(attend(old, s, seed), attend(plain, s, seed));
  std::filesystem::remove(path);
}

}  // namespace
}  // namespace kvq

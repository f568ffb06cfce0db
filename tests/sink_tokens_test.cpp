// Sink tokens (CacheConfig::sink_tokens): the first S tokens of a sequence stay in f16 before the pages, read back
// rounded to f16 only, are attended exactly by decode and prefill (fused and generic page loops, both accuracy
// contracts, sliding windows, centered keys), survive save / load, are counted in memory(), and bad S or tokens f16
// cannot hold are errors.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <string>
#include <vector>

#include "attention_test_util.hpp"
#include "core/half.hpp"
#include "env_override.hpp"
#include "expect_error.hpp"
#include "kvq/attention.hpp"
#include "kvq/cache.hpp"
#include "temp_file.hpp"
#include "test_seed.hpp"

namespace kvq {
namespace {

using test::Tokens;

test::Scenario with_sinks(const test::Shape& shape, const std::string& k, const std::string& v, int sinks,
                          uint64_t seed, bool center_keys = false) {
  CacheConfig cfg = test::config_for(shape, k, v, seed);
  cfg.sink_tokens = sinks;
  cfg.center_keys = center_keys;
  test::Scenario sc{cfg, KVCache(cfg), {}, {}};
  test::train_if_needed(sc.cache, seed, 1);
  for (size_t i = 0; i < shape.lengths.size(); ++i) {
    sc.ids.push_back(sc.cache.add_sequence());
    sc.tokens.push_back(test::make_tokens(cfg, shape.lengths[i], seed + 10 * i, shape.key_like));
    test::append_range(sc.cache, sc.ids.back(), 1, sc.tokens.back(), 0, shape.lengths[i]);
  }
  return sc;
}

TEST(SinkTokens, FirstTokensReadBackInF16AndPagesStartAfterThem) {
  KVQ_FRESH_SEED();
  const test::Shape shape{64, 64, 0, 2, 1, {150}, true};
  const test::Scenario sc = with_sinks(shape, "int4", "int4", 5, seed);
  const LayerView v = sc.cache.view(sc.ids[0], 1);
  EXPECT_EQ(v.sink_count, 5);
  EXPECT_EQ(v.pages.size(), 2u);  // tokens 5 .. 132
  EXPECT_EQ(v.residual_count, 150 - 5 - 128);
  EXPECT_EQ(v.first_page_token(), 5u);
  EXPECT_EQ(sc.cache.length(sc.ids[0], 1), 150u);
  const Tokens got = test::decoded(sc.cache, sc.ids[0], 1);
  const size_t row = 2 * 64;
  for (size_t i = 0; i < 5 * row; ++i) {
    EXPECT_EQ(got.keys[i], round_f16(sc.tokens[0].keys[i])) << i;
    EXPECT_EQ(got.values[i], round_f16(sc.tokens[0].values[i])) << i;
  }
  for (size_t i = (150 - 17) * row; i < 150 * row; ++i) EXPECT_EQ(got.keys[i], sc.tokens[0].keys[i]) << "window";
  const CacheMemory m = sc.cache.memory();
  EXPECT_EQ(m.sink_bytes, 5u * 2 * 2 * 64 * 2);
  EXPECT_EQ(m.used_bytes, m.encoded_bytes + m.residual_bytes + m.block_table_bytes + m.codec_state_bytes +
                              m.key_offset_bytes + m.sink_bytes);
}

// Decode against the double-precision reference over the cache as read, for sequences shorter than S, ending in
// the sinks' last token, and longer; S = 0, 1, 4, 16 and more than a page; fused pairs and a generic one.
TEST(SinkTokens, DecodeMatchesTheReference) {
  KVQ_FRESH_SEED();
  ThreadPool pool(2);
  for (const auto& [k, v] : std::vector<std::pair<std::string, std::string>>{
           {"turbo_mse:3", "turbo_mse:3"}, {"int4", "int4"}, {"turbo_mse:4", "turbo_mse:2"}, {"kivi:2", "int8"}})
    for (int S : {0, 1, 4, 16, 70})
      for (int R : {0, 64}) {
        const test::Shape shape{64, 64, R, 2, 3, {3, 16, 70, 97, 200}, true};
        SCOPED_TRACE(k + "/" + v + " S=" + std::to_string(S) + " " + test::describe(shape));
        const test::Scenario sc = with_sinks(shape, k, v, S, seed);
        const auto q = test::queries(shape, shape.lengths.size(), seed + 1);
        const test::Reference ref = test::reference_decode(sc, q, shape.G, true);
        EXPECT_LE(test::vs_reference(test::decode(sc, q, &pool, 3), ref, 64), 1.0);
        EXPECT_LE(test::vs_reference(test::decode(sc, q, nullptr), ref, 64), 1.0);
      }
}

// The fast kernels (KVQ_ATTENTION=fast) run with sinks and stay within their own error's scale of the reference (a
// few percent of the output's magnitude for turbo_mse:3 keys; their masks are the exact kernels' code, which the
// tests above hold to 1e-5 on every instruction set: KVQ_ISA=scalar .. avx512bf16).
TEST(SinkTokens, FastKernelsStayCloseToTheExactOnes) {
  KVQ_FRESH_SEED();
  for (int S : {0, 4}) {
    const test::Shape shape{64, 64, 0, 2, 3, {130, 200}, true};
    const test::Scenario sc = with_sinks(shape, "turbo_mse:3", "int4", S, seed);
    const auto q = test::queries(shape, shape.lengths.size(), seed + 1);
    const test::Reference ref = test::reference_decode(sc, q, shape.G, true);
    std::vector<float> fast;
    {
      test::EnvOverride env("KVQ_ATTENTION", "fast");
      fast = test::decode(sc, q, nullptr);
    }
    EXPECT_LE(test::worst(fast, ref.out, ref, 64, 0.1, false), 1.0) << "S=" << S;
  }
}

// Prefill chunks that start inside the sinks, straddle their end and lie beyond, with and without a sliding window
// (which hides the sinks from queries far enough on).
TEST(SinkTokens, PrefillMatchesTheReferenceWithAndWithoutAWindow) {
  KVQ_FRESH_SEED();
  for (size_t window : {size_t{0}, size_t{50}})
    for (int S : {1, 16}) {
      const test::Shape shape{64, 64, 0, 2, 2, {180}, true};
      SCOPED_TRACE("S=" + std::to_string(S) + " window " + std::to_string(window));
      const test::Scenario sc = with_sinks(shape, "int4", "turbo_mse:3", S, seed);
      const size_t d = 64, hq = 4, L = 180;
      std::vector<Tokens> heads;
      for (int h = 0; h < 2; ++h) heads.push_back(test::decoded_head(sc.cache, sc.ids[0], 1, h));
      ThreadPool two(2);
      const std::vector<std::pair<size_t, size_t>> chunks{{0, 7}, {10, 20}, {60, 100}, {170, 10}};
      for (const auto& [start, chunk] : chunks) {
        SCOPED_TRACE("chunk " + std::to_string(chunk) + " at " + std::to_string(start));
        const auto q = gaussian_vectors(chunk * hq, 64, seed + start);
        std::vector<float> out(q.size(), NAN);
        AttentionOptions options;
        options.window = window;
        prefill_attention(sc.cache, 1, sc.ids[0], start, chunk, q, out, options, &two);
        test::Reference ref(chunk * hq, d);
        for (size_t p = 0; p < chunk; ++p)
          for (size_t j = 0; j < hq; ++j) {
            const size_t visible = start + p + 1, first = window > 0 && visible > window ? visible - window : 0;
            Tokens kv = heads[j / 2];
            kv.keys.erase(kv.keys.begin(), kv.keys.begin() + static_cast<std::ptrdiff_t>(first * d));
            kv.values.erase(kv.values.begin(), kv.values.begin() + static_cast<std::ptrdiff_t>(first * d));
            test::reference_row(ref, p * hq + j, q.data() + (p * hq + j) * d, kv, L - first, visible - first, 64);
          }
        EXPECT_LE(test::vs_reference(out, ref, d), 1.0);
      }
    }
}

// Centered keys: pages and window hold keys minus the first page's mean, the sinks the keys themselves; attention
// subtracts the offset from the sinks too, so that every score moves by the same amount.
TEST(SinkTokens, CenteredKeysAttendAsTheKeysThemselves) {
  KVQ_FRESH_SEED();
  const test::Shape shape{64, 64, 0, 2, 2, {40, 150}, true};
  const test::Scenario sc = with_sinks(shape, "int8", "int8", 4, seed, true);
  ASSERT_NE(sc.cache.view(sc.ids[1], 1).key_offset, nullptr);
  const auto q = test::queries(shape, shape.lengths.size(), seed + 1);
  const test::Reference ref = test::reference_decode(sc, q, shape.G, true);
  EXPECT_LE(test::vs_reference(test::decode(sc, q, nullptr), ref, 64), 1.0);
}

TEST(SinkTokens, SaveAndLoadKeepThem) {
  KVQ_FRESH_SEED();
  const test::Shape shape{64, 64, 64, 2, 1, {3, 150}, true};
  const test::Scenario sc = with_sinks(shape, "turbo_mse:3", "int4", 6, seed);
  const test::TempFile file("sinks.kvq");
  sc.cache.save(file.path().string());
  const KVCache loaded = KVCache::load(file.path().string());
  EXPECT_EQ(loaded.config().sink_tokens, 6);
  for (size_t s = 0; s < sc.ids.size(); ++s) {
    EXPECT_EQ(loaded.view(sc.ids[s], 1).sink_count, sc.cache.view(sc.ids[s], 1).sink_count);
    const Tokens a = test::decoded(sc.cache, sc.ids[s], 1), b = test::decoded(loaded, sc.ids[s], 1);
    EXPECT_EQ(a.keys, b.keys);
    EXPECT_EQ(a.values, b.values);
  }
  EXPECT_EQ(loaded.memory().sink_bytes, sc.cache.memory().sink_bytes);
  // Version 5 holds the sinks; a cache without them is written as version 4, which earlier builds read.
  const auto version_of = [](const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    char header[12] = {};
    in.read(header, 12);
    return static_cast<int>(header[8]);
  };
  EXPECT_EQ(version_of(file.path().string()), 5);
  const test::Scenario plain = with_sinks(shape, "turbo_mse:3", "int4", 0, seed);
  plain.cache.save(file.path().string());
  EXPECT_EQ(version_of(file.path().string()), 4);
  EXPECT_EQ(KVCache::load(file.path().string()).config().sink_tokens, 0);
  const KVCache copy = sc.cache.to(Device::cpu());
  EXPECT_EQ(test::decoded(copy, sc.ids[1], 1).keys, test::decoded(sc.cache, sc.ids[1], 1).keys);
  EXPECT_EQ(test::decoded(copy, sc.ids[0], 1).values, test::decoded(sc.cache, sc.ids[0], 1).values);

  // Sinks grow with the tokens held: the most a cache may keep, 3 tokens held, costs 3 tokens, also once loaded
  // (a file cannot make load allocate more than it holds).
  const test::Shape few{64, 64, 0, 2, 1, {3}, true};
  const test::Scenario big = with_sinks(few, "int4", "int4", kMaxSinkTokens, seed);
  const size_t three = 3 * 2 * 2 * 64 * 2;
  EXPECT_LE(big.cache.memory().sink_bytes, 2 * three);
  big.cache.save(file.path().string());
  const KVCache big_loaded = KVCache::load(file.path().string());
  EXPECT_EQ(big_loaded.memory().sink_bytes, three);
  EXPECT_EQ(test::decoded(big_loaded, big.ids[0], 1).keys, test::decoded(big.cache, big.ids[0], 1).keys);
}

TEST(SinkTokens, BadCountsAndUnstorableTokensAreErrors) {
  CacheConfig cfg;
  cfg.head_dim = 64;
  cfg.capacity_pages = 4;
  for (int bad : {-1, kMaxSinkTokens + 1}) {
    cfg.sink_tokens = bad;
    test::expect_error([&] { KVCache c(cfg); }, "sink_tokens = " + std::to_string(bad));
  }
  cfg.sink_tokens = 4;
  KVCache cache(cfg);
  const SeqId s = cache.add_sequence();
  std::vector<float> k(2 * 64, 1.f), v(2 * 64, 1.f);
  k[64 + 3] = 1e6f;  // token 1: beyond f16's range
  test::expect_error([&] { cache.append(s, 0, k.data(), v.data(), 2); }, "beyond f16's range");
  EXPECT_EQ(cache.length(s, 0), 0u) << "nothing appended";
  EXPECT_EQ(cache.memory().sink_bytes, 0u);
  cache.append(s, 0, k.data(), v.data(), 1);  // token 0 alone is fine
  EXPECT_EQ(cache.view(s, 0).sink_count, 1);
}

}  // namespace
}  // namespace kvq

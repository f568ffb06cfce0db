// KVCache: configuration checks, the residual window, paging, pool exhaustion, memory accounting, save/load.
#include "kvq/cache.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <limits>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "cache_test_util.hpp"
#include "codec_test_specs.hpp"
#include "expect_error.hpp"
#include "kvq/attention.hpp"
#include "kvq/detail/random.hpp"
#include "kvq/error.hpp"
#include "test_seed.hpp"

namespace kvq {
namespace {

using test::append_range;
using test::make_tokens;
using test::Tokens;

CacheConfig small_config(const std::string& k, const std::string& v, int T, int R, size_t pages) {
  CacheConfig c;
  c.n_layers = 2;
  c.n_kv_heads = 2;
  c.head_dim = 64;
  c.block_tokens = T;
  c.key_codec = k;
  c.value_codec = v;
  c.residual_tokens = R;
  c.capacity_pages = pages;
  c.seed = 11;
  return c;
}

using test::expect_error;

std::string temp_path(const std::string& name) {
  return (std::filesystem::path(testing::TempDir()) / ("kvq_cache_test_" + name)).string();
}

std::vector<char> read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

void write_file(const std::string& path, const std::vector<char>& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
}

TEST(CacheConfig, RejectsBadShapesWithClearErrors) {
  const CacheConfig good = small_config("f16", "f16", 64, 64, 4);
  EXPECT_NO_THROW(KVCache{good});
  auto with = [&](auto change) {
    CacheConfig c = good;
    change(c);
    return c;
  };
  expect_error([&] { KVCache{with([](CacheConfig& c) { c.block_tokens = 32; })}; }, "64 or 128");
  expect_error([&] { KVCache{with([](CacheConfig& c) { c.block_tokens = 96; })}; }, "64 or 128");
  expect_error([&] { KVCache{with([](CacheConfig& c) { c.residual_tokens = 32; })}; }, "residual_tokens");
  expect_error([&] { KVCache{with([](CacheConfig& c) { c.residual_tokens = -64; })}; }, "residual_tokens");
  expect_error([&] { KVCache{with([](CacheConfig& c) { c.n_layers = 0; })}; }, "n_layers");
  expect_error([&] { KVCache{with([](CacheConfig& c) { c.n_kv_heads = 0; })}; }, "n_kv_heads");
  expect_error([&] { KVCache{with([](CacheConfig& c) { c.key_codec = "nosuch"; })}; }, "unknown codec");
  expect_error([&] { KVCache{with([](CacheConfig& c) { c.head_dim = 100; })}; }, "head dimension");
}

// The window holds the newest tokens: all of them below R + T, else between R and R + T - 1; pages are full.
TEST(CacheAppend, ResidualWindowKeepsNewestTokensAndPagesHoldTheRest) {
  KVQ_FRESH_SEED();
  for (auto [T, R] : {std::pair{64, 0}, std::pair{64, 64}, std::pair{128, 128}}) {
    SCOPED_TRACE("T=" + std::to_string(T) + " R=" + std::to_string(R));
    const CacheConfig cfg = small_config("f32", "f32", T, R, 64);
    KVCache cache(cfg);
    const size_t n = 700;
    const Tokens t = make_tokens(cfg, n, seed, true);
    const SeqId s = cache.add_sequence();
    const std::vector<size_t> chunks{1, 7, 64, 100, 1, 1, 200, 3};
    size_t len = 0;
    for (size_t i = 0; len < n; ++i) {
      const size_t next = std::min(n, len + chunks[i % chunks.size()]);
      append_range(cache, s, 0, t, len, next, {next - len});
      len = next;
      const LayerView v = cache.view(s, 0);
      const size_t window = static_cast<size_t>(v.residual_count);
      ASSERT_EQ(v.length(), len);
      ASSERT_EQ(cache.length(s, 0), len);
      ASSERT_EQ(v.pages.size(), len >= static_cast<size_t>(R + T) ? (len - R) / T : 0) << len;
      if (len >= static_cast<size_t>(R)) {
        ASSERT_GE(window, static_cast<size_t>(R));
        ASSERT_LE(window, static_cast<size_t>(R + T - 1));
      } else {
        ASSERT_EQ(window, len);
      }
      // f32 stores exactly: decoded pages + window equal the appended tokens, in order, for every head.
      for (int h = 0; h < cfg.n_kv_heads; ++h) {
        const Tokens got = test::decoded_head(cache, s, 0, h), want = test::original_head(t, cfg, len, h);
        ASSERT_EQ(got.keys, want.keys) << "head " << h << " at length " << len;
        ASSERT_EQ(got.values, want.values) << "head " << h << " at length " << len;
      }
    }
    EXPECT_EQ(cache.length(s, 1), 0u);
  }
}

TEST(CacheAppend, TokenByTokenAndOneChunkStoreIdenticalBytes) {
  KVQ_FRESH_SEED();
  const CacheConfig cfg = small_config("f16", "bf16", 64, 64, 32);
  KVCache a(cfg), b(cfg);
  const Tokens t = make_tokens(cfg, 333, seed, true);
  const SeqId sa = a.add_sequence(), sb = b.add_sequence();
  append_range(a, sa, 0, t, 0, 333, {1});
  append_range(b, sb, 0, t, 0, 333, {333});
  const LayerView va = a.view(sa, 0), vb = b.view(sb, 0);
  ASSERT_EQ(va.pages.size(), vb.pages.size());
  ASSERT_EQ(va.residual_count, vb.residual_count);
  for (size_t j = 0; j < va.pages.size(); ++j)
    EXPECT_EQ(std::memcmp(a.page(va.pages[j]), b.page(vb.pages[j]), a.page_bytes()), 0) << "page " << j;
}

TEST(CachePaging, PagesAreAlignedSharedAndReturnedToThePool) {
  KVQ_FRESH_SEED();
  const CacheConfig cfg = small_config("f16", "f32", 64, 0, 40);
  KVCache cache(cfg);
  EXPECT_EQ(cache.page_bytes() % 64, 0u);
  for (int h = 0; h < cfg.n_kv_heads; ++h) {
    EXPECT_EQ(cache.key_block_offset(h) % 64, 0u);
    EXPECT_EQ(cache.value_block_offset(h) % 64, 0u);
    EXPECT_GE(cache.value_block_offset(h),
              cache.key_block_offset(cfg.n_kv_heads - 1) + cache.key_codec(0).block_bytes());
  }
  EXPECT_GE(cache.page_bytes(), cache.value_block_offset(cfg.n_kv_heads - 1) + cache.value_codec(0).block_bytes());

  // Sequences of different lengths in both layers draw from one pool.
  const std::vector<size_t> lengths{10, 200, 64, 500, 129};
  std::vector<SeqId> ids;
  size_t expected_pages = 0;
  for (size_t i = 0; i < lengths.size(); ++i) {
    ids.push_back(cache.add_sequence());
    const Tokens t = make_tokens(cfg, lengths[i], seed + i, false);
    for (int l = 0; l < cfg.n_layers; ++l) append_range(cache, ids.back(), l, t, 0, lengths[i]);
    expected_pages += 2 * (lengths[i] / 64);
    EXPECT_EQ(cache.length(ids.back()), lengths[i]);
  }
  EXPECT_EQ(cache.free_pages(), cfg.capacity_pages - expected_pages);
  std::set<PageId> seen;
  for (SeqId s : ids)
    for (int l = 0; l < cfg.n_layers; ++l)
      for (PageId p : cache.view(s, l).pages) {
        EXPECT_TRUE(seen.insert(p).second) << "page " << p << " used twice";
        EXPECT_EQ(reinterpret_cast<uintptr_t>(cache.page(p)) % 64, 0u);
      }

  // Removing a sequence returns its pages; the long one fits again afterwards.
  const size_t before = cache.free_pages();
  cache.remove_sequence(ids[3]);
  EXPECT_FALSE(cache.has_sequence(ids[3]));
  EXPECT_EQ(cache.free_pages(), before + 2 * (500 / 64));
  EXPECT_THROW(cache.view(ids[3], 0), Error);
  EXPECT_THROW(cache.remove_sequence(ids[3]), Error);
  const SeqId again = cache.add_sequence();
  const Tokens t = make_tokens(cfg, 500, seed + 9, false);
  for (int l = 0; l < cfg.n_layers; ++l) append_range(cache, again, l, t, 0, 500);
  EXPECT_EQ(cache.free_pages(), before);
  EXPECT_EQ(cache.sequences().size(), lengths.size());
  // Ids are never reused, the newest one's neither.
  cache.remove_sequence(again);
  EXPECT_EQ(cache.next_sequence_id(), again + 1);
  EXPECT_EQ(cache.add_sequence(), again + 1);
}

TEST(CachePool, ExhaustionThrowsBeforeModifyingAndTheCacheStaysUsable) {
  KVQ_FRESH_SEED();
  const CacheConfig cfg = small_config("f32", "f16", 64, 64, 6);
  KVCache cache(cfg);
  const Tokens t = make_tokens(cfg, 1000, seed, true);
  const SeqId a = cache.add_sequence(), b = cache.add_sequence();
  append_range(cache, a, 0, t, 0, 64 * 4 + 64 + 10);  // 4 pages, window of 74
  append_range(cache, b, 0, t, 0, 64 * 2 + 64 + 5);   // 2 pages: the pool is full
  ASSERT_EQ(cache.free_pages(), 0u);

  const LayerView before = cache.view(a, 0);
  const std::vector<PageId> pages(before.pages.begin(), before.pages.end());
  const Tokens content = test::decoded_head(cache, a, 0, 1);
  const size_t row = static_cast<size_t>(cfg.n_kv_heads) * cfg.head_dim;
  // 54 more tokens make the window reach R + T: a new page is needed.
  expect_error([&] { cache.append(a, 0, t.keys.data() + 330 * row, t.values.data() + 330 * row, 54); },
               "pool exhausted");
  // Fewer tokens fit in the window.
  cache.append(a, 0, t.keys.data() + 330 * row, t.values.data() + 330 * row, 53);
  expect_error([&] { cache.append(a, 0, t.keys.data() + 383 * row, t.values.data() + 383 * row, 1); },
               "pool exhausted");
  const LayerView after = cache.view(a, 0);
  EXPECT_EQ(after.length(), 383u);
  EXPECT_EQ(std::vector<PageId>(after.pages.begin(), after.pages.end()), pages);
  const Tokens now = test::decoded_head(cache, a, 0, 1);
  EXPECT_TRUE(std::equal(content.keys.begin(), content.keys.end(), now.keys.begin()));
  EXPECT_EQ(test::original_head(t, cfg, 383, 1).keys, now.keys);

  // Free b: a continues and reads back exactly what was appended.
  cache.remove_sequence(b);
  append_range(cache, a, 0, t, 383, 511);  // the two freed pages
  EXPECT_EQ(cache.length(a, 0), 511u);
  EXPECT_EQ(cache.free_pages(), 0u);
  EXPECT_EQ(test::decoded_head(cache, a, 0, 0).keys, test::original_head(t, cfg, 511, 0).keys);
}

TEST(CacheAppend, RejectsBadInputWithoutModifying) {
  KVQ_FRESH_SEED();
  const CacheConfig cfg = small_config("f16", "f16", 64, 0, 8);
  KVCache cache(cfg);
  Tokens t = make_tokens(cfg, 100, seed, false);
  const SeqId s = cache.add_sequence();
  append_range(cache, s, 0, t, 0, 60);
  t.values[70 * cfg.n_kv_heads * cfg.head_dim + cfg.head_dim + 5] = std::numeric_limits<float>::quiet_NaN();
  const size_t row = static_cast<size_t>(cfg.n_kv_heads) * cfg.head_dim;
  expect_error([&] { cache.append(s, 0, t.keys.data() + 60 * row, t.values.data() + 60 * row, 40); },
               "value of token 10 head 1 channel 5");
  EXPECT_EQ(cache.length(s, 0), 60u);
  EXPECT_EQ(cache.free_pages(), cfg.capacity_pages);
  expect_error([&] { cache.append(s, 2, t.keys.data(), t.values.data(), 1); }, "layer 2 out of range");
  expect_error([&] { cache.append(s + 7, 0, t.keys.data(), t.values.data(), 1); }, "no sequence");
  expect_error([&] { cache.append(s, 0, nullptr, t.values.data(), 1); }, "null");
}

TEST(CacheLength, LayersMustAgreeWhenTheWholeSequenceIsAsked) {
  KVQ_FRESH_SEED();
  const CacheConfig cfg = small_config("f16", "f16", 64, 0, 8);
  KVCache cache(cfg);
  const Tokens t = make_tokens(cfg, 10, seed, false);
  const SeqId s = cache.add_sequence();
  EXPECT_EQ(cache.length(s), 0u);
  append_range(cache, s, 0, t, 0, 10);
  EXPECT_EQ(cache.length(s, 0), 10u);
  expect_error([&] { cache.length(s); }, "layer 1");
  append_range(cache, s, 1, t, 0, 10);
  EXPECT_EQ(cache.length(s), 10u);
}

// Codecs that need training refuse appends until train_layer; no layer can be retrained under encoded tokens.
TEST(CacheTraining, TrainLayerBeforeUseAndNotAfterEncoding) {
  KVQ_FRESH_SEED();
  for (const auto& spec : test::codec_test_specs()) {
    SCOPED_TRACE(spec);
    const CacheConfig cfg = small_config(spec, "f16", 64, 0, 8);
    KVCache cache(cfg);
    const Tokens t = make_tokens(cfg, 70, seed, true);
    const SeqId s = cache.add_sequence();
    if (!cache.ready(0)) {
      expect_error([&] { cache.append(s, 0, t.keys.data(), t.values.data(), 70); }, "train_layer");
      EXPECT_EQ(cache.length(s, 0), 0u);
    }
    test::train_if_needed(cache, seed);
    ASSERT_TRUE(cache.ready(0) && cache.ready(1));
    append_range(cache, s, 0, t, 0, 70);
    expect_error([&] { cache.train_layer(0, t.keys.data(), t.values.data(), 64); }, "already holds encoded tokens");
    // All 140 rows of t: vecinfer:10/8 needs at least 1024 sub-vectors (128 vectors of d = 64).
    EXPECT_NO_THROW(cache.train_layer(1, t.keys.data(), t.values.data(), t.keys.size() / cfg.head_dim));
  }
}

TEST(CacheMemory, AccountingEqualsTheHandCount) {
  KVQ_FRESH_SEED();
  const CacheConfig cfg = small_config("bf16", "f32", 64, 128, 30);
  KVCache cache(cfg);
  const size_t d = 64, H = 2, T = 64, R = 128;
  // f16-family key blocks of 64 x 64 x 2 bytes and f32 value blocks of 64 x 64 x 4, both multiples of 64.
  const size_t page = H * (T * d * 2 + T * d * 4);
  EXPECT_EQ(cache.page_bytes(), page);
  const std::vector<size_t> lengths{0, 100, 257, 700};
  size_t pages = 0, entries = 0;
  for (size_t i = 0; i < lengths.size(); ++i) {
    const SeqId s = cache.add_sequence();
    const Tokens t = make_tokens(cfg, lengths[i], seed + i, false);
    append_range(cache, s, 0, t, 0, lengths[i]);
    append_range(cache, s, 1, t, 0, lengths[i] / 2);
    for (size_t n : {lengths[i], lengths[i] / 2}) {
      const size_t p = n >= R + T ? (n - R) / T : 0;
      pages += p;
      entries += p;
    }
  }
  // Windows are allocated as they fill: each holds its tokens, in at most R + T - 1 slots per head.
  size_t residual = 0;
  for (const SeqId s : cache.sequences())
    for (int l = 0; l < 2; ++l) {
      const LayerView v = cache.view(s, l);
      EXPECT_GE(v.residual_stride, static_cast<size_t>(v.residual_count) * d);
      EXPECT_LE(v.residual_stride, (R + T - 1) * d);
      residual += 2 /*k, v*/ * H * v.residual_stride * 4;
    }
  const CacheMemory m = cache.memory();
  EXPECT_EQ(m.page_bytes, page);
  EXPECT_EQ(m.pages_in_use, pages);
  EXPECT_EQ(m.pages_capacity, 30u);
  EXPECT_EQ(m.encoded_bytes, pages * page);
  EXPECT_EQ(m.pool_bytes, 30 * page);
  EXPECT_EQ(m.residual_bytes, residual);
  EXPECT_EQ(m.block_table_bytes, entries * sizeof(PageId));
  EXPECT_EQ(m.codec_state_bytes, 0u);
  EXPECT_EQ(m.used_bytes, pages * page + residual + entries * 4);
  EXPECT_EQ(m.total_bytes, 30 * page + residual + entries * 4);
  EXPECT_DOUBLE_EQ(m.bits_per_element, 24.0);  // (16 + 32) / 2
}

// A cache with holes in its pool (a removed sequence), several sequences, two layers, windows in use.
struct Filled {
  CacheConfig cfg;
  KVCache cache;
  std::vector<SeqId> ids;
  Tokens extra;  // tokens appended after the save, to both caches
};

Filled make_filled(uint64_t seed) {
  CacheConfig cfg = small_config("f16", "bf16", 64, 64, 40);
  Filled f{cfg, KVCache(cfg), {}, make_tokens(cfg, 80, seed + 50, false)};
  const std::vector<size_t> lengths{300, 77, 0, 1000 - 600};
  for (size_t i = 0; i < lengths.size(); ++i) {
    f.ids.push_back(f.cache.add_sequence());
    const Tokens t = make_tokens(cfg, lengths[i], seed + i, true);
    for (int l = 0; l < cfg.n_layers; ++l) append_range(f.cache, f.ids.back(), l, t, 0, lengths[i]);
  }
  f.cache.remove_sequence(f.ids[0]);
  f.ids.erase(f.ids.begin());
  return f;
}

std::vector<float> attend_all(const KVCache& cache, int layer, const std::vector<SeqId>& ids, uint64_t seed) {
  const size_t n = ids.size() * 4 * static_cast<size_t>(cache.config().head_dim);  // 4 query heads
  const auto q = gaussian_vectors(n / cache.config().head_dim, cache.config().head_dim, seed);
  std::vector<float> out(n);
  decode_attention(cache, layer, ids, q, out);
  return out;
}

TEST(CacheFile, SaveLoadRoundTripIsBitIdentical) {
  KVQ_FRESH_SEED();
  Filled f = make_filled(seed);
  const std::string path = temp_path("roundtrip.kvq");
  f.cache.save(path);
  EXPECT_FALSE(std::filesystem::exists(path + ".tmp"));
  KVCache loaded = KVCache::load(path);

  EXPECT_EQ(loaded.config().key_codec, "f16");
  EXPECT_EQ(loaded.config().residual_tokens, 64);
  EXPECT_EQ(loaded.sequences(), f.ids);
  EXPECT_EQ(loaded.free_pages(), f.cache.free_pages());
  std::set<PageId> used;
  for (SeqId s : f.ids)
    for (int l = 0; l < f.cfg.n_layers; ++l) {
      const LayerView a = f.cache.view(s, l), b = loaded.view(s, l);
      ASSERT_EQ(a.pages.size(), b.pages.size());
      ASSERT_EQ(a.residual_count, b.residual_count);
      for (size_t j = 0; j < a.pages.size(); ++j) {
        EXPECT_EQ(std::memcmp(f.cache.page(a.pages[j]), loaded.page(b.pages[j]), f.cache.page_bytes()), 0);
        used.insert(b.pages[j]);
      }
      for (int h = 0; h < f.cfg.n_kv_heads; ++h) {
        EXPECT_EQ(std::memcmp(a.residual_key(h), b.residual_key(h), a.residual_count * 64 * 4), 0);
        EXPECT_EQ(std::memcmp(a.residual_value(h), b.residual_value(h), a.residual_count * 64 * 4), 0);
      }
      const auto x = attend_all(f.cache, l, f.ids, seed + 100), y = attend_all(loaded, l, f.ids, seed + 100);
      EXPECT_EQ(std::memcmp(x.data(), y.data(), x.size() * 4), 0) << "layer " << l;
    }
  // Compacted: the loaded pages are the first ones of the pool.
  ASSERT_FALSE(used.empty());
  EXPECT_EQ(*used.rbegin(), used.size() - 1);

  // Saving the loaded cache gives the same file; both continue identically, with new ids after the old ones.
  const std::string again = temp_path("roundtrip2.kvq");
  loaded.save(again);
  EXPECT_EQ(read_file(path), read_file(again));
  for (KVCache* c : {&f.cache, &loaded}) {
    append_range(*c, f.ids[0], 0, f.extra, 0, 80);
    EXPECT_EQ(c->add_sequence(), 4u);
  }
  const auto x = attend_all(f.cache, 0, f.ids, seed), y = attend_all(loaded, 0, f.ids, seed);
  EXPECT_EQ(std::memcmp(x.data(), y.data(), x.size() * 4), 0);
  std::filesystem::remove(path);
  std::filesystem::remove(again);
}

// Every codec's cache (trained state included) survives save -> load: same pages, same attention bits.
TEST(CacheFile, EveryCodecRoundTrips) {
  KVQ_FRESH_SEED();
  const std::string path = temp_path("every_codec.kvq");
  for (const auto& spec : test::codec_test_specs()) {
    SCOPED_TRACE(spec);
    CacheConfig cfg = small_config(spec, spec, 64, 64, 8);
    cfg.n_layers = 1;
    KVCache cache(cfg);
    test::train_if_needed(cache, seed);
    const SeqId s = cache.add_sequence();
    append_range(cache, s, 0, make_tokens(cfg, 150, seed, true), 0, 150);
    cache.save(path);
    const KVCache loaded = KVCache::load(path);
    const LayerView a = cache.view(s, 0), b = loaded.view(s, 0);
    ASSERT_EQ(a.pages.size(), 1u);
    EXPECT_EQ(std::memcmp(cache.page(a.pages[0]), loaded.page(b.pages[0]), cache.page_bytes()), 0);
    const auto x = attend_all(cache, 0, {s}, seed + 1), y = attend_all(loaded, 0, {s}, seed + 1);
    EXPECT_EQ(std::memcmp(x.data(), y.data(), x.size() * 4), 0);
  }
  std::filesystem::remove(path);
}

// Version 4 moved qjl's signs and turbo_prod's value signs to sign tiles: a version 3 file holding them is refused,
// naming why; one without them (the same bytes otherwise) still loads.
TEST(CacheFile, Version3FilesLoadUnlessTheirSignsUseTheOldLayout) {
  KVQ_FRESH_SEED();
  const std::string path = temp_path("version3.kvq"), old = temp_path("version3_old.kvq");
  for (const auto& [k, v, refused] : std::vector<std::tuple<std::string, std::string, std::string>>{
           {"qjl", "int4", "qjl key"},
           {"int4", "turbo_prod:3", "turbo_prod value"},
           {"f16", "qjl", "qjl value"},
           {"turbo_prod:3", "turbo_mse:3", ""},
           {"int4", "kivi:2", ""}}) {
    SCOPED_TRACE(k + "/" + v);
    CacheConfig cfg = small_config(k, v, 64, 0, 8);  // no window: 100 tokens fill a page
    cfg.n_layers = 1;
    KVCache cache(cfg);
    test::train_if_needed(cache, seed);
    const SeqId s = cache.add_sequence();
    append_range(cache, s, 0, make_tokens(cfg, 100, seed, true), 0, 100);
    ASSERT_EQ(cache.view(s, 0).pages.size(), 1u);
    cache.save(path);
    auto bytes = read_file(path);
    ASSERT_EQ(bytes[8], 4);
    bytes[8] = 3;
    write_file(old, bytes);
    if (refused.empty()) {
      const KVCache loaded = KVCache::load(old);
      EXPECT_EQ(std::memcmp(cache.page(cache.view(s, 0).pages[0]), loaded.page(loaded.view(s, 0).pages[0]),
                            cache.page_bytes()),
                0);
    } else {
      expect_error([&] { KVCache::load(old); }, "format version 3 holds " + refused +
                                                    " blocks in an earlier sign layout (version 4 moved");
    }
  }
  std::filesystem::remove(path);
  std::filesystem::remove(old);
}

TEST(CacheFile, DamagedForeignAndNewerFilesGiveClearErrors) {
  KVQ_FRESH_SEED();
  Filled f = make_filled(seed);
  const std::string path = temp_path("damaged.kvq"), bad = temp_path("damaged_copy.kvq");
  f.cache.save(path);
  const std::vector<char> good = read_file(path);
  ASSERT_GT(good.size(), 24u);
  auto load_error = [&](const std::vector<char>& bytes, const std::string& text) {
    write_file(bad, bytes);
    expect_error([&] { KVCache::load(bad); }, text);
  };

  expect_error([&] { KVCache::load(temp_path("does_not_exist.kvq")); }, "cannot read");
  for (size_t n : {size_t{0}, size_t{5}, size_t{23}})
    load_error(std::vector<char>(good.begin(), good.begin() + static_cast<std::ptrdiff_t>(n)), "not a kvq cache file");
  for (size_t n : {size_t{24}, size_t{100}, good.size() / 2, good.size() - 1})
    load_error(std::vector<char>(good.begin(), good.begin() + static_cast<std::ptrdiff_t>(n)), "truncated");
  auto longer = good;
  longer.push_back(0);
  load_error(longer, "truncated or damaged");

  auto foreign = good;
  foreign[3] = 'X';
  load_error(foreign, "not a kvq cache file");
  auto newer = good;
  newer[8] = 6;
  load_error(newer, "format version 6, newer than this build reads (5)");
  auto older = good;
  older[8] = 1;
  load_error(older, "format version 1, older than this build reads (2)");
  auto zero = good;
  zero[8] = 0;
  load_error(zero, "invalid format version 0");

  // Any flipped byte: every header byte, and a random sample of the payload.
  Rng rng(seed);
  std::vector<size_t> positions;
  for (size_t i = 0; i < 24; ++i) positions.push_back(i);
  for (int i = 0; i < 60; ++i) positions.push_back(24 + rng.next_u64() % (good.size() - 24));
  for (size_t pos : positions) {
    auto flipped = good;
    flipped[pos] = static_cast<char>(flipped[pos] ^ (1 << (rng.next_u64() % 8)));
    write_file(bad, flipped);
    EXPECT_THROW(KVCache::load(bad), Error) << "byte " << pos;
  }
  auto payload_flip = good;
  payload_flip[good.size() / 2] ^= 0x10;
  load_error(payload_flip, "CRC-32C");
  std::filesystem::remove(path);
  std::filesystem::remove(bad);
}

}  // namespace
}  // namespace kvq

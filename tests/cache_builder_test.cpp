// A KVCache assembled from another's parts (src/cache/cache_builder.hpp, what KVCache::to uses) holds
// the same codecs, sequences, pages, windows and key offsets, and goes on exactly as the original under the same
// appends. Bad parts are rejected by name.
#include <gtest/gtest.h>

#include <cstring>
#include <vector>

#include "cache/cache_builder.hpp"
#include "cache_test_util.hpp"
#include "kvq/error.hpp"
#include "test_seed.hpp"

namespace kvq {
namespace {

CacheConfig config(uint64_t seed) {
  CacheConfig c;
  c.n_layers = 2;
  c.n_kv_heads = 2;
  c.head_dim = 64;
  c.block_tokens = 64;
  c.residual_tokens = 64;
  c.key_codec = "int4";
  c.value_codec = "turbo_mse:3";
  c.capacity_pages = 40;
  c.center_keys = true;
  c.seed = seed;
  return c;
}

// The window of a view, compacted: [keys H][count][d] then values.
std::vector<float> window_of(const KVCache& c, const LayerView& v) {
  const size_t H = static_cast<size_t>(c.config().n_kv_heads), d = static_cast<size_t>(c.config().head_dim);
  const size_t n = static_cast<size_t>(v.residual_count) * d;
  std::vector<float> w(2 * H * n);
  for (size_t h = 0; h < H && n > 0; ++h) {
    std::memcpy(w.data() + h * n, v.residual_key(static_cast<int>(h)), n * 4);
    std::memcpy(w.data() + (H + h) * n, v.residual_value(static_cast<int>(h)), n * 4);
  }
  return w;
}

KVCache rebuilt(const KVCache& from) {
  detail::CacheBuilder b(from.config());
  for (int l = 0; l < from.config().n_layers; ++l) b.load_codecs(l, from.key_codec(l), from.value_codec(l));
  for (const SeqId id : from.sequences()) {
    b.add_sequence(id);
    for (int l = 0; l < from.config().n_layers; ++l) {
      const LayerView v = from.view(id, l);
      std::vector<uint8_t> pages;
      for (const PageId p : v.pages) pages.insert(pages.end(), from.page(p), from.page(p) + from.page_bytes());
      b.fill_layer(id, l, pages.data(), v.pages.size(), window_of(from, v).data(),
                   static_cast<size_t>(v.residual_count), v.residual_count, v.key_offset);
    }
  }
  return b.finish();
}

void expect_same(const KVCache& a, const KVCache& b) {
  ASSERT_EQ(a.sequences(), b.sequences());
  EXPECT_EQ(a.free_pages(), b.free_pages());
  for (int l = 0; l < a.config().n_layers; ++l) {
    EXPECT_EQ(a.key_codec(l).state(), b.key_codec(l).state());
    EXPECT_EQ(a.value_codec(l).state(), b.value_codec(l).state());
  }
  for (const SeqId id : a.sequences())
    for (int l = 0; l < a.config().n_layers; ++l) {
      const LayerView va = a.view(id, l), vb = b.view(id, l);
      ASSERT_EQ(va.pages.size(), vb.pages.size());
      for (size_t j = 0; j < va.pages.size(); ++j)
        EXPECT_EQ(std::memcmp(a.page(va.pages[j]), b.page(vb.pages[j]), a.page_bytes()), 0) << "page " << j;
      EXPECT_EQ(va.residual_count, vb.residual_count);
      EXPECT_EQ(window_of(a, va), window_of(b, vb));
      ASSERT_EQ(va.key_offset == nullptr, vb.key_offset == nullptr);
      if (va.key_offset != nullptr) {
        EXPECT_EQ(std::memcmp(va.key_offset, vb.key_offset, 2 * 64 * sizeof(float)), 0);
      }
    }
}

TEST(CacheBuilder, RebuiltCacheEqualsTheOriginalAndGoesOnAlike) {
  KVQ_FRESH_SEED();
  KVCache a(config(seed));
  test::train_if_needed(a, seed, 1);  // layer 0 stays empty
  const test::Tokens t = test::make_tokens(a.config(), 500, seed + 1, true);
  const SeqId s0 = a.add_sequence(), s1 = a.add_sequence(), s2 = a.add_sequence();
  a.remove_sequence(s1);  // ids need not be dense
  test::append_range(a, s0, 1, t, 0, 300);
  test::append_range(a, s2, 1, t, 0, 40);
  KVCache b = rebuilt(a);
  expect_same(a, b);
  EXPECT_EQ(a.add_sequence(), b.add_sequence());  // the next id too
  test::append_range(a, s0, 1, t, 300, 500, {1, 77});
  test::append_range(b, s0, 1, t, 300, 500, {1, 77});
  test::append_range(a, s2, 1, t, 40, 200, {100});
  test::append_range(b, s2, 1, t, 40, 200, {100});
  expect_same(a, b);
}

TEST(CacheBuilder, RejectsPartsTheConfigurationCannotHold) {
  KVQ_FRESH_SEED();
  KVCache a(config(seed));
  test::train_if_needed(a, seed);
  detail::CacheBuilder b(a.config());
  CacheConfig other = a.config();
  other.key_codec = "int8";
  KVCache c(other);
  test::train_if_needed(c, seed);
  EXPECT_THROW(b.load_codecs(1, c.key_codec(1), c.value_codec(1)), Error);
  b.add_sequence(3);
  EXPECT_THROW(b.add_sequence(3), Error);
  const std::vector<float> window(2 * 2 * 127 * 64, 0.0f);
  std::vector<uint8_t> pages(a.page_bytes() * 41, 0);
  EXPECT_THROW(b.fill_layer(3, 0, pages.data(), 1, window.data(), 127, 0, nullptr), Error);  // centered, no offset
  EXPECT_THROW(b.fill_layer(3, 0, pages.data(), 41, window.data(), 127, 0, window.data()), Error);  // pool too small
  EXPECT_THROW(b.fill_layer(3, 0, pages.data(), 0, window.data(), 127, 128, nullptr), Error);  // window too long
  EXPECT_THROW(b.set_next_id(2), Error);
}

}  // namespace
}  // namespace kvq

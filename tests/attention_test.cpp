// Decode and prefill attention over a KVCache against the double-precision reference: over the decoded cache for
// every registered key codec (x a few value codecs), over the original tokens for f32; GQA 1/4/8, d 64/128/256,
// T 64/128, R 0/T, awkward lengths, empty sequences, split-K and thread pools.
#include "kvq/attention.hpp"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "attention_test_util.hpp"
#include "codec_test_specs.hpp"
#include "kvq/attention.hpp"
#include "kvq/detail/synthetic.hpp"
#include "kvq/error.hpp"
#include "test_seed.hpp"

namespace kvq {
namespace {

using namespace test;  // the shared helpers of attention_test_util.hpp

TEST(AttentionState, MergeOfPartsEqualsTheWholeAndEmptyStatesAreNeutral) {
  // Three tokens with scores 1, 3, 2 and values (1, 0), (0, 1), (1, 1).
  std::vector<float> o_all(2), o_a(2), o_b(2), o_e(2), o_e2(2);
  AttnState all{o_all}, a{o_a}, b{o_b}, e{o_e}, e2{o_e2};
  const float s[3] = {1, 3, 2};
  const float v[3][2] = {{1, 0}, {0, 1}, {1, 1}};
  auto add = [&](AttnState& st, int t) {
    const float mx = std::max(st.m, s[t]), alpha = st.empty() ? 0.f : std::exp(st.m - mx), w = std::exp(s[t] - mx);
    for (int c = 0; c < 2; ++c) st.o[c] = alpha * st.o[c] + w * v[t][c];
    st.l = alpha * st.l + w;
    st.m = mx;
  };
  for (int t : {0, 1, 2}) add(all, t);
  add(a, 0);
  add(b, 1);
  add(b, 2);
  e.merge(e2);
  EXPECT_TRUE(e.empty());
  a.merge(e);
  a.merge(b);
  e.merge(a);  // into an empty state: a copy
  all.normalize();
  a.normalize();
  e.normalize();
  const double z = std::exp(1.0) + std::exp(3.0) + std::exp(2.0);
  const double want[2] = {(std::exp(1.0) + std::exp(2.0)) / z, (std::exp(3.0) + std::exp(2.0)) / z};
  for (int c = 0; c < 2; ++c) {
    EXPECT_NEAR(all.o[c], want[c], 1e-6);
    EXPECT_NEAR(a.o[c], want[c], 1e-6);
    EXPECT_NEAR(e.o[c], want[c] * 1.0, 1e-6);
  }
  std::vector<float> o_z{5, 5};
  AttnState empty{o_z};
  empty.normalize();
  EXPECT_EQ(o_z, (std::vector<float>{0, 0}));
}

TEST(AttentionReference, HandComputedCases) {
  const int d = 16;
  std::vector<float> q(2 * d, 0.f), k(3 * d, 0.f), v(3 * d, 0.f), out(2 * d);
  q[0] = 1;              // query 0 scores token t by k[t][0]
  q[d + 1] = 2;          // query 1 by 2 k[t][1]
  k[d] = std::log(3.f);  // query 0: weights 1 : 3 over tokens 0, 1
  k[2 * d + 1] = 1;
  for (int t = 0; t < 3; ++t) v[t * d + 2] = static_cast<float>(t + 1);
  // Causal: query 0 (position 1) sees tokens 0..1, query 1 (position 2) sees 0..2.
  reference_attention(q.data(), 2, k.data(), v.data(), 3, d, 2, 1.0, out.data());
  EXPECT_NEAR(out[2], (1 * 1 + 3 * 2) / 4.0, 1e-6);
  const double e2 = std::exp(2.0);
  EXPECT_NEAR(out[d + 2], (1 + 2 + 3 * e2) / (2 + e2), 1e-6);
  // No visible token: zeros.
  reference_attention(q.data(), 1, k.data(), v.data(), 0, d, 0, 1.0, out.data());
  for (int c = 0; c < d; ++c) EXPECT_EQ(out[c], 0.f);
}

// For every registered codec spec as keys, with itself and f16 as values: decode attention equals the reference
// over the decoded cache to 1e-5, 1 and 2 threads agree to 1e-6, and prefill matches the causal reference.
class AttentionCodecs : public testing::TestWithParam<std::string> {};

TEST_P(AttentionCodecs, DecodeMatchesReferenceOverDecodedCache) {
  KVQ_FRESH_SEED();
  const std::vector<Shape> shapes{
      {64, 64, 0, 2, 1, {1, 63, 65, 0}, true},
      {128, 128, 128, 1, 4, {200, 1000}, false},
      {256, 64, 64, 1, 8, {65, 200}, true},
      {128, 64, 0, 2, 8, {1000, 1}, true},
  };
  ThreadPool two(2);
  for (const std::string& value_spec : {GetParam(), std::string("f16")})
    for (size_t i = 0; i < shapes.size(); ++i) {
      const Shape& shape = shapes[i];
      SCOPED_TRACE("values " + value_spec + ", " + describe(shape));
      const Scenario sc = build(shape, GetParam(), value_spec, seed + i);
      const auto q = queries(shape, shape.lengths.size(), seed + 100 + i);
      const auto one = decode(sc, q, nullptr), both = decode(sc, q, &two);
      const auto ref = reference_decode(sc, q, shape.G, true);
      EXPECT_LE(vs_reference(one, ref, shape.d), 1.0);
      EXPECT_LE(worst(both, one, ref, shape.d, 1e-6, false), 1.0);
    }
}

// With f32 the cache is exact: decode attention equals the reference over the original tokens.
TEST(AttentionDecode, F32MatchesReferenceOverOriginalTokens) {
  KVQ_FRESH_SEED();
  int trial = 0;
  for (int G : {1, 4, 8})
    for (int d : {64, 128, 256})
      for (int T : {64, 128})
        for (int R : {0, T}) {
          ++trial;
          // Every shape sees the awkward short lengths; the long one rotates through the shapes.
          std::vector<size_t> lengths{0, 1, 63, 65, 200};
          if (trial % 4 == 0) lengths.push_back(1000);
          const Shape shape{d, T, R, 2, G, lengths, trial % 2 == 0};
          SCOPED_TRACE(describe(shape));
          const Scenario sc = build(shape, "f32", "f32", seed + static_cast<uint64_t>(trial));
          const auto q = queries(shape, lengths.size(), seed + 1000 + static_cast<uint64_t>(trial));
          const auto out = decode(sc, q, nullptr);
          EXPECT_LE(vs_reference(out, reference_decode(sc, q, G, false), static_cast<size_t>(d)), 1.0);
        }
}

TEST(AttentionDecode, SplitKAndThreadPoolsAgree) {
  KVQ_FRESH_SEED();
  const Shape shape{128, 64, 64, 2, 4, {1000, 130, 0, 64}, true};
  const Scenario sc = build(shape, "f16", "bf16", seed);
  const auto q = queries(shape, shape.lengths.size(), seed + 1);
  const auto base = decode(sc, q, nullptr, 1);
  const Reference ref = reference_decode(sc, q, shape.G, true);
  EXPECT_LE(vs_reference(base, ref, 128), 1.0);
  ThreadPool one(1), two(2);
  for (ThreadPool* pool : {static_cast<ThreadPool*>(nullptr), &one, &two})
    for (int splits : {0, 2, 3, 7, 1000}) {
      SCOPED_TRACE("pool " + std::to_string(pool ? pool->size() : 0) + ", splits " + std::to_string(splits));
      EXPECT_LE(worst(decode(sc, q, pool, splits), base, ref, 128, 1e-6, false), 1.0);
    }
  // Without split-K the threads only share out whole (sequence, kv head) groups: identical bits.
  const auto pooled = decode(sc, q, &two, 1);
  EXPECT_EQ(std::memcmp(pooled.data(), base.data(), base.size() * 4), 0);
}

// A sequence without tokens attends to nothing: its rows are zero (the rule of an empty AttnState), also next to
// sequences that hold tokens, and a cache without pages serves windows alone.
TEST(AttentionDecode, EmptyContextGivesZerosAndWindowsNeedNoPages) {
  KVQ_FRESH_SEED();
  Shape shape{64, 64, 64, 2, 4, {0, 100, 0}, false};
  Scenario sc = build(shape, "f16", "f16", seed);
  const auto q = queries(shape, 3, seed + 1);
  const auto out = decode(sc, q, nullptr);
  const size_t row = 8 * 64;
  for (size_t i = 0; i < row; ++i) {
    ASSERT_EQ(out[i], 0.f);
    ASSERT_EQ(out[2 * row + i], 0.f);
  }
  EXPECT_LE(vs_reference(out, reference_decode(sc, q, 4, true), 64), 1.0);

  CacheConfig cfg = sc.cfg;
  cfg.capacity_pages = 0;
  KVCache windows_only(cfg);
  const Tokens t = test::make_tokens(cfg, 127, seed + 2, true);
  const SeqId s = windows_only.add_sequence();
  test::append_range(windows_only, s, 1, t, 0, 127);
  EXPECT_THROW(test::append_range(windows_only, s, 1, t, 0, 1), Error);
  Scenario w{cfg, std::move(windows_only), {s}, {t}};
  const auto q1 = queries(shape, 1, seed + 3);
  EXPECT_LE(vs_reference(decode(w, q1, nullptr), reference_decode(w, q1, 4, false), 64), 1.0);
}

TEST(AttentionPrefill, MatchesCausalReference) {
  KVQ_FRESH_SEED();
  const size_t end = std::numeric_limits<size_t>::max();
  const std::vector<size_t> chunks{1, 7, 64, 100}, starts{0, 5, 63, 64, 130, end};
  check_prefill({64, 64, 64, 2, 2, {300}, true}, "f16", "bf16", seed, chunks, starts);
  check_prefill({128, 128, 0, 1, 8, {333}, false}, "f32", "f16", seed + 1, chunks, {0, 64, 130, end});
}

TEST_P(AttentionCodecs, PrefillMatchesCausalReference) {
  KVQ_FRESH_SEED();
  check_prefill({64, 64, 0, 1, 4, {200}, true}, GetParam(), GetParam(), seed, {7, 100},
                {5, std::numeric_limits<size_t>::max()});
}

// The usual flow: append a chunk, then attend its positions; the last position equals decode, bit for bit.
TEST(AttentionPrefill, ChunkByChunkAndLastPositionEqualsDecode) {
  KVQ_FRESH_SEED();
  const size_t d = 64, hq = 4;
  const CacheConfig cfg = config_for({64, 64, 64, 2, 2, {400}, true}, "f16", "f16", seed);
  const Tokens t = test::make_tokens(cfg, 400, seed + 1, true);
  KVCache cache(cfg);
  const SeqId s = cache.add_sequence();
  size_t pos = 0;
  for (size_t chunk : {100, 7, 64, 1, 1, 150}) {
    test::append_range(cache, s, 1, t, pos, pos + chunk, {chunk});
    const auto q = gaussian_vectors(chunk * hq, 64, seed + pos);
    std::vector<float> out(q.size());
    prefill_attention(cache, 1, s, pos, chunk, q, out);
    for (size_t j = 0; j < hq; ++j) {
      const Tokens kv = test::decoded_head(cache, s, 1, static_cast<int>(j / 2));
      for (size_t p = 0; p < chunk; ++p) {
        Reference ref(1, d);
        reference_row(ref, 0, q.data() + (p * hq + j) * d, kv, pos + chunk, pos + p + 1, 64);
        const std::vector<float> got(out.begin() + static_cast<std::ptrdiff_t>((p * hq + j) * d),
                                     out.begin() + static_cast<std::ptrdiff_t>((p * hq + j + 1) * d));
        ASSERT_LE(vs_reference(got, ref, d), 1.0) << "position " << pos + p << " head " << j;
      }
    }
    std::vector<float> last(out.end() - static_cast<std::ptrdiff_t>(hq * d), out.end()), dec(hq * d);
    const std::vector<float> q_last(q.end() - static_cast<std::ptrdiff_t>(hq * d), q.end());
    const SeqId one[1] = {s};
    decode_attention(cache, 1, one, q_last, dec);
    EXPECT_EQ(std::memcmp(last.data(), dec.data(), dec.size() * 4), 0);
    pos += chunk;
  }
}

std::string spec_name(const testing::TestParamInfo<std::string>& info) {
  std::string s = info.param;
  for (char& c : s)
    if (!std::isalnum(static_cast<unsigned char>(c))) c = '_';
  return s;
}

INSTANTIATE_TEST_SUITE_P(AttentionAllKeyCodecs, AttentionCodecs, testing::ValuesIn(codec_test_specs()), spec_name);

// A DecodePlan made once and run at every step, tokens appended between the runs, gives decode_attention's bits:
// the same engine over the sequences as they are at each run, its scratch kept (and grown) between runs.
TEST(AttentionDecodePlan, RunsEqualDecodeAttentionAsSequencesGrow) {
  KVQ_FRESH_SEED();
  const Shape shape{128, 64, 64, 2, 4, {0, 63, 200}, true};
  CacheConfig cfg = config_for(shape, "int4", "kivi:2", seed);
  cfg.capacity_pages += 12;
  KVCache cache(cfg);
  std::vector<SeqId> ids;
  std::vector<Tokens> tokens;
  for (size_t i = 0; i < shape.lengths.size(); ++i) {
    ids.push_back(cache.add_sequence());
    tokens.push_back(make_tokens(cfg, shape.lengths[i] + 140, seed + 10 * i, true));
    append_range(cache, ids.back(), 1, tokens.back(), 0, shape.lengths[i]);
  }
  ThreadPool two(2);
  AttentionOptions windowed;
  windowed.window = 100;
  for (const AttentionOptions& options : {AttentionOptions{}, windowed})
    for (ThreadPool* pool : {static_cast<ThreadPool*>(nullptr), &two}) {
      KVCache grown(cfg);  // the same prompts again, for this plan
      for (size_t i = 0; i < ids.size(); ++i) {
        ASSERT_EQ(grown.add_sequence(), ids[i]);
        append_range(grown, ids[i], 1, tokens[i], 0, shape.lengths[i]);
      }
      DecodePlan plan(grown, 1, ids, shape.H * shape.G, options, pool);
      for (size_t step = 0; step < 140; step += 7) {
        SCOPED_TRACE("window " + std::to_string(options.window) + ", pool " + std::to_string(pool != nullptr) +
                     ", step " + std::to_string(step));
        for (size_t i = 0; i < ids.size(); ++i)
          append_range(grown, ids[i], 1, tokens[i], shape.lengths[i] + step, shape.lengths[i] + step + 7);
        const auto q = queries(shape, ids.size(), seed + step);
        std::vector<float> want(q.size()), got(q.size(), NAN);
        decode_attention(grown, 1, ids, q, want, options, pool);
        plan.run(q, got);
        ASSERT_EQ(std::memcmp(got.data(), want.data(), want.size() * sizeof(float)), 0);
      }
    }
  std::vector<float> q(3 * 8 * 128), out(q.size());
  DecodePlan plan(cache, 1, ids, 8);
  EXPECT_THROW(plan.run(std::span<const float>(q).first(8 * 128), std::span<float>(out).first(8 * 128)), Error);
  EXPECT_THROW(DecodePlan(cache, 2, ids, 8), Error);                   // no layer 2
  EXPECT_THROW(DecodePlan(cache, 1, ids, 7), Error);                   // not a multiple of 2 kv heads
  EXPECT_THROW(DecodePlan(cache, 1, std::vector<SeqId>{99}, 8), Error);  // no such sequence
  AttentionOptions bad;
  bad.splits = -1;
  EXPECT_THROW(DecodePlan(cache, 1, ids, 8, bad), Error);
}

TEST(AttentionDecode, RejectsBadArguments) {
  KVQ_FRESH_SEED();
  const Shape shape{64, 64, 0, 2, 2, {100}, false};
  const Scenario sc = build(shape, "f16", "f16", seed);
  auto q = queries(shape, 1, seed);
  std::vector<float> out(q.size());
  const SeqId id[1] = {sc.ids[0]}, missing[1] = {sc.ids[0] + 5};
  EXPECT_THROW(decode_attention(sc.cache, 2, id, q, out), Error);
  EXPECT_THROW(decode_attention(sc.cache, 1, missing, q, out), Error);
  EXPECT_THROW(decode_attention(sc.cache, 1, id, q, std::span<float>(out).first(64)), Error);
  std::vector<float> three(3 * 64), out3(3 * 64);  // 3 query heads over 2 kv heads
  EXPECT_THROW(decode_attention(sc.cache, 1, id, three, out3), Error);
  AttentionOptions bad;
  bad.scale = -1;
  EXPECT_THROW(decode_attention(sc.cache, 1, id, q, out, bad), Error);
  q[70] = std::numeric_limits<float>::infinity();
  EXPECT_THROW(decode_attention(sc.cache, 1, id, q, out), Error);
  const auto q11 = gaussian_vectors(11 * 4, 64, seed);
  std::vector<float> out11(q11.size());
  EXPECT_THROW(prefill_attention(sc.cache, 1, id[0], 90, 11, q11, out11), Error);  // position 100 not appended
  EXPECT_NO_THROW(prefill_attention(sc.cache, 1, id[0], 89, 11, q11, out11));
  EXPECT_THROW(prefill_attention(sc.cache, 1, id[0], 89, 10, q11, out11), Error);  // 11 rows for 10 positions
}

}  // namespace
}  // namespace kvq

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

#include "cache_test_util.hpp"
#include "kvq/error.hpp"
#include "kvq/synthetic.hpp"
#include "kvq/thread_pool.hpp"
#include "test_seed.hpp"

namespace kvq {
namespace {

using test::Tokens;

struct Shape {
  int d, T, R, H, G;
  std::vector<size_t> lengths;  // one sequence each, attended in one call
  bool key_like;                // keys with outlier channels, else Gaussian
};

std::string describe(const Shape& s) {
  std::string text = "d=" + std::to_string(s.d) + " T=" + std::to_string(s.T) + " R=" + std::to_string(s.R) +
                     " H=" + std::to_string(s.H) + " G=" + std::to_string(s.G) + " lengths";
  for (size_t n : s.lengths) text += " " + std::to_string(n);
  return text + (s.key_like ? " key-like" : " gaussian");
}

// A cache holding one sequence per length (2 layers, attention on layer 1), and the tokens appended.
struct Scenario {
  CacheConfig cfg;
  KVCache cache;
  std::vector<SeqId> ids;
  std::vector<Tokens> tokens;
};

CacheConfig config_for(const Shape& s, const std::string& k, const std::string& v, uint64_t seed) {
  CacheConfig c;
  c.n_layers = 2;
  c.n_kv_heads = s.H;
  c.head_dim = s.d;
  c.block_tokens = s.T;
  c.key_codec = k;
  c.value_codec = v;
  c.residual_tokens = s.R;
  for (size_t n : s.lengths) c.capacity_pages += n / static_cast<size_t>(s.T) + 1;
  c.seed = seed;
  return c;
}

Scenario build(const Shape& s, const std::string& k, const std::string& v, uint64_t seed) {
  const CacheConfig cfg = config_for(s, k, v, seed);
  Scenario sc{cfg, KVCache(cfg), {}, {}};
  test::train_if_needed(sc.cache, seed, 1);
  for (size_t i = 0; i < s.lengths.size(); ++i) {
    sc.ids.push_back(sc.cache.add_sequence());
    sc.tokens.push_back(test::make_tokens(cfg, s.lengths[i], seed + 10 * i, s.key_like));
    test::append_range(sc.cache, sc.ids.back(), 1, sc.tokens.back(), 0, s.lengths[i]);
  }
  return sc;
}

// Reference outputs and, per row, what the error of an fp32 implementation is measured against.
struct Reference {
  explicit Reference(size_t rows, size_t d) : out(rows * d), magnitude(rows), condition(rows) {}
  std::vector<float> out;
  std::vector<double> magnitude;  // sum_t p_t |v_t|, the size of the weighted sum
  std::vector<double> condition;  // max_t scale * sum_j |q_j k_tj|, the size of the terms of the scores
};

// Fills reference row `row` for one query row q (d floats) over the first `visible` tokens of kv.
void reference_row(Reference& ref, size_t row, const float* q, const Tokens& kv, size_t n_tokens, size_t visible,
                   int d) {
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  reference_attention(q, 1, kv.keys.data(), kv.values.data(), n_tokens, d, visible, scale,
                      ref.out.data() + row * static_cast<size_t>(d), &ref.magnitude[row]);
  double cond = 0;
  for (size_t t = 0; t < std::min(visible, n_tokens); ++t) {
    double sum = 0;
    for (int c = 0; c < d; ++c) sum += std::fabs(static_cast<double>(q[c]) * kv.keys[t * static_cast<size_t>(d) + c]);
    cond = std::max(cond, scale * sum);
  }
  ref.condition[row] = cond;
}

// Largest over rows of |got - want| / ((tol + allowance) * magnitude), to be <= 1. With `score_rounding`, the
// allowance is sqrt(d) 2^-24 condition, the typical rounding error of an fp32 dot product: key-like keys give
// scaled scores of +-40 whose fp32 error alone nears 1e-5 (measured: at most 0.3 of this allowance), while a wrong
// mask or merge is off by 1e-3 or more. A row that sees no token must be exactly zero.
double worst(const std::vector<float>& got, const std::vector<float>& want, const Reference& ref, size_t d, double tol,
             bool score_rounding) {
  double ratio = 0;
  for (size_t r = 0; r < want.size() / d; ++r) {
    double err = 0;
    for (size_t c = 0; c < d; ++c) {
      const double e = static_cast<double>(got[r * d + c]) - want[r * d + c];
      err += e * e;
    }
    const double allowance = score_rounding ? std::sqrt(static_cast<double>(d)) * 0x1p-24 * ref.condition[r] : 0;
    const double bound = (tol + allowance) * ref.magnitude[r];
    ratio = std::max(ratio, bound == 0 ? (err == 0 ? 0 : INFINITY) : std::sqrt(err) / bound);
  }
  return ratio;
}

// Against the reference to 1e-5 (plus fp32 score rounding).
double vs_reference(const std::vector<float>& got, const Reference& ref, size_t d) {
  return worst(got, ref.out, ref, d, 1e-5, true);
}

std::vector<float> decode(const Scenario& sc, const std::vector<float>& q, ThreadPool* pool, int splits = 0) {
  std::vector<float> out(q.size(), NAN);
  AttentionOptions options;
  options.splits = splits;
  decode_attention(sc.cache, 1, sc.ids, q, out, options, pool);
  return out;
}

// The reference for decode: each query head against its kv head's tokens, decoded from the cache or original.
Reference reference_decode(const Scenario& sc, const std::vector<float>& q, int G, bool decoded) {
  const size_t d = static_cast<size_t>(sc.cfg.head_dim), H = static_cast<size_t>(sc.cfg.n_kv_heads);
  Reference ref(q.size() / d, d);
  for (size_t s = 0; s < sc.ids.size(); ++s) {
    const size_t n = sc.cache.length(sc.ids[s], 1);
    for (size_t h = 0; h < H; ++h) {
      const Tokens kv = decoded ? test::decoded_head(sc.cache, sc.ids[s], 1, static_cast<int>(h))
                                : test::original_head(sc.tokens[s], sc.cfg, n, static_cast<int>(h));
      for (size_t j = 0; j < static_cast<size_t>(G); ++j) {
        const size_t row = (s * H + h) * static_cast<size_t>(G) + j;
        reference_row(ref, row, q.data() + row * d, kv, n, n, static_cast<int>(d));
      }
    }
  }
  return ref;
}

std::vector<float> queries(const Shape& s, size_t n_rows, uint64_t seed) {
  return gaussian_vectors(n_rows * static_cast<size_t>(s.H * s.G), s.d, seed);
}

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

// Prefill: query at position p sees tokens 0..p, for chunks of 1, 7, 64 and 100 positions at several starts.
void check_prefill(const Shape& shape, const std::string& k, const std::string& v, uint64_t seed,
                   const std::vector<size_t>& chunks, const std::vector<size_t>& starts) {
  SCOPED_TRACE(k + "/" + v + ", " + describe(shape));
  const Scenario sc = build(shape, k, v, seed);
  const size_t L = shape.lengths[0], d = static_cast<size_t>(shape.d), hq = static_cast<size_t>(shape.H * shape.G);
  std::vector<Tokens> heads;
  for (int h = 0; h < shape.H; ++h) heads.push_back(test::decoded_head(sc.cache, sc.ids[0], 1, h));
  ThreadPool two(2);
  for (size_t chunk : chunks)
    for (size_t start : starts) {
      start = std::min(start, L - chunk);  // "L" as a start: the chunk that ends the sequence
      SCOPED_TRACE("chunk " + std::to_string(chunk) + " at " + std::to_string(start));
      const auto q = gaussian_vectors(chunk * hq, shape.d, seed + start * 7 + chunk);
      std::vector<float> out(q.size(), NAN);
      prefill_attention(sc.cache, 1, sc.ids[0], start, chunk, q, out, {}, chunk % 2 ? &two : nullptr);
      Reference ref(chunk * hq, d);
      for (size_t p = 0; p < chunk; ++p)
        for (size_t j = 0; j < hq; ++j)
          reference_row(ref, p * hq + j, q.data() + (p * hq + j) * d, heads[j / static_cast<size_t>(shape.G)], L,
                        start + p + 1, shape.d);
      EXPECT_LE(vs_reference(out, ref, d), 1.0);
    }
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

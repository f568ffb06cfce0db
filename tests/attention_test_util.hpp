// Helpers shared by the attention tests: caches of synthetic sequences, the double-precision reference over the
// decoded cache, and the error measure with its tolerances.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <string>
#include <vector>

#include "cache_test_util.hpp"
#include "kvq/attention.hpp"
#include "kvq/detail/synthetic.hpp"

namespace kvq::test {

struct Shape {
  int d, T, R, H, G;
  std::vector<size_t> lengths;  // one sequence each, attended in one call
  bool key_like;                // keys with outlier channels, else Gaussian
};

inline std::string describe(const Shape& s) {
  std::string text = "d=" + std::to_string(s.d) + " T=" + std::to_string(s.T) + " R=" + std::to_string(s.R) +
                     " H=" + std::to_string(s.H) + " G=" + std::to_string(s.G) + " lengths";
  for (size_t n : s.lengths) text.append(" ").append(std::to_string(n));
  return text + (s.key_like ? " key-like" : " gaussian");
}

// A cache holding one sequence per length (2 layers, attention on layer 1), and the tokens appended.
struct Scenario {
  CacheConfig cfg;
  KVCache cache;
  std::vector<SeqId> ids;
  std::vector<Tokens> tokens;
};

inline CacheConfig config_for(const Shape& s, const std::string& k, const std::string& v, uint64_t seed) {
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

inline Scenario build(const Shape& s, const std::string& k, const std::string& v, uint64_t seed,
                      bool center_keys = false) {
  CacheConfig cfg = config_for(s, k, v, seed);
  cfg.center_keys = center_keys;
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
inline void reference_row(Reference& ref, size_t row, const float* q, const Tokens& kv, size_t n_tokens, size_t visible,
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
inline double worst(const std::vector<float>& got, const std::vector<float>& want, const Reference& ref, size_t d,
                    double tol, bool score_rounding) {
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
inline double vs_reference(const std::vector<float>& got, const Reference& ref, size_t d) {
  return worst(got, ref.out, ref, d, 1e-5, true);
}

// |a_r - b_r| / |norm_r| summed over the rows of d floats: the fast kernels' contract compares the sum for the
// kernel against the sum for the codec.
inline double summed_distance(const std::vector<float>& a, const std::vector<float>& b, const std::vector<float>& norm,
                              size_t d) {
  double sum = 0;
  for (size_t r = 0; r < norm.size() / d; ++r) {
    double e = 0, n = 0;
    for (size_t c = 0; c < d; ++c) {
      const double x = static_cast<double>(a[r * d + c]) - b[r * d + c];
      e += x * x;
      n += static_cast<double>(norm[r * d + c]) * norm[r * d + c];
    }
    if (n > 0) sum += std::sqrt(e / n);
  }
  return sum;
}

inline std::vector<float> decode(const Scenario& sc, const std::vector<float>& q, ThreadPool* pool, int splits = 0) {
  std::vector<float> out(q.size(), NAN);
  AttentionOptions options;
  options.splits = splits;
  decode_attention(sc.cache, 1, sc.ids, q, out, options, pool);
  return out;
}

// The reference for decode: each query head against its kv head's tokens, decoded from the cache or original;
// with a sliding window (AttentionOptions::window), against the newest `window` of them.
inline Reference reference_decode(const Scenario& sc, const std::vector<float>& q, int G, bool decoded,
                                  size_t window = 0) {
  const size_t d = static_cast<size_t>(sc.cfg.head_dim), H = static_cast<size_t>(sc.cfg.n_kv_heads);
  Reference ref(q.size() / d, d);
  for (size_t s = 0; s < sc.ids.size(); ++s) {
    const size_t n = sc.cache.length(sc.ids[s], 1);
    const size_t first = window > 0 && n > window ? n - window : 0;
    for (size_t h = 0; h < H; ++h) {
      Tokens kv = decoded ? test::decoded_head(sc.cache, sc.ids[s], 1, static_cast<int>(h))
                          : test::original_head(sc.tokens[s], sc.cfg, n, static_cast<int>(h));
      kv.keys.erase(kv.keys.begin(), kv.keys.begin() + static_cast<std::ptrdiff_t>(first * d));
      kv.values.erase(kv.values.begin(), kv.values.begin() + static_cast<std::ptrdiff_t>(first * d));
      for (size_t j = 0; j < static_cast<size_t>(G); ++j) {
        const size_t row = (s * H + h) * static_cast<size_t>(G) + j;
        reference_row(ref, row, q.data() + row * d, kv, n - first, n - first, static_cast<int>(d));
      }
    }
  }
  return ref;
}

inline std::vector<float> queries(const Shape& s, size_t n_rows, uint64_t seed) {
  return gaussian_vectors(n_rows * static_cast<size_t>(s.H * s.G), s.d, seed);
}

// Prefill: query at position p sees tokens 0..p, for chunks of 1, 7, 64 and 100 positions at several starts.
inline void check_prefill(const Shape& shape, const std::string& k, const std::string& v, uint64_t seed,
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

}  // namespace kvq::test

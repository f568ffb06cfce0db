// Helpers shared by the cache and attention tests: fill a cache with synthetic tokens, read it back decoded.
#pragma once

#include <algorithm>
#include <cstring>
#include <vector>

#include "kvq/cache.hpp"
#include "kvq/codec.hpp"
#include "kvq/detail/synthetic.hpp"

namespace kvq::test {

/// Tokens of one (sequence, layer) as appended: [n][n_kv_heads][d].
struct Tokens {
  std::vector<float> keys, values;
};

/// n tokens for a cache: keys Gaussian or key-like (outlier channels), values Gaussian.
inline Tokens make_tokens(const CacheConfig& cfg, size_t n, uint64_t seed, bool key_like) {
  const size_t rows = n * static_cast<size_t>(cfg.n_kv_heads);
  Tokens t;
  t.keys = key_like ? sample_profile(key_like_profile(cfg.head_dim, seed), rows, seed + 1)
                    : gaussian_vectors(rows, cfg.head_dim, seed + 1);
  t.values = gaussian_vectors(rows, cfg.head_dim, seed + 2);
  return t;
}

/// Appends tokens [from, to) of `t` to (seq, layer) in chunks cycling through `chunks` (1 = decode steps).
inline void append_range(KVCache& cache, SeqId seq, int layer, const Tokens& t, size_t from, size_t to,
                         const std::vector<size_t>& chunks = {1, 7, 64, 100}) {
  const size_t row = static_cast<size_t>(cache.config().n_kv_heads) * cache.config().head_dim;
  for (size_t i = 0, pos = from; pos < to; ++i) {
    const size_t n = std::min(chunks[i % chunks.size()], to - pos);
    cache.append(seq, layer, t.keys.data() + pos * row, t.values.data() + pos * row, n);
    pos += n;
  }
}

/// Trains the layers (all, or only `only_layer`) whose codecs need it, on data like `make_tokens` produces.
inline void train_if_needed(KVCache& cache, uint64_t seed, int only_layer = -1) {
  const CacheConfig& cfg = cache.config();
  for (int l = 0; l < cfg.n_layers; ++l) {
    if (cache.ready(l) || (only_layer >= 0 && l != only_layer)) continue;
    constexpr size_t kTrain = 2048;
    const auto keys = sample_profile(key_like_profile(cfg.head_dim, seed), kTrain, seed + 3);
    const auto values = gaussian_vectors(kTrain, cfg.head_dim, seed + 4);
    cache.train_layer(l, keys.data(), values.data(), kTrain);
  }
}

/// Tokens [0, n) of one head of `t` ([n][H][d]) as n x d arrays.
inline Tokens original_head(const Tokens& t, const CacheConfig& cfg, size_t n, int head) {
  const size_t d = static_cast<size_t>(cfg.head_dim), H = static_cast<size_t>(cfg.n_kv_heads);
  Tokens out;
  out.keys.resize(n * d);
  out.values.resize(n * d);
  for (size_t i = 0; i < n; ++i) {
    std::memcpy(out.keys.data() + i * d, t.keys.data() + (i * H + static_cast<size_t>(head)) * d, d * 4);
    std::memcpy(out.values.data() + i * d, t.values.data() + (i * H + static_cast<size_t>(head)) * d, d * 4);
  }
  return out;
}

/// Every kv head of (sequence, layer) as the cache holds it (KVCache::read): [length][n_kv_heads][d].
inline Tokens decoded(const KVCache& cache, SeqId seq, int layer) {
  const CacheConfig& c = cache.config();
  Tokens all;
  all.keys.resize(cache.length(seq, layer) * static_cast<size_t>(c.n_kv_heads * c.head_dim));
  all.values.resize(all.keys.size());
  cache.read(seq, layer, all.keys.data(), all.values.data());
  return all;
}

/// The (sequence, layer, kv head) the cache holds (KVCache::read: pages decoded, the fp32 window, the key offset
/// added back). keys and values: length x d.
inline Tokens decoded_head(const KVCache& cache, SeqId seq, int layer, int head) {
  return original_head(decoded(cache, seq, layer), cache.config(), cache.length(seq, layer), head);
}

}  // namespace kvq::test

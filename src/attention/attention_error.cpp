// kvq attention-error: a cache of the codec pair filled with key-like data, decode attention over it, and the
// double-precision reference over the original data (include/kvq/detail/attention_error.hpp).
#include "kvq/detail/attention_error.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kvq/attention.hpp"
#include "kvq/cache.hpp"
#include "kvq/detail/random.hpp"
#include "kvq/detail/synthetic.hpp"
#include "kvq/error.hpp"

namespace kvq {
namespace {

// [n][heads][d] from one profile per head (each kv head has its own outlier channels and means).
std::vector<float> sample_heads(const std::vector<ChannelProfile>& profiles, size_t n, uint64_t seed) {
  const size_t heads = profiles.size(), d = profiles[0].mean.size();
  std::vector<float> out(n * heads * d);
  for (size_t h = 0; h < heads; ++h) {
    const std::vector<float> x = sample_profile(profiles[h], n, derive_seed(seed, h));
    for (size_t t = 0; t < n; ++t) std::copy_n(x.begin() + t * d, d, out.begin() + (t * heads + h) * d);
  }
  return out;
}

// One head's n x d slice of [n][heads][d] data.
std::vector<float> head_slice(const std::vector<float>& x, size_t n, size_t heads, size_t head, size_t d) {
  std::vector<float> out(n * d);
  for (size_t t = 0; t < n; ++t) std::copy_n(x.begin() + (t * heads + head) * d, d, out.begin() + t * d);
  return out;
}

// Softmax weights of q over n keys (n x d), in double.
std::vector<double> weights(const float* q, const float* k, size_t n, size_t d, double scale) {
  std::vector<double> w(n);
  for (size_t t = 0; t < n; ++t) {
    double dot = 0;
    for (size_t c = 0; c < d; ++c) dot += static_cast<double>(q[c]) * k[t * d + c];
    w[t] = dot * scale;
  }
  const double mx = *std::max_element(w.begin(), w.end());
  double sum = 0;
  for (double& x : w) sum += (x = std::exp(x - mx));
  for (double& x : w) x /= sum;
  return w;
}

// The keys the cache holds for one kv head, decoded (encoded pages, then the fp32 window).
std::vector<float> decoded_keys(const KVCache& cache, SeqId seq, int head) {
  const LayerView view = cache.view(seq, 0);
  const size_t d = static_cast<size_t>(cache.config().head_dim), T = static_cast<size_t>(view.block_tokens);
  std::vector<float> k(view.length() * d);
  for (size_t j = 0; j < view.pages.size(); ++j)
    cache.key_codec(0).decode(cache.key_block(view.pages[j], head), static_cast<int>(T), k.data() + j * T * d);
  std::copy_n(view.residual_key(head), static_cast<size_t>(view.residual_count) * d, k.begin() + view.encoded_tokens() * d);
  if (view.key_offset != nullptr)  // centered keys: add the offset back
    for (size_t i = 0; i < view.length(); ++i)
      for (size_t c = 0; c < d; ++c) k[i * d + c] += view.key_offset[static_cast<size_t>(head) * d + c];
  return k;
}

}  // namespace

AttentionErrorResult measure_attention_error(const AttentionErrorOptions& o) {
  KVQ_CHECK(o.ctx >= 1, "attention-error needs a context of at least one token (got ", o.ctx, ")");
  KVQ_CHECK(o.kv_heads >= 1 && o.q_heads >= o.kv_heads && o.q_heads % o.kv_heads == 0, "query heads (", o.q_heads,
            ") must be a positive multiple of kv heads (", o.kv_heads, ")");
  KVQ_CHECK(o.queries >= 1, "attention-error needs at least one query (got ", o.queries, ")");
  KVQ_CHECK(o.logit_std > 0, "the logit spread must be positive (got ", o.logit_std, ")");
  const size_t d = static_cast<size_t>(o.dim), n = static_cast<size_t>(o.ctx);
  const size_t G = static_cast<size_t>(o.kv_heads), H = static_cast<size_t>(o.q_heads), group = H / G;

  std::vector<ChannelProfile> key_profiles, value_profiles;
  for (size_t h = 0; h < G; ++h) {
    key_profiles.push_back(key_like_profile(o.dim, derive_seed(o.seed, 2 * h)));
    value_profiles.push_back(key_like_profile(o.dim, derive_seed(o.seed, 2 * h + 1)));
  }
  const std::vector<float> keys = sample_heads(key_profiles, n, derive_seed(o.seed, 100));
  const std::vector<float> values = sample_heads(value_profiles, n, derive_seed(o.seed, 101));

  CacheConfig config;
  config.n_kv_heads = o.kv_heads;
  config.head_dim = o.dim;
  config.key_codec = o.key_codec;
  config.value_codec = o.value_codec;
  config.capacity_pages = (n + 63) / 64;
  config.seed = derive_seed(o.seed, 102);
  KVCache cache(config);
  if (!cache.ready(0)) {
    constexpr size_t kTrain = 4096;
    const std::vector<float> tk = sample_heads(key_profiles, kTrain, derive_seed(o.seed, 103));
    const std::vector<float> tv = sample_heads(value_profiles, kTrain, derive_seed(o.seed, 104));
    // Trained per layer on every head's vectors together, as the model runner's calibration does.
    cache.train_layer(0, tk.data(), tv.data(), kTrain * G);
  }
  const SeqId seq = cache.add_sequence();
  cache.append(seq, 0, keys.data(), values.data(), n);

  AttentionErrorResult r;
  r.key_codec = cache.config().key_codec;
  r.value_codec = cache.config().value_codec;
  r.bits_k = cache.key_codec(0).bits_per_element();
  r.bits_v = cache.value_codec(0).bits_per_element();
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  std::vector<std::vector<float>> k_head, v_head, k_cache;
  for (size_t h = 0; h < G; ++h) {
    k_head.push_back(head_slice(keys, n, G, h, d));
    v_head.push_back(head_slice(values, n, G, h, d));
    k_cache.push_back(decoded_keys(cache, seq, static_cast<int>(h)));
  }
  std::vector<float> q(H * d), out(H * d), ref(d);
  double err_sum = 0, tv_sum = 0;
  for (int call = 0; call < o.queries; ++call) {
    for (size_t j = 0; j < H; ++j) {
      const size_t h = j / group;
      std::vector<float> x = sample_profile(key_profiles[h], 1, derive_seed(o.seed, 1000 + call * H + j));
      // Scale so that the logits q.k * scale over the context have standard deviation logit_std.
      double s1 = 0, s2 = 0;
      for (size_t t = 0; t < n; ++t) {
        double dot = 0;
        for (size_t c = 0; c < d; ++c) dot += static_cast<double>(x[c]) * k_head[h][t * d + c];
        s1 += dot * scale;
        s2 += dot * scale * dot * scale;
      }
      const double sd = std::sqrt(std::max(s2 / n - (s1 / n) * (s1 / n), 1e-30));
      for (size_t c = 0; c < d; ++c) q[j * d + c] = static_cast<float>(x[c] * (n > 1 ? o.logit_std / sd : 1.0));
    }
    decode_attention(cache, 0, {&seq, 1}, q, out);
    for (size_t j = 0; j < H; ++j) {
      const size_t h = j / group;
      reference_attention(q.data() + j * d, 1, k_head[h].data(), v_head[h].data(), n, o.dim, n, scale, ref.data());
      double e = 0, r2 = 0;
      for (size_t c = 0; c < d; ++c) {
        e += (static_cast<double>(out[j * d + c]) - ref[c]) * (static_cast<double>(out[j * d + c]) - ref[c]);
        r2 += static_cast<double>(ref[c]) * ref[c];
      }
      const double rel = std::sqrt(e / std::max(r2, 1e-300));
      err_sum += rel;
      r.rel_err_max = std::max(r.rel_err_max, rel);
      const std::vector<double> w = weights(q.data() + j * d, k_head[h].data(), n, d, scale);
      const std::vector<double> wq = weights(q.data() + j * d, k_cache[h].data(), n, d, scale);
      double tv = 0;
      for (size_t t = 0; t < n; ++t) tv += std::abs(w[t] - wq[t]);
      tv_sum += tv / 2;
    }
  }
  const double count = static_cast<double>(o.queries) * static_cast<double>(H);
  r.rel_err_mean = err_sum / count;
  r.weights_tv = tv_sum / count;
  return r;
}

}  // namespace kvq

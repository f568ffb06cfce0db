// kvq attention-error: a cache of the codec pair filled with key-like data, decode attention over it, and the
// double-precision reference over the original data (include/kvq/detail/attention_error.hpp).
#include "kvq/detail/attention_error.hpp"

#include <algorithm>
#include <cmath>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kvq/attention.hpp"
#include "kvq/cache.hpp"
#include "kvq/cuda.hpp"
#include "kvq/device.hpp"
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

// |a - b| / norm over d floats.
double relative_distance(const float* a, const float* b, size_t d, double norm) {
  double e = 0;
  for (size_t c = 0; c < d; ++c) e += (static_cast<double>(a[c]) - b[c]) * (static_cast<double>(a[c]) - b[c]);
  return std::sqrt(e) / std::max(norm, 1e-300);
}

// Decode attention of one sequence's queries (q, out: [q heads][d], host memory) on the device the options name:
// the cache itself, or its copy on a CUDA device with the queries uploaded there.
class DecodeRunner {
 public:
  DecodeRunner(const KVCache& cache, SeqId seq, const std::string& device) : seq_(seq) {
    const Device where = Device::parse(device);
    if (where.is_cuda()) device_cache_ = std::make_unique<KVCache>(cache.to(where));
    cache_ = device_cache_ ? device_cache_.get() : &cache;
  }
  std::string kernel() const { return attention_kernel(*cache_, 0); }
  void run(std::span<const float> q, std::span<float> out) {
    if (!device_cache_) return decode_attention(*cache_, 0, {&seq_, 1}, q, out);
    const int index = cache_->device().index;
    if (!q_dev_) {
      q_dev_ = std::make_unique<cuda::DeviceFloats>(q.size(), index);
      out_dev_ = std::make_unique<cuda::DeviceFloats>(out.size(), index);
    }
    q_dev_->upload(q);
    decode_attention(*cache_, 0, {&seq_, 1}, {q_dev_->data(), q.size()}, {out_dev_->data(), out.size()});
    const std::vector<float> result = out_dev_->download();
    std::copy(result.begin(), result.end(), out.begin());
  }

 private:
  SeqId seq_;
  std::unique_ptr<KVCache> device_cache_;
  const KVCache* cache_ = nullptr;
  std::unique_ptr<cuda::DeviceFloats> q_dev_, out_dev_;
};

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
  DecodeRunner runner(cache, seq, o.device);
  r.kernel = runner.kernel();
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  std::vector<float> keys_held(keys.size()), values_held(values.size());  // decoded, the key offset added back
  cache.read(seq, 0, keys_held.data(), values_held.data());
  std::vector<std::vector<float>> k_head, v_head, k_cache, v_cache;
  for (size_t h = 0; h < G; ++h) {
    k_head.push_back(head_slice(keys, n, G, h, d));
    v_head.push_back(head_slice(values, n, G, h, d));
    k_cache.push_back(head_slice(keys_held, n, G, h, d));
    v_cache.push_back(head_slice(values_held, n, G, h, d));
  }
  std::vector<float> q(H * d), out(H * d), ref(d), ref_decoded(d);
  double err_sum = 0, tv_sum = 0, codec_sum = 0, kernel_sum = 0;
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
    runner.run(q, out);
    for (size_t j = 0; j < H; ++j) {
      const size_t h = j / group;
      reference_attention(q.data() + j * d, 1, k_head[h].data(), v_head[h].data(), n, o.dim, n, scale, ref.data());
      reference_attention(q.data() + j * d, 1, k_cache[h].data(), v_cache[h].data(), n, o.dim, n, scale,
                          ref_decoded.data());
      double r2 = 0;
      for (size_t c = 0; c < d; ++c) r2 += static_cast<double>(ref[c]) * ref[c];
      const double norm = std::sqrt(r2);
      const double rel = relative_distance(out.data() + j * d, ref.data(), d, norm);
      err_sum += rel;
      r.rel_err_max = std::max(r.rel_err_max, rel);
      codec_sum += relative_distance(ref_decoded.data(), ref.data(), d, norm);
      const double kernel_err = relative_distance(out.data() + j * d, ref_decoded.data(), d, norm);
      kernel_sum += kernel_err;
      r.kernel_err_max = std::max(r.kernel_err_max, kernel_err);
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
  r.codec_err_mean = codec_sum / count;
  r.kernel_err_mean = kernel_sum / count;
  return r;
}

}  // namespace kvq

#include "kvq/detail/distortion.hpp"

#include <algorithm>
#include <cmath>
#include <vector>

#include "kvq/detail/random.hpp"
#include "kvq/detail/synthetic.hpp"
#include "kvq/error.hpp"

namespace kvq {
namespace {

constexpr size_t kTrainVectors = 32768;

std::unique_ptr<Codec> build(const DistortionOptions& o, uint64_t seed) {
  CodecParams p{o.dim, o.block_tokens, seed, o.role};
  auto codec = make_codec(o.codec, p);
  if (codec->needs_training()) {
    const auto train = unit_vectors(kTrainVectors, o.dim, derive_seed(o.seed, 0x7a11));
    codec->train(train.data(), kTrainVectors);
  }
  return codec;
}

// x: a random unit vector; y: a unit vector with <x, y> = 0.5 exactly (up to fp32 rounding).
void correlated_pair(Rng& rng, int d, float* x, float* y) {
  std::vector<double> a(d), b(d);
  double na = 0;
  for (auto& v : a) v = rng.normal(), na += v * v;
  for (auto& v : a) v /= std::sqrt(na);
  double dot = 0, nb = 0;
  for (auto& v : b) v = rng.normal();
  for (int j = 0; j < d; ++j) dot += a[j] * b[j];
  for (int j = 0; j < d; ++j) b[j] -= dot * a[j], nb += b[j] * b[j];
  for (int j = 0; j < d; ++j) {
    x[j] = static_cast<float>(a[j]);
    y[j] = static_cast<float>(0.5 * a[j] + std::sqrt(0.75) * b[j] / std::sqrt(nb));
  }
}

}  // namespace

DistortionResult measure_distortion(const DistortionOptions& o) {
  KVQ_CHECK(o.n >= 2, "distortion: need at least 2 vectors, got ", o.n);
  const int d = o.dim, T = o.block_tokens;
  DistortionResult r;
  r.codec = o.codec;
  r.dim = d;
  r.n = o.n;
  const size_t total = 2 * o.n;

  // Reconstruction MSE: one codec, N unit vectors in blocks of T.
  auto codec = build(o, o.seed);
  r.bits_per_element = codec->bits_per_element();
  const auto x = unit_vectors(o.n, d, derive_seed(o.seed, 0xda7a));
  std::vector<uint8_t> block(codec->block_bytes());
  std::vector<float> xhat(static_cast<size_t>(T) * d);
  double se = 0;
  for (size_t start = 0; start < o.n; start += T) {
    const int n = static_cast<int>(std::min<size_t>(T, o.n - start));
    codec->encode(x.data() + start * d, n, block.data());
    codec->decode(block.data(), n, xhat.data());
    for (size_t i = 0; i < static_cast<size_t>(n) * d; ++i) {
      const double e = static_cast<double>(x[start * d + i]) - xhat[i];
      se += e * e;
    }
    if (o.progress) o.progress(start + n, total);
  }
  r.mse = se / static_cast<double>(o.n);

  // Inner products: a fresh codec per trial (unless trained), x hidden among T-1 other unit vectors.
  Rng rng(derive_seed(o.seed, 0x1b));
  std::vector<float> keys(static_cast<size_t>(T) * d), y(d), scores(T);
  double sum = 0, sum_sq = 0;
  for (size_t trial = 0; trial < o.n; ++trial) {
    std::unique_ptr<Codec> fresh;
    if (!codec->needs_training()) fresh = build(o, derive_seed(o.seed, 0x10000 + trial));
    const Codec& c = fresh ? *fresh : *codec;
    correlated_pair(rng, d, keys.data(), y.data());
    for (size_t i = d; i < keys.size(); i += d) {
      double s = 0;
      for (int j = 0; j < d; ++j) keys[i + j] = static_cast<float>(rng.normal()), s += keys[i + j] * keys[i + j];
      for (int j = 0; j < d; ++j) keys[i + j] = static_cast<float>(keys[i + j] / std::sqrt(s));
    }
    c.encode(keys.data(), T, block.data());
    c.prepare(y.data(), 1)->scores(block.data(), 1, scores.data());
    const double e = static_cast<double>(scores[0]) - 0.5;
    sum += e;
    sum_sq += e * e;
    if (o.progress && (trial % 256 == 255 || trial + 1 == o.n)) o.progress(o.n + trial + 1, total);
  }
  const double n = static_cast<double>(o.n);
  r.ip_bias = sum / n;
  r.ip_bias_stderr = std::sqrt(std::max(0.0, sum_sq / n - r.ip_bias * r.ip_bias) / (n - 1));
  r.ip_mse_d = d * sum_sq / n;
  return r;
}

}  // namespace kvq

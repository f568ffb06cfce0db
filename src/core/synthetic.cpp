#include "kvq/detail/synthetic.hpp"

#include <algorithm>
#include <cmath>

#include "kvq/detail/random.hpp"
#include "kvq/error.hpp"

namespace kvq {

std::vector<float> gaussian_vectors(size_t n, int d, uint64_t seed) {
  KVQ_CHECK(d > 0, "gaussian_vectors: dimension must be positive, got ", d);
  Rng rng(seed);
  std::vector<float> x(n * static_cast<size_t>(d));
  for (auto& v : x) v = static_cast<float>(rng.normal());
  return x;
}

std::vector<float> unit_vectors(size_t n, int d, uint64_t seed) {
  std::vector<float> x = gaussian_vectors(n, d, seed);
  for (size_t i = 0; i < n; ++i) {
    float* row = x.data() + i * static_cast<size_t>(d);
    double s = 0;
    for (int j = 0; j < d; ++j) s += static_cast<double>(row[j]) * row[j];
    const double inv = 1.0 / std::sqrt(s);
    for (int j = 0; j < d; ++j) row[j] = static_cast<float>(row[j] * inv);
  }
  return x;
}

ChannelProfile key_like_profile(int d, uint64_t seed, int n_outliers) {
  KVQ_CHECK(d > 0, "key_like_profile: dimension must be positive, got ", d);
  KVQ_CHECK(n_outliers >= 0 && n_outliers <= d, "key_like_profile: outlier count ", n_outliers, " not in [0, ", d,
            "]");
  Rng rng(seed);
  ChannelProfile p;
  p.mean.resize(d);
  p.stddev.resize(d);
  for (int c = 0; c < d; ++c) {
    p.stddev[c] = static_cast<float>(std::exp(0.3 * rng.normal()));
    p.mean[c] = static_cast<float>(0.5 * rng.normal()) * p.stddev[c];
  }
  std::vector<int> order(d);
  for (int c = 0; c < d; ++c) order[c] = c;
  for (int c = d - 1; c > 0; --c) std::swap(order[c], order[rng.next_u64() % static_cast<uint64_t>(c + 1)]);
  p.outliers.assign(order.begin(), order.begin() + n_outliers);
  std::sort(p.outliers.begin(), p.outliers.end());
  for (int c : p.outliers) {
    const float factor = static_cast<float>(10.0 + 40.0 * rng.uniform());
    p.stddev[c] *= factor;
    p.mean[c] *= factor;
  }
  return p;
}

std::vector<float> sample_profile(const ChannelProfile& profile, size_t n, uint64_t seed) {
  const size_t d = profile.mean.size();
  KVQ_CHECK(d > 0 && profile.stddev.size() == d, "sample_profile: malformed profile");
  Rng rng(seed);
  std::vector<float> x(n * d);
  for (size_t i = 0; i < n; ++i)
    for (size_t c = 0; c < d; ++c) x[i * d + c] = profile.mean[c] + profile.stddev[c] * static_cast<float>(rng.normal());
  return x;
}

}  // namespace kvq

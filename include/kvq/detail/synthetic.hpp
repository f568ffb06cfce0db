// Synthetic vectors for tests, benchmarks and `kvq distortion`: Gaussian, uniform on the sphere, and key-like
// vectors whose channels have non-zero means and a few outlier channels 10-50x larger than the rest, as the keys
// of real attention layers have (before rotation).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace kvq {

/// n x d standard normal entries.
std::vector<float> gaussian_vectors(size_t n, int d, uint64_t seed);
/// n x d rows, each uniform on the unit sphere of R^d.
std::vector<float> unit_vectors(size_t n, int d, uint64_t seed);

/// Per-channel statistics of a "layer": the same profile is shared by training and test vectors.
struct ChannelProfile {
  std::vector<float> mean;    ///< size d
  std::vector<float> stddev;  ///< size d
  std::vector<int> outliers;  ///< channel indices whose scale is 10-50x the rest
};

/// A key-like channel profile: means ~ N(0, 0.5^2) (times the channel scale), scales log-normal around 1, and
/// `n_outliers` channels scaled by a factor drawn uniformly from [10, 50].
ChannelProfile key_like_profile(int d, uint64_t seed, int n_outliers = 4);
/// n x d vectors drawn from a profile: x[c] = mean[c] + stddev[c] * N(0, 1).
std::vector<float> sample_profile(const ChannelProfile& profile, size_t n, uint64_t seed);

}  // namespace kvq

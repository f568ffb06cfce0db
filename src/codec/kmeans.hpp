// k-means for the small-dimensional points of vector quantizers (product-quantization sub-vectors of 4 or 8
// floats, up to 4096 centroids): k-means++ seeding on a subsample, then Lloyd iterations whose assignment step is
// the exact nearest-centroid search of nearest_centroid.hpp. Deterministic given the seed (also across thread
// counts: threads only split the assignment of independent points).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace kvq {

struct KMeansOptions {
  int k = 256;               ///< centroids K
  int max_iterations = 25;   ///< Lloyd updates at most
  double tolerance = 1e-4;   ///< stop once an update lowers the objective by less than this fraction
  size_t max_points = 0;     ///< Lloyd runs on a uniform subsample of at most this many points (0: all of them)
  size_t seed_points = 0;    ///< k-means++ draws from a subsample of this many points (0: max(8 K, 8192))
  uint64_t seed = 0;         ///< seeds the subsamples and the k-means++ draws
  int threads = 0;           ///< threads for the assignment step (0: the hardware's count)
};

struct KMeansResult {
  std::vector<float> centroids;   ///< K x dim, row-major
  /// objective[i]: mean squared distance of the points to their nearest centroid after i Lloyd updates
  /// (objective[0]: the k-means++ seeds; the last entry: the returned centroids). Non-increasing up to rounding.
  std::vector<double> objective;
};

/// Clusters n points (x: n x dim floats, 1 <= dim <= 16) into options.k centroids. An empty cluster is re-seeded
/// with the point farthest from its centroid. Throws kvq::Error when n < K (or the points are fewer than K after
/// the max_points subsample).
KMeansResult kmeans(const float* x, size_t n, int dim, const KMeansOptions& options);

}  // namespace kvq

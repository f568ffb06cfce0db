// Exact nearest-centroid search for vector quantizers (the encoder of product quantization and the assignment step
// of k-means): for each point, the index of the centroid at the smallest squared Euclidean distance.
//
// Each point keeps a running minimum over all K centroids in registers, so nothing of size N x K (let alone
// N x K x s) is ever materialized: that intermediate is what made a chunked tensor implementation of this search
// run out of memory at head_dim 256.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace kvq {

/// K centroids of a small dimension s, laid out for the search. Immutable once built: share it between threads.
class CentroidTable {
 public:
  static constexpr int kMaxDim = 16;

  /// centroids: k x dim floats, row-major; k >= 1, 1 <= dim <= kMaxDim.
  CentroidTable(const float* centroids, int k, int dim);

  int size() const { return k_; }
  int dim() const { return dim_; }

  /// idx[i] = argmin_j ||x_i - c_j||^2 for n points (x: n x dim floats). Distances are compared in the form
  /// ||c_j||^2 - 2 <x_i, c_j>, evaluated in float; ties go to the lowest index.
  void nearest(const float* x, size_t n, uint32_t* idx) const;

 private:
  int k_, dim_, k_padded_;
  std::vector<float> coords_;  // dim x k_padded_, dimension-major: coords_[i * k_padded_ + j] = c_j[i]
  std::vector<float> norms_;   // k_padded_: ||c_j||^2, +inf for the padding centroids
};

}  // namespace kvq

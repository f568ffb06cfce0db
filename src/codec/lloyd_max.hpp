// Lloyd–Max scalar quantizers for the coordinates of a random unit vector (TurboQuant, arXiv 2504.19874).
//
// After a random rotation, each coordinate u_j of a unit vector in R^d has the density
//     f(x) = (1 - x^2)^((d-3)/2) / B(1/2, (d-1)/2)   on [-1, 1]
// (variance 1/d, close to N(0, 1/d) for large d). The MSE-optimal b-bit scalar quantizer of f is found with the
// Lloyd–Max conditions (centroid = conditional mean of its cell, boundary = midpoint of neighbouring centroids),
// solved numerically in double. Codebooks are solved on first use and cached for the life of the program.
#pragma once

#include <vector>

namespace kvq {

/// A symmetric scalar quantizer and its distortion under the density it was fitted to.
struct ScalarCodebook {
  int bits = 0;
  std::vector<double> centroids;   ///< 2^bits values, ascending, centroids[i] = -centroids[2^bits - 1 - i]
  std::vector<double> boundaries;  ///< 2^bits - 1 decision thresholds, boundaries[i] between centroids i and i+1
  double mse = 0;                  ///< E[(x - q(x))^2] per coordinate (multiply by d for a unit vector's MSE)
};

/// The Lloyd–Max codebook of one coordinate of a uniform random unit vector in R^d, 3 <= d <= 65536,
/// 1 <= bits <= 8. Thread-safe; the reference stays valid for the life of the program.
const ScalarCodebook& sphere_lloyd_max(int d, int bits);

/// The Lloyd–Max codebook of the residual r = u - c(u) that sphere_lloyd_max(d, stage1_bits) leaves on a sphere
/// coordinate u: its density is f restricted to each stage-1 cell and shifted by that cell's centroid, summed over
/// the cells. Used as the second stage of two-stage residual quantization. Same ranges and caching as above.
const ScalarCodebook& sphere_residual_lloyd_max(int d, int stage1_bits, int bits);

}  // namespace kvq

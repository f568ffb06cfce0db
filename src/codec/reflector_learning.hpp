// Householder reflectors learned for a group-absmax quantizer (int8/int4's `learn=K`; the SRFT paper's learned
// rotation over a fixed random one). Given vectors y already under the codec's base rotation, it finds
// R = H_K ... H_1 that lowers the sum over vectors and groups of G channels of the squared group maximum: that
// maximum sets the group's scale s, and the rounding error of the group is about G s^2 / 12. The maximum is taken
// smoothly (an L_p norm of the group) so that every channel gets a gradient.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace kvq::detail {

struct ReflectorLearning {
  int reflectors = 16;  ///< K, even: they start as equal pairs (H H = I), so learning starts from the base
  int group = 32;       ///< G, the quantizer's group of channels
  int steps = 200;      ///< Adam steps over minibatches
  int batch = 256;      ///< vectors per step
  double rate = 0.01;   ///< Adam's step on the unit reflector vectors
  int p = 8;            ///< the smooth maximum's norm
  uint64_t seed = 0;    ///< the starting reflectors and the minibatches
};

/// The smooth objective: sum over the n vectors (n x d) and their groups of (L_p norm of the group)^2.
double group_max_objective(const float* y, size_t n, int d, int group, int p);

/// K unit reflectors (each d floats), applied H_1 first. Where learning does not lower the objective over the
/// vectors, the starting pairs come back (the identity). Deterministic in the seed.
std::vector<std::vector<float>> learn_reflectors(const float* y, size_t n, int d, const ReflectorLearning& how);

}  // namespace kvq::detail

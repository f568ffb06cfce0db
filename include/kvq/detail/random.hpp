// A small, platform-independent random generator: the same seed gives the same rotation, sketch and test data on
// every compiler and machine (std::normal_distribution does not promise that), which saved caches rely on.
#pragma once

#include <cstdint>

namespace kvq {

/// xoshiro256** seeded through splitmix64.
class Rng {
 public:
  explicit Rng(uint64_t seed);
  uint64_t next_u64();
  /// Uniform in [0, 1) with 53 random bits.
  double uniform();
  /// Standard normal (Box–Muller, both values used).
  double normal();
  /// +1 or -1 with equal probability.
  float sign() { return (next_u64() >> 63) ? -1.0f : 1.0f; }

 private:
  uint64_t s_[4];
  double spare_ = 0;
  bool has_spare_ = false;
};

/// An independent seed for sub-stream `stream` of `seed` (e.g. the rotation vs. the sketch of one codec).
uint64_t derive_seed(uint64_t seed, uint64_t stream);

}  // namespace kvq

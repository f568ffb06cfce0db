// Picks the next token from logits: the most likely one (temperature 0) or a draw from softmax(logits / T).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "kvq/detail/random.hpp"

namespace kvq {

class Sampler {
 public:
  /// temperature >= 0; the seed makes draws repeatable.
  Sampler(float temperature, uint64_t seed);
  int sample(std::span<const float> logits);

 private:
  float temperature_;
  Rng rng_;
  std::vector<double> probs_;
};

/// The index of the largest logit (the first on ties).
int argmax(std::span<const float> logits);

}  // namespace kvq

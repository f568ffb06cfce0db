#include "kvq/model.hpp"

#include <algorithm>
#include <cmath>

#include "kvq/error.hpp"

namespace kvq {

int argmax(std::span<const float> logits) {
  KVQ_CHECK(!logits.empty(), "argmax of no logits");
  return static_cast<int>(std::max_element(logits.begin(), logits.end()) - logits.begin());
}

Sampler::Sampler(float temperature, uint64_t seed) : temperature_(temperature), rng_(seed) {
  KVQ_CHECK(temperature >= 0 && std::isfinite(temperature), "temperature ", temperature, " must be >= 0");
}

int Sampler::sample(std::span<const float> logits) {
  if (temperature_ == 0) return argmax(logits);
  const float max_logit = logits[argmax(logits)];
  probs_.resize(logits.size());
  double sum = 0;
  for (size_t i = 0; i < logits.size(); ++i) sum += probs_[i] = std::exp((logits[i] - max_logit) / temperature_);
  double u = rng_.uniform() * sum;
  int last = 0;  // the last token with non-zero probability, should rounding leave u >= 0 at the end
  for (size_t i = 0; i < probs_.size(); ++i) {
    if (probs_[i] == 0) continue;
    last = static_cast<int>(i);
    u -= probs_[i];
    if (u < 0) break;
  }
  return last;
}

}  // namespace kvq

// Logits of a model checked against an independent reference: per position the argmax, the range and a few probe
// tokens (values computed once by a NumPy forward pass, tests/reference/*.py), or a whole double-precision vector
// (llama_reference.hpp).
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <span>
#include <vector>

#include "kvq/model.hpp"

namespace kvq::test {

struct ReferencePosition {
  int argmax;
  double max, min;
  std::vector<double> probe;  ///< the logits of the probe ids
};

/// Runs ids through runner.forward one token at a time: the same argmax, and max, min and probe logits within
/// `tolerance` of the reference's logit range.
inline void expect_reference_logits(LlamaRunner& runner, const std::vector<int>& ids,
                                    const std::vector<int>& probe_ids, const std::vector<ReferencePosition>& ref,
                                    double tolerance = 1e-3) {
  for (size_t t = 0; t < ids.size(); ++t) {
    const auto logits = runner.forward(ids[t], static_cast<int>(t));
    const ReferencePosition& r = ref[t];
    const double range = tolerance * (r.max - r.min);
    EXPECT_EQ(std::max_element(logits.begin(), logits.end()) - logits.begin(), r.argmax) << "position " << t;
    EXPECT_NEAR(*std::max_element(logits.begin(), logits.end()), r.max, range) << "position " << t;
    EXPECT_NEAR(*std::min_element(logits.begin(), logits.end()), r.min, range) << "position " << t;
    for (size_t i = 0; i < probe_ids.size(); ++i)
      EXPECT_NEAR(logits[probe_ids[i]], r.probe[i], range) << "position " << t << " token " << probe_ids[i];
  }
}

/// Largest |ours - reference| over a logit vector, relative to the reference's range.
inline double relative_error(std::span<const float> ours, const std::vector<double>& ref) {
  double err = 0, lo = ref[0], hi = ref[0];
  for (size_t i = 0; i < ref.size(); ++i) {
    err = std::max(err, std::abs(ours[i] - ref[i]));
    lo = std::min(lo, ref[i]), hi = std::max(hi, ref[i]);
  }
  return err / (hi - lo);
}

}  // namespace kvq::test

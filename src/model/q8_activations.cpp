#include "model/q8_activations.hpp"

#include <cmath>

namespace kvq::detail {

void Q8Rows::quantize(const float* x, int n, int64_t cols) {
  blocks_per_row_ = static_cast<size_t>(cols / kQ8Block);
  const size_t blocks = static_cast<size_t>(n) * blocks_per_row_;
  if (scales_.size() < blocks) {
    codes_.resize(blocks * kQ8Block);
    scales_.resize(blocks);
    sums_.resize(blocks);
  }
  for (size_t b = 0; b < blocks; ++b) {
    const float* v = x + b * kQ8Block;
    int8_t* c = codes_.data() + b * kQ8Block;
    float amax = 0;
    for (int j = 0; j < kQ8Block; ++j) amax = std::fmax(amax, std::fabs(v[j]));
    const float d = amax / 127.0f, inv = amax > 0 ? 127.0f / amax : 0.0f;
    int sum = 0;
    for (int j = 0; j < kQ8Block; ++j) {
      c[j] = static_cast<int8_t>(std::lrint(v[j] * inv));
      sum += c[j];
    }
    scales_[b] = d;
    sums_[b] = d * static_cast<float>(sum);
  }
}

}  // namespace kvq::detail

#include "model/q8_activations.hpp"

#include <algorithm>
#include <cmath>
#include <limits>

#include "kvq/attention.hpp"  // ThreadPool

namespace kvq::detail {
namespace {

// Rounds y (|y| <= 127) to the nearest integer, ties to even, as lrint does in the default rounding mode: adding
// 1.5 x 2^23 leaves no fraction bits in the float's mantissa. A plain expression, so that the loop vectorizes.
float round_to_int(float y) {
  constexpr float kShift = 12582912.0f;  // 1.5 x 2^23
  return (y + kShift) - kShift;
}

void quantize_block(const float* v, int8_t* c, float& scale, float& sum) {
  float amax = 0;
  bool finite = true;
  for (int j = 0; j < kQ8Block; ++j) {
    amax = std::max(amax, std::fabs(v[j]));
    finite = finite && std::isfinite(v[j]);
  }
  if (!finite) {  // NaN or Inf in: a NaN product out, which the forward pass's stage check names (a NaN code
    std::fill(c, c + kQ8Block, int8_t{0});  // would be an undefined conversion)
    scale = sum = std::numeric_limits<float>::quiet_NaN();
    return;
  }
  // A block too small for 127 / amax to be finite (amax below 127 / FLT_MAX, about 4e-37) takes zero codes.
  const float inv = amax > 127.0f / std::numeric_limits<float>::max() ? 127.0f / amax : 0.0f;
  const float d = inv > 0 ? amax / 127.0f : 0.0f;
  float codes[kQ8Block];
  float total = 0;  // integers below 2^12: exact
  for (int j = 0; j < kQ8Block; ++j) {
    codes[j] = round_to_int(v[j] * inv);
    total += codes[j];
  }
  for (int j = 0; j < kQ8Block; ++j) c[j] = static_cast<int8_t>(codes[j]);
  scale = d;
  sum = d * total;
}

}  // namespace

void Q8Rows::quantize(const float* x, int n, int64_t cols, ThreadPool& pool) {
  blocks_per_row_ = static_cast<size_t>(cols / kQ8Block);
  const size_t blocks = static_cast<size_t>(n) * blocks_per_row_;
  if (scales_.size() < blocks) {
    codes_.resize(blocks * kQ8Block);
    scales_.resize(blocks);
    sums_.resize(blocks);
  }
  const auto run = [&](size_t begin, size_t end) {
    for (size_t b = begin; b < end; ++b)
      quantize_block(x + b * kQ8Block, codes_.data() + b * kQ8Block, scales_[b], sums_[b]);
  };
  if (n == 1) {  // a few dozen blocks: not worth waking the workers
    run(0, blocks);
    return;
  }
  const size_t parts = static_cast<size_t>(pool.size());
  pool.parallel_for(parts, [&](size_t p) { run(blocks * p / parts, blocks * (p + 1) / parts); });
}

}  // namespace kvq::detail

// Activations quantized to 8 bits per block of 32, as llama.cpp quantizes the input of its integer matrix-vector
// products (its Q8_1 blocks): block b of a row has a float scale d_b = max_j |x_j| / 127 and codes
// c_j = round(x_j / d_b) in [-127, 127], so x_j ~ d_b c_j with |x_j - d_b c_j| <= d_b / 2; and the block's sum
// s_b = d_b sum_j c_j, which the formats with a per-block offset (Q4_0's -8, Q4_1's min, Q4_K's mins) multiply.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace kvq {
class ThreadPool;
}  // namespace kvq

namespace kvq::detail {

/// Elements per activation block.
constexpr int kQ8Block = 32;

/// One quantized row: blocks of kQ8Block codes, their scales and their sums.
struct Q8Row {
  const int8_t* codes;  ///< [blocks][kQ8Block]
  const float* scales;  ///< [blocks] d_b
  const float* sums;    ///< [blocks] d_b sum_j c_j
};

/// Rows of activations in quantized form. The storage grows to the largest call and is reused, so the forward
/// pass allocates nothing per token.
class Q8Rows {
 public:
  /// Quantizes the n rows of x [n][cols] (cols a multiple of kQ8Block), several rows split over `pool`.
  void quantize(const float* x, int n, int64_t cols, ThreadPool& pool);
  /// Row i < n of the last quantize.
  Q8Row row(int i) const {
    const size_t b = static_cast<size_t>(i) * blocks_per_row_;
    return {codes_.data() + b * kQ8Block, scales_.data() + b, sums_.data() + b};
  }

 private:
  std::vector<int8_t> codes_;
  std::vector<float> scales_, sums_;
  size_t blocks_per_row_ = 0;
};

}  // namespace kvq::detail

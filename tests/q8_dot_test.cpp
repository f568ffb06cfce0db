// The integer weight kernels (src/model/q8_dot.hpp) of every instruction set this CPU has, per block format, on rows
// built field by field from the formats' definitions (ggml_block_encoder.hpp):
// - against sum_j W_j x^_j in double, W the row's values and x^ the quantized activations d_b c_j: the block sums
//   are exact integers, so only float rounding differs. Each block's parts (scale x integer sum, offset x sum) take
//   at most 4 roundings (scale products, int to float above 2^24, the FMA), and the row sums add at most 2B + 8
//   terms (B blocks, two sums, 8 lanes), so |error| <= (2B + 12) 2^-24 sum_j m_j |x^_j| to first order, m_j the
//   row's per-element part magnitude (EncodedRow::magnitude);
// - against sum_j W_j x_j with the unquantized activations: rounding to the nearest code moves x_j by at most
//   d_b / 2 (plus the rounding of x_j / d_b, below 1e-4 d_b), so the products move by at most
//   sum_b (d_b / 2 + 1e-4 d_b) sum_{j in b} |W_j|, on top of the bound above.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "attention/isa.hpp"
#include "kvq/attention.hpp"  // ThreadPool
#include "ggml_block_encoder.hpp"
#include "model/q8_activations.hpp"
#include "model/q8_dot.hpp"
#include "test_seed.hpp"

namespace kvq {
namespace {

using detail::Isa;

class Q8Dot : public testing::TestWithParam<GgmlType> {};

TEST_P(Q8Dot, EveryIsaMatchesTheDequantizedRowWithinRoundingBounds) {
  KVQ_FRESH_SEED();
  Rng rng(seed);
  const GgmlType type = GetParam();
  ThreadPool pool(1);
  const int per_block = ggml_traits(type).block_size / detail::kQ8Block;
  for (int blocks : {1, 2, 7}) {  // superblocks of the k-quants, blocks of 32 of the others
    const test::EncodedRow row = test::encode_row(rng, type, blocks);
    const int64_t n = static_cast<int64_t>(row.expected.size());
    std::vector<float> x(static_cast<size_t>(n));
    for (auto& v : x) v = static_cast<float>(rng.normal() * (rng.uniform() < 0.05 ? 20.0 : 1.0));  // some outliers
    for (int j = 0; j < 32 && blocks > 1; ++j) x[static_cast<size_t>(32 + j)] = 0;  // an all-zero block
    detail::Q8Rows q8, zero;
    q8.quantize(x.data(), 1, n, pool);
    const detail::Q8Row xq = q8.row(0);
    const std::vector<float> zeros(x.size());
    zero.quantize(zeros.data(), 1, n, pool);

    double exact = 0, mag = 0, unquantized = 0, rounding = 0;
    for (int64_t j = 0; j < n; ++j) {
      const size_t b = static_cast<size_t>(j / detail::kQ8Block);
      const double xh = static_cast<double>(xq.scales[b]) * xq.codes[j];
      ASSERT_LE(std::abs(xh - x[j]), xq.scales[b] * (0.5 + 1e-4)) << "element " << j;
      exact += row.expected[j] * xh;
      mag += row.magnitude[j] * std::abs(xh);
      unquantized += row.expected[j] * x[j];
      rounding += xq.scales[b] * (0.5 + 1e-4) * std::abs(row.expected[j]);
    }
    const size_t q8_blocks = static_cast<size_t>(blocks) * static_cast<size_t>(per_block);
    const double bound = (2.0 * static_cast<double>(q8_blocks) + 12) * std::ldexp(1.0, -24) * mag;
    for (Isa isa : detail::kAllIsas) {
      if (!detail::cpu_supports(isa)) continue;
      const detail::Q8Kernels dot = detail::q8_kernels(type, isa);
      ASSERT_TRUE(dot) << detail::isa_name(isa);
      // The kernel of one row, and the one of kQ8Rows rows with this row in every place (the others: zeros).
      float one = 0;
      dot.one(row.bytes.data() + 1, &xq, q8_blocks, &one);  // byte 0 pads: rows may be unaligned
      EXPECT_NEAR(one, exact, bound) << detail::isa_name(isa) << ", " << blocks << " blocks";
      EXPECT_NEAR(one, unquantized, bound + rounding) << detail::isa_name(isa) << ", " << blocks << " blocks";
      for (int place = 0; place < detail::kQ8Rows; ++place) {
        detail::Q8Row xs[detail::kQ8Rows];
        for (int k = 0; k < detail::kQ8Rows; ++k) xs[k] = k == place ? xq : zero.row(0);
        float out[detail::kQ8Rows];
        dot.rows(row.bytes.data() + 1, xs, q8_blocks, out);
        for (int k = 0; k < detail::kQ8Rows; ++k)
          EXPECT_NEAR(out[k], k == place ? exact : 0.0, bound) << detail::isa_name(isa) << ", row " << k;
      }
    }
  }
}

TEST_P(Q8Dot, WeightRowsKernelEqualsTheOneRowKernel) {
  // kQ8WeightRows rows at once give each row's result of `one`: the same sums in the same order, up to the
  // compiler's choice of fused multiply-adds, so within twice the rounding bound of the test above.
  KVQ_FRESH_SEED();
  Rng rng(seed);
  const GgmlType type = GetParam();
  ThreadPool pool(1);
  const int per_block = ggml_traits(type).block_size / detail::kQ8Block;
  for (int blocks : {1, 3, 18}) {
    std::vector<test::EncodedRow> rows;
    for (int k = 0; k < detail::kQ8WeightRows; ++k) rows.push_back(test::encode_row(rng, type, blocks));
    const size_t row_bytes = rows[0].bytes.size() - 1;  // byte 0 of each pads
    std::vector<uint8_t> matrix(1 + detail::kQ8WeightRows * row_bytes);  // unaligned rows, one after the other
    for (int k = 0; k < detail::kQ8WeightRows; ++k)
      std::copy(rows[k].bytes.begin() + 1, rows[k].bytes.end(), matrix.begin() + 1 + k * row_bytes);
    std::vector<float> x(rows[0].expected.size());
    for (auto& v : x) v = static_cast<float>(rng.normal());
    detail::Q8Rows q8;
    q8.quantize(x.data(), 1, static_cast<int64_t>(x.size()), pool);
    const size_t q8_blocks = static_cast<size_t>(blocks) * static_cast<size_t>(per_block);
    for (Isa isa : detail::kAllIsas) {
      const detail::Q8Kernels dot = detail::q8_kernels(type, isa);
      if (!detail::cpu_supports(isa) || !dot.weight_rows) continue;
      float out[detail::kQ8WeightRows];
      dot.weight_rows(matrix.data() + 1, row_bytes, q8.row(0), q8_blocks, out);
      const detail::Q8Row xq = q8.row(0);
      for (int k = 0; k < detail::kQ8WeightRows; ++k) {
        float one = 0;
        dot.one(matrix.data() + 1 + k * row_bytes, &xq, q8_blocks, &one);
        double mag = 0;
        for (size_t j = 0; j < x.size(); ++j)
          mag += rows[k].magnitude[j] * std::abs(static_cast<double>(xq.scales[j / detail::kQ8Block]) * xq.codes[j]);
        const double bound = (2.0 * static_cast<double>(q8_blocks) + 12) * std::ldexp(1.0, -24) * mag;
        EXPECT_NEAR(out[k], one, 2 * bound) << detail::isa_name(isa) << ", row " << k << ", " << blocks << " blocks";
      }
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Formats, Q8Dot,
                         testing::Values(GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q8_0, GgmlType::Q4_K,
                                         GgmlType::Q6_K),
                         [](const testing::TestParamInfo<GgmlType>& p) {
                           return std::string(ggml_traits(p.param).name);
                         });

TEST(Q8Dot, FloatFormatsHaveNoIntegerKernel) {
  for (GgmlType type : {GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q5_0, GgmlType::Q5_K})
    EXPECT_FALSE(detail::q8_kernels(type, detail::best_isa())) << ggml_traits(type).name;
}

TEST(Q8Activations, CodesSumsAndZeroBlocks) {
  KVQ_FRESH_SEED();
  Rng rng(seed);
  std::vector<float> x(3 * 64);
  for (auto& v : x) v = static_cast<float>(rng.normal());
  for (int j = 0; j < 32; ++j) x[64 + j] = 0;  // row 1, block 0
  detail::Q8Rows q8;
  ThreadPool pool(2);  // rows split over two workers
  q8.quantize(x.data(), 3, 64, pool);
  for (int r = 0; r < 3; ++r) {
    const detail::Q8Row row = q8.row(r);
    for (int b = 0; b < 2; ++b) {
      int sum = 0, largest = 0;
      for (int j = 0; j < 32; ++j) {
        const int c = row.codes[32 * b + j];
        ASSERT_LE(std::abs(c), 127);
        sum += c;
        largest = std::max(largest, std::abs(c));
      }
      EXPECT_FLOAT_EQ(row.sums[b], row.scales[b] * static_cast<float>(sum));
      if (r == 1 && b == 0) {
        EXPECT_EQ(row.scales[b], 0.0f);
        EXPECT_EQ(largest, 0);
      } else {
        EXPECT_EQ(largest, 127) << "the largest |x| of a block takes the largest code";
      }
    }
  }
}

TEST(Q8Activations, BlocksTooSmallToScaleTakeZeroCodes) {
  // 127 / amax overflows below amax = 127 / FLT_MAX: the codes were an undefined conversion of inf (found by the
  // checkpoint fuzzer). Such a block, and one of zeros, quantize to zero codes and scale.
  std::vector<float> x(64, 0.0f);
  for (int j = 0; j < 32; ++j) x[j] = (j % 2 ? -1.0f : 1.0f) * std::numeric_limits<float>::denorm_min() * (j + 1);
  detail::Q8Rows q8;
  ThreadPool pool(1);
  q8.quantize(x.data(), 1, 64, pool);
  const detail::Q8Row row = q8.row(0);
  for (int b = 0; b < 2; ++b) {
    EXPECT_EQ(row.scales[b], 0.0f);
    EXPECT_EQ(row.sums[b], 0.0f);
    for (int j = 0; j < 32; ++j) EXPECT_EQ(row.codes[32 * b + j], 0);
  }
}

}  // namespace
}  // namespace kvq

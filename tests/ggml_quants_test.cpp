// Each ggml format against its published definition: the test picks random quantized values q[i] and scales,
// packs them into the block fields element by element (the encode side, written here from the format
// description), and checks that dequantize_row and dot_row give the reconstruction formula computed in double.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <vector>

#include "ggml_block_encoder.hpp"
#include "kvq/detail/ggml_quants.hpp"
#include "kvq/detail/random.hpp"
#include "kvq/error.hpp"
#include "test_seed.hpp"

namespace kvq {

void PrintTo(GgmlType type, std::ostream* os) { *os << ggml_traits(type).name; }

namespace {

using test::EncodedRow;
using test::encode_row;

class QuantsFormat : public testing::TestWithParam<GgmlType> {};

TEST_P(QuantsFormat, DequantizeAndDotMatchThePublishedDefinition) {
  KVQ_FRESH_SEED();
  Rng rng(seed);
  const GgmlType type = GetParam();
  const GgmlTypeTraits& traits = ggml_traits(type);
  ASSERT_TRUE(traits.computable);
  const int blocks = traits.block_size == 1 ? 601 : 5;  // scalar rows longer than the dot's decode run
  const EncodedRow row = encode_row(rng, type, blocks);
  const int64_t n = static_cast<int64_t>(row.expected.size());
  ASSERT_EQ(n, static_cast<int64_t>(blocks) * traits.block_size);
  ASSERT_EQ(row.bytes.size() - 1, ggml_row_bytes(type, n));
  ASSERT_EQ(traits.block_bytes * blocks, ggml_row_bytes(type, n));

  std::vector<float> out(static_cast<size_t>(n));
  dequantize_row(type, row.bytes.data() + 1, out.data(), n);
  double scale = 0;
  for (double e : row.expected) scale = std::max(scale, std::abs(e));
  for (int64_t i = 0; i < n; ++i)
    ASSERT_NEAR(out[i], row.expected[i], 1e-6 * scale) << traits.name << " element " << i;

  std::vector<float> x(static_cast<size_t>(n));
  double ref = 0, mag = 0;
  for (int64_t i = 0; i < n; ++i) {
    x[i] = static_cast<float>(rng.normal());
    ref += row.expected[i] * x[i];
    mag += std::abs(row.expected[i] * x[i]);
  }
  EXPECT_NEAR(dot_row(type, row.bytes.data() + 1, x.data(), n), ref, 1e-5 * mag) << traits.name;
}

INSTANTIATE_TEST_SUITE_P(Quants, QuantsFormat,
                         testing::Values(GgmlType::F32, GgmlType::F16, GgmlType::BF16, GgmlType::Q8_0,
                                         GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q5_0, GgmlType::Q5_1,
                                         GgmlType::Q4_K, GgmlType::Q5_K, GgmlType::Q6_K),
                         [](const testing::TestParamInfo<GgmlType>& p) {
                           return std::string(ggml_traits(p.param).name);
                         });

TEST(QuantsErrors, RejectUnsupportedTypesAndPartialBlocks) {
  std::vector<uint8_t> row(1024);
  float out[256], x[256] = {};
  EXPECT_THROW(dequantize_row(GgmlType::Q4_1, row.data(), out, 48), Error);  // 1.5 blocks
  EXPECT_THROW(dot_row(GgmlType::Q2_K, row.data(), x, 256), Error);          // known, not computable
  EXPECT_THROW(ggml_row_bytes(static_cast<GgmlType>(99), 32), Error);        // unknown id
  EXPECT_EQ(ggml_type_traits(static_cast<GgmlType>(99)), nullptr);
  EXPECT_EQ(ggml_row_bytes(GgmlType::Q6_K, 512), 420u);
}

}  // namespace
}  // namespace kvq

// The chunk products (src/model/chunk_matmul.hpp) of every instruction set this CPU has, against the product in
// double: each output is a chain of `cols` fp32 multiply-adds, each rounding once (relative 2^-24), so |error| <=
// cols 2^-24 sum_c |w_c x_c| to first order (the bound below doubles it). The AVX2 and AVX-512 kernels run the same
// chain of FMAs for each output, so they agree to the bit. Shapes: partial tiles of rows, partial blocks of positions
// (6 a block on AVX2, 12 on AVX-512) and columns past the transposes' blocks (8 on AVX2, 16 on AVX-512). Quantized
// weights (Q4_0, Q4_1 and Q8_0 decoded by vectors on AVX-512, the others by dequantize_row) against their values
// in double, and the AVX2 and AVX-512 results again equal to the bit.
#include <gtest/gtest.h>

#include <cmath>
#include <cstddef>
#include <vector>

#include "attention/isa.hpp"
#include "ggml_block_encoder.hpp"
#include "kvq/model.hpp"
#include "model/chunk_matmul.hpp"
#include "test_seed.hpp"

namespace kvq {
namespace {

using detail::Isa;

// The chunk product of w with the n positions x on every instruction set this CPU has: each output within
// (2 cols + extra) 2^-24 of its sum of |products| of the product in double of `values` (w's rows as they decode)
// with x, and the AVX2 outputs equal to the AVX-512 ones.
void expect_every_isa_matches(const WeightMatrix& w, const std::vector<double>& values, const std::vector<float>& x,
                              int n, double extra) {
  const int rows = static_cast<int>(w.rows), cols = static_cast<int>(w.cols);
  std::vector<float> avx2, avx512;
  for (Isa isa : detail::kAllIsas) {
    if (!detail::cpu_supports(isa)) continue;
    SCOPED_TRACE(detail::isa_name(isa));
    std::vector<float> y(static_cast<size_t>(n) * rows, -1.0f), scratch;
    detail::multiply_tiles(w, 0, detail::tile_count(w), x.data(), n, y.data(), static_cast<size_t>(rows), scratch,
                           isa);
    for (int i = 0; i < n; ++i) {
      for (int r = 0; r < rows; ++r) {
        double exact = 0, magnitude = 0;
        for (int c = 0; c < cols; ++c) {
          const double p = values[static_cast<size_t>(r) * cols + c] * x[static_cast<size_t>(i) * cols + c];
          exact += p;
          magnitude += std::fabs(p);
        }
        ASSERT_NEAR(y[static_cast<size_t>(i) * rows + r], exact, (2.0 * cols + extra) * 0x1p-24 * magnitude)
            << "position " << i << " row " << r;
      }
    }
    if (isa == Isa::avx2) avx2 = y;
    if (isa == Isa::avx512) avx512 = y;
  }
  if (!avx2.empty() && !avx512.empty()) {
    EXPECT_EQ(avx2, avx512) << "the same decoded weights and FMA chains";
  }
}

TEST(ChunkMatmul, EveryIsaMatchesTheProductInDouble) {
  KVQ_FRESH_SEED();
  Rng rng(seed);
  for (const auto& [rows, cols] : {std::pair<int, int>{16, 64}, {37, 96}, {5, 576}, {20, 40}, {3, 37}}) {
    std::vector<float> weights(static_cast<size_t>(rows) * cols);
    for (float& w : weights) w = static_cast<float>(rng.normal() * (rng.uniform() < 0.02 ? 30.0 : 1.0));
    WeightMatrix w;
    w.type = GgmlType::F32;
    w.data = reinterpret_cast<const std::byte*>(weights.data());
    w.rows = rows;
    w.cols = cols;
    w.row_bytes = static_cast<size_t>(cols) * sizeof(float);
    const std::vector<double> values(weights.begin(), weights.end());
    for (int n : {1, 5, 6, 7, 12, 13, 30}) {
      SCOPED_TRACE(std::to_string(rows) + " x " + std::to_string(cols) + ", " + std::to_string(n) + " positions");
      std::vector<float> x(static_cast<size_t>(n) * cols);
      for (float& v : x) v = static_cast<float>(rng.normal());
      expect_every_isa_matches(w, values, x, n, 0.0);
    }
  }
}

TEST(ChunkMatmul, QuantizedWeightsDecodeAlikeOnEveryIsa) {
  KVQ_FRESH_SEED();
  Rng rng(seed);
  const int rows = 19, n = 13;
  for (GgmlType type : {GgmlType::Q4_0, GgmlType::Q4_1, GgmlType::Q8_0, GgmlType::Q4_K, GgmlType::Q6_K}) {
    SCOPED_TRACE(ggml_traits(type).name);
    const int per_row = type == GgmlType::Q4_K || type == GgmlType::Q6_K ? 1 : 7;  // blocks of 256 or 32
    std::vector<uint8_t> bytes;
    std::vector<double> values;
    size_t row_bytes = 0;
    for (int r = 0; r < rows; ++r) {
      const test::EncodedRow row = test::encode_row(rng, type, per_row);
      row_bytes = row.bytes.size() - 1;  // encode_row starts its row at an odd address
      bytes.insert(bytes.end(), row.bytes.begin() + 1, row.bytes.end());
      values.insert(values.end(), row.expected.begin(), row.expected.end());
    }
    WeightMatrix w;
    w.type = type;
    w.data = reinterpret_cast<const std::byte*>(bytes.data());
    w.rows = rows;
    w.cols = static_cast<int64_t>(values.size()) / rows;
    w.row_bytes = row_bytes;
    std::vector<float> x(static_cast<size_t>(n) * w.cols);
    for (float& v : x) v = static_cast<float>(rng.normal());
    expect_every_isa_matches(w, values, x, n, 4.0);  // the decoded weights' own roundings: a product and an add
  }
}

}  // namespace
}  // namespace kvq

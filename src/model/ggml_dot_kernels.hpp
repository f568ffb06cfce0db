// Fused row-times-vector kernels for the 32-element formats: the quantized values are unpacked to bytes and
// multiplied with x without writing the dequantized row, in loops the compiler vectorizes. Formulas as in
// include/kvq/detail/ggml_quants.hpp. Each takes a row of `blocks` consecutive blocks and x of 32 * blocks floats.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kvq::ggml {

float dot_row_q4_0(const uint8_t* row, const float* x, size_t blocks);
float dot_row_q4_1(const uint8_t* row, const float* x, size_t blocks);
float dot_row_q5_0(const uint8_t* row, const float* x, size_t blocks);
float dot_row_q5_1(const uint8_t* row, const float* x, size_t blocks);
float dot_row_q8_0(const uint8_t* row, const float* x, size_t blocks);

}  // namespace kvq::ggml

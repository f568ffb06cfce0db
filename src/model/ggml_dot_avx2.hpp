// AVX2 + FMA + F16C row-times-vector kernels for the most common weight formats (ggml_dot_kernels.cpp calls them
// where the CPU has those instructions): the codes become floats eight at a time and are multiplied into one
// vector accumulator per row, with the block's scale (and min) applied by FMA, so there is one horizontal sum per
// row instead of two per block.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kvq::ggml::avx2 {

/// Whether this CPU runs the kernels below.
bool available();
float dot_row_q4_0(const uint8_t* row, const float* x, size_t blocks);
float dot_row_q4_1(const uint8_t* row, const float* x, size_t blocks);
float dot_row_q8_0(const uint8_t* row, const float* x, size_t blocks);

}  // namespace kvq::ggml::avx2

// The register block: kTileRows = 16 output rows (two 8-float vectors) times 6 positions, accumulated over the
// columns from the transposed tile wt[c][16]. AVX2+FMA where the CPU has it (chosen at run time, so the library
// stays baseline x86-64), a plain loop the compiler vectorizes elsewhere.
#include "model/chunk_matmul.hpp"

#include <algorithm>
#include <cstring>

#include "kvq/detail/ggml_quants.hpp"

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace kvq::detail {
namespace {

constexpr int kChunkRows = 6;

// Positions past `n` in a block read position n - 1 again (their sums are dropped), so the loops stay fixed-size.
void block_inputs(const float* x, int cols, int n, const float* (&xs)[kChunkRows]) {
  for (int i = 0; i < kChunkRows; ++i) xs[i] = x + static_cast<size_t>(std::min(i, n - 1)) * cols;
}

void store_block(const float (&acc)[kChunkRows][kTileRows], int n, int m, float* y, size_t ldy) {
  for (int i = 0; i < n; ++i) std::memcpy(y + i * ldy, acc[i], static_cast<size_t>(m) * sizeof(float));
}

void block_generic(const float* wt, int cols, const float* x, int n, int m, float* y, size_t ldy) {
  const float* xs[kChunkRows];
  block_inputs(x, cols, n, xs);
  float acc[kChunkRows][kTileRows] = {};
  for (int c = 0; c < cols; ++c) {
    const float* w = wt + static_cast<size_t>(c) * kTileRows;
    for (int i = 0; i < kChunkRows; ++i) {
      const float b = xs[i][c];
      for (int j = 0; j < kTileRows; ++j) acc[i][j] += w[j] * b;
    }
  }
  store_block(acc, n, m, y, ldy);
}

#if defined(__x86_64__)
[[gnu::target("avx2,fma")]] void block_avx2(const float* wt, int cols, const float* x, int n, int m, float* y,
                                            size_t ldy) {
  const float* xs[kChunkRows];
  block_inputs(x, cols, n, xs);
  __m256 acc[kChunkRows][2];
  for (auto& a : acc) a[0] = a[1] = _mm256_setzero_ps();
  for (int c = 0; c < cols; ++c) {
    const __m256 w0 = _mm256_loadu_ps(wt + static_cast<size_t>(c) * kTileRows);
    const __m256 w1 = _mm256_loadu_ps(wt + static_cast<size_t>(c) * kTileRows + 8);
    for (int i = 0; i < kChunkRows; ++i) {
      const __m256 b = _mm256_broadcast_ss(xs[i] + c);
      acc[i][0] = _mm256_fmadd_ps(w0, b, acc[i][0]);
      acc[i][1] = _mm256_fmadd_ps(w1, b, acc[i][1]);
    }
  }
  float out[kChunkRows][kTileRows];
  for (int i = 0; i < kChunkRows; ++i) {
    _mm256_storeu_ps(out[i], acc[i][0]);
    _mm256_storeu_ps(out[i] + 8, acc[i][1]);
  }
  store_block(out, n, m, y, ldy);
}

bool has_avx2() {
  static const bool yes = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return yes;
}
#endif

using BlockFn = void (*)(const float*, int, const float*, int, int, float*, size_t);

BlockFn block_kernel() {
#if defined(__x86_64__)
  if (has_avx2()) return block_avx2;
#endif
  return block_generic;
}

}  // namespace

void multiply_tiles(const WeightMatrix& w, int64_t tile_begin, int64_t tile_end, const float* x, int n, float* y,
                    size_t ldy, std::vector<float>& scratch) {
  const int cols = static_cast<int>(w.cols);
  const size_t tile_floats = static_cast<size_t>(kTileRows) * cols;
  scratch.resize(2 * tile_floats);
  float* rows = scratch.data();              // [kTileRows][cols]
  float* wt = scratch.data() + tile_floats;  // [cols][kTileRows]
  const BlockFn block = block_kernel();
  for (int64_t t = tile_begin; t < tile_end; ++t) {
    const int64_t r0 = t * kTileRows;
    const int m = static_cast<int>(std::min<int64_t>(kTileRows, w.rows - r0));
    for (int r = 0; r < m; ++r) dequantize_row(w.type, w.row(r0 + r), rows + static_cast<size_t>(r) * cols, cols);
    std::fill(rows + static_cast<size_t>(m) * cols, rows + tile_floats, 0.0f);
    for (int r = 0; r < kTileRows; ++r) {
      const float* row = rows + static_cast<size_t>(r) * cols;
      for (int c = 0; c < cols; ++c) wt[static_cast<size_t>(c) * kTileRows + r] = row[c];
    }
    for (int i = 0; i < n; i += kChunkRows)
      block(wt, cols, x + static_cast<size_t>(i) * cols, std::min(kChunkRows, n - i), m, y + i * ldy + r0, ldy);
  }
}

}  // namespace kvq::detail

// The register block: kTileRows = 16 output rows times P positions, accumulated over the columns from the
// transposed tile wt[c][16]: on AVX-512 one 16-float vector per position, 12 positions; on AVX2+FMA two 8-float
// vectors per position, 6 positions; a plain loop the compiler vectorizes elsewhere. Every output is the same chain
// of fp32 FMAs over the columns in order on each, so the kernels give equal results. Chosen at run time by the
// caller's instruction set, so the library stays baseline x86-64.
#include "model/chunk_matmul.hpp"

#include <algorithm>
#include <cstring>

#include "kvq/detail/ggml_quants.hpp"

#if defined(__x86_64__)
// GCC 12's AVX-512 intrinsics start from _mm512_undefined_*(), which -Wmaybe-uninitialized flags wherever they are
// inlined (GCC bug 105593).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#endif
#include <immintrin.h>
#endif

namespace kvq::detail {
namespace {

// Positions past `n` in a block read position n - 1 again (their sums are dropped), so the loops stay fixed-size.
template <int P>
void block_inputs(const float* x, int cols, int n, const float* (&xs)[P]) {
  for (int i = 0; i < P; ++i) xs[i] = x + static_cast<size_t>(std::min(i, n - 1)) * cols;
}

template <int P>
void store_block(const float (&acc)[P][kTileRows], int n, int m, float* y, size_t ldy) {
  for (int i = 0; i < n; ++i) std::memcpy(y + i * ldy, acc[i], static_cast<size_t>(m) * sizeof(float));
}

constexpr int kGenericPositions = 6;

void block_generic(const float* wt, int cols, const float* x, int n, int m, float* y, size_t ldy) {
  constexpr int P = kGenericPositions;
  const float* xs[P];
  block_inputs<P>(x, cols, n, xs);
  float acc[P][kTileRows] = {};
  for (int c = 0; c < cols; ++c) {
    const float* w = wt + static_cast<size_t>(c) * kTileRows;
    for (int i = 0; i < P; ++i) {
      const float b = xs[i][c];
      for (int j = 0; j < kTileRows; ++j) acc[i][j] += w[j] * b;
    }
  }
  store_block<P>(acc, n, m, y, ldy);
}

// wt[c][r] = rows[r][c] for the tile's kTileRows rows and the columns from `from` on (those a vector transpose of
// 8 or 16 columns at a time leaves over).
void transpose_tail(const float* rows, int cols, int from, float* wt) {
  for (int c = from; c < cols; ++c)
    for (int r = 0; r < kTileRows; ++r)
      wt[static_cast<size_t>(c) * kTileRows + r] = rows[static_cast<size_t>(r) * cols + c];
}

void transpose_generic(const float* rows, int cols, float* wt) { transpose_tail(rows, cols, 0, wt); }

#if defined(__x86_64__)
constexpr int kAvx2Positions = 6;

// 8 x 8 blocks: rows interleaved in pairs, then in fours (within 128-bit lanes), then the lanes swapped.
[[gnu::target("avx2,fma")]] void transpose_avx2(const float* rows, int cols, float* wt) {
  int c = 0;
  for (; c + 8 <= cols; c += 8)
    for (int half = 0; half < 2; ++half) {
      __m256 r[8], t[8], u[8];
      for (int i = 0; i < 8; ++i) r[i] = _mm256_loadu_ps(rows + static_cast<size_t>(8 * half + i) * cols + c);
      for (int k = 0; k < 4; ++k) {
        t[2 * k] = _mm256_unpacklo_ps(r[2 * k], r[2 * k + 1]);
        t[2 * k + 1] = _mm256_unpackhi_ps(r[2 * k], r[2 * k + 1]);
      }
      for (int k = 0; k < 2; ++k) {  // u[4 k + m], 128-bit lane L: rows 4 k .. 4 k + 3 of column 4 L + m
        u[4 * k] = _mm256_shuffle_ps(t[4 * k], t[4 * k + 2], 0x44);
        u[4 * k + 1] = _mm256_shuffle_ps(t[4 * k], t[4 * k + 2], 0xEE);
        u[4 * k + 2] = _mm256_shuffle_ps(t[4 * k + 1], t[4 * k + 3], 0x44);
        u[4 * k + 3] = _mm256_shuffle_ps(t[4 * k + 1], t[4 * k + 3], 0xEE);
      }
      for (int m = 0; m < 4; ++m) {
        float* out = wt + static_cast<size_t>(c + m) * kTileRows + 8 * half;
        _mm256_storeu_ps(out, _mm256_permute2f128_ps(u[m], u[4 + m], 0x20));
        _mm256_storeu_ps(out + 4 * kTileRows, _mm256_permute2f128_ps(u[m], u[4 + m], 0x31));
      }
    }
  transpose_tail(rows, cols, c, wt);
}

[[gnu::target("avx2,fma")]] void block_avx2(const float* wt, int cols, const float* x, int n, int m, float* y,
                                            size_t ldy) {
  constexpr int P = kAvx2Positions;
  const float* xs[P];
  block_inputs<P>(x, cols, n, xs);
  __m256 acc[P][2];
  for (auto& a : acc) a[0] = a[1] = _mm256_setzero_ps();
  for (int c = 0; c < cols; ++c) {
    const __m256 w0 = _mm256_loadu_ps(wt + static_cast<size_t>(c) * kTileRows);
    const __m256 w1 = _mm256_loadu_ps(wt + static_cast<size_t>(c) * kTileRows + 8);
    for (int i = 0; i < P; ++i) {
      const __m256 b = _mm256_broadcast_ss(xs[i] + c);
      acc[i][0] = _mm256_fmadd_ps(w0, b, acc[i][0]);
      acc[i][1] = _mm256_fmadd_ps(w1, b, acc[i][1]);
    }
  }
  float out[P][kTileRows];
  for (int i = 0; i < P; ++i) {
    _mm256_storeu_ps(out[i], acc[i][0]);
    _mm256_storeu_ps(out[i] + 8, acc[i][1]);
  }
  store_block<P>(out, n, m, y, ldy);
}

constexpr int kAvx512Positions = 12;

[[gnu::target("avx512f,fma")]] void block_avx512(const float* wt, int cols, const float* x, int n, int m, float* y,
                                                 size_t ldy) {
  constexpr int P = kAvx512Positions;
  const float* xs[P];
  block_inputs<P>(x, cols, n, xs);
  __m512 acc[P];
  for (auto& a : acc) a = _mm512_setzero_ps();
  for (int c = 0; c < cols; ++c) {
    const __m512 w = _mm512_loadu_ps(wt + static_cast<size_t>(c) * kTileRows);
    for (int i = 0; i < P; ++i) acc[i] = _mm512_fmadd_ps(w, _mm512_set1_ps(xs[i][c]), acc[i]);
  }
  float out[P][kTileRows];
  for (int i = 0; i < P; ++i) _mm512_storeu_ps(out[i], acc[i]);
  store_block<P>(out, n, m, y, ldy);
}

// An fp16 field, in every lane.
[[gnu::target("avx512f")]] __m512 half_avx512(const std::byte* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _mm512_cvtph_ps(_mm256_set1_epi16(static_cast<short>(h)));
}

// 16 code bytes.
[[gnu::target("avx512f")]] __m128i codes16(const std::byte* p) {
  return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
}

// Whether dequantize_avx512 decodes the format.
bool avx512_decodes(GgmlType type) {
  return type == GgmlType::Q4_0 || type == GgmlType::Q4_1 || type == GgmlType::Q8_0;
}

// One row of Q4_0, Q4_1 or Q8_0 blocks to fp32, 16 elements a vector, by the scalar decoders' operations (the
// code times d, then Q4_1's minimum added: an empty asm between keeps GCC from fusing them into an FMA): equal
// results.
[[gnu::target("avx512f")]] void dequantize_avx512(GgmlType type, const void* row, float* out, int64_t cols) {
  const __m512i low = _mm512_set1_epi32(0xF), eight = _mm512_set1_epi32(8);
  for (int64_t b = 0; b < cols / ggml::QK; ++b) {
    float* y = out + static_cast<size_t>(b) * ggml::QK;
    if (type == GgmlType::Q8_0) {
      const std::byte* p = static_cast<const std::byte*>(row) + static_cast<size_t>(b) * sizeof(ggml::BlockQ8_0);
      const __m512 d = half_avx512(p);
      _mm512_storeu_ps(y, _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(codes16(p + 2))), d));
      _mm512_storeu_ps(y + 16, _mm512_mul_ps(_mm512_cvtepi32_ps(_mm512_cvtepi8_epi32(codes16(p + 18))), d));
      continue;
    }
    const bool q4_1 = type == GgmlType::Q4_1;
    const std::byte* p = static_cast<const std::byte*>(row) +
                         static_cast<size_t>(b) * (q4_1 ? sizeof(ggml::BlockQ4_1) : sizeof(ggml::BlockQ4_0));
    const __m512 d = half_avx512(p);
    const __m512i q = _mm512_cvtepu8_epi32(codes16(p + (q4_1 ? 4 : 2)));
    __m512i lo = _mm512_and_si512(q, low), hi = _mm512_srli_epi32(q, 4);
    if (!q4_1) lo = _mm512_sub_epi32(lo, eight), hi = _mm512_sub_epi32(hi, eight);
    __m512 y0 = _mm512_mul_ps(_mm512_cvtepi32_ps(lo), d), y1 = _mm512_mul_ps(_mm512_cvtepi32_ps(hi), d);
    if (q4_1) {
      asm("" : "+v"(y0), "+v"(y1));
      const __m512 m = half_avx512(p + 2);
      y0 = _mm512_add_ps(y0, m), y1 = _mm512_add_ps(y1, m);
    }
    _mm512_storeu_ps(y, y0);
    _mm512_storeu_ps(y + 16, y1);
  }
}

// 16 x 16 blocks: as the AVX2 one within 128-bit lanes, then the four lanes of four vectors transposed.
[[gnu::target("avx512f")]] void transpose_avx512(const float* rows, int cols, float* wt) {
  int c = 0;
  for (; c + 16 <= cols; c += 16) {
    __m512 r[16], t[16], u[16];
    for (int i = 0; i < 16; ++i) r[i] = _mm512_loadu_ps(rows + static_cast<size_t>(i) * cols + c);
    for (int k = 0; k < 8; ++k) {
      t[2 * k] = _mm512_unpacklo_ps(r[2 * k], r[2 * k + 1]);
      t[2 * k + 1] = _mm512_unpackhi_ps(r[2 * k], r[2 * k + 1]);
    }
    for (int k = 0; k < 4; ++k) {  // u[4 k + m], 128-bit lane L: rows 4 k .. 4 k + 3 of column 4 L + m
      u[4 * k] = _mm512_shuffle_ps(t[4 * k], t[4 * k + 2], 0x44);
      u[4 * k + 1] = _mm512_shuffle_ps(t[4 * k], t[4 * k + 2], 0xEE);
      u[4 * k + 2] = _mm512_shuffle_ps(t[4 * k + 1], t[4 * k + 3], 0x44);
      u[4 * k + 3] = _mm512_shuffle_ps(t[4 * k + 1], t[4 * k + 3], 0xEE);
    }
    for (int m = 0; m < 4; ++m) {  // column 4 L + m: lane k of u[4 k + m] for k = 0..3
      const __m512 x0 = _mm512_shuffle_f32x4(u[m], u[4 + m], 0x44), x1 = _mm512_shuffle_f32x4(u[m], u[4 + m], 0xEE);
      const __m512 x2 = _mm512_shuffle_f32x4(u[8 + m], u[12 + m], 0x44);
      const __m512 x3 = _mm512_shuffle_f32x4(u[8 + m], u[12 + m], 0xEE);
      float* out = wt + static_cast<size_t>(c + m) * kTileRows;
      _mm512_storeu_ps(out, _mm512_shuffle_f32x4(x0, x2, 0x88));
      _mm512_storeu_ps(out + 4 * kTileRows, _mm512_shuffle_f32x4(x0, x2, 0xDD));
      _mm512_storeu_ps(out + 8 * kTileRows, _mm512_shuffle_f32x4(x1, x3, 0x88));
      _mm512_storeu_ps(out + 12 * kTileRows, _mm512_shuffle_f32x4(x1, x3, 0xDD));
    }
  }
  transpose_tail(rows, cols, c, wt);
}
#endif

using BlockFn = void (*)(const float*, int, const float*, int, int, float*, size_t);
using TransposeFn = void (*)(const float*, int, float*);
using DequantizeFn = void (*)(GgmlType, const void*, float*, int64_t);

struct BlockKernel {
  BlockFn fn;
  int positions;  // per call
  TransposeFn transpose;
  DequantizeFn dequantize = dequantize_row;  // a row of the weights' format to fp32
};

BlockKernel block_kernel(Isa isa, GgmlType type) {
#if defined(__x86_64__)
  if (isa == Isa::avx2) return {block_avx2, kAvx2Positions, transpose_avx2};
  if (isa == Isa::avx512 || isa == Isa::avx512vnni || isa == Isa::avx512bf16)
    return {block_avx512, kAvx512Positions, transpose_avx512,
            avx512_decodes(type) ? dequantize_avx512 : dequantize_row};
#endif
  (void)isa, (void)type;  // the x86 levels only
  return {block_generic, kGenericPositions, transpose_generic};
}

}  // namespace

void multiply_tiles(const WeightMatrix& w, int64_t tile_begin, int64_t tile_end, const float* x, int n, float* y,
                    size_t ldy, std::vector<float>& scratch, Isa isa) {
  const int cols = static_cast<int>(w.cols);
  const size_t tile_floats = static_cast<size_t>(kTileRows) * cols;
  scratch.resize(2 * tile_floats);
  float* rows = scratch.data();              // [kTileRows][cols]
  float* wt = scratch.data() + tile_floats;  // [cols][kTileRows]
  const BlockKernel block = block_kernel(isa, w.type);
  for (int64_t t = tile_begin; t < tile_end; ++t) {
    const int64_t r0 = t * kTileRows;
    const int m = static_cast<int>(std::min<int64_t>(kTileRows, w.rows - r0));
    for (int r = 0; r < m; ++r) block.dequantize(w.type, w.row(r0 + r), rows + static_cast<size_t>(r) * cols, cols);
    std::fill(rows + static_cast<size_t>(m) * cols, rows + tile_floats, 0.0f);
    block.transpose(rows, cols, wt);
    for (int i = 0; i < n; i += block.positions)
      block.fn(wt, cols, x + static_cast<size_t>(i) * cols, std::min(block.positions, n - i), m, y + i * ldy + r0,
               ldy);
  }
}

}  // namespace kvq::detail

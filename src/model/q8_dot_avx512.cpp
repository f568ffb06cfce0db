// q8_dot_simd.hpp with AVX512-VNNI on 256-bit vectors (AVX512-VL): four products summed per lane by one vpdpbusd.
// The decode kernels of Q4_0, Q4_1 and Q8_0 (kQ8WeightRows rows, one activation row) on 512-bit vectors instead:
// the rows' blocks side by side in one vector (below). This file alone is compiled with those flags.
#include "model/q8_dot.hpp"

#if defined(__x86_64__)
// GCC 12's AVX-512 intrinsics start from _mm512_undefined_*(), which -Wmaybe-uninitialized flags wherever they are
// inlined (GCC bug 105593).
#if defined(__GNUC__) && !defined(__clang__)
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#endif
#include "model/q8_dot_simd.hpp"

namespace kvq::detail {
namespace {

struct VnniOps {
  static __m256i dot4(__m256i acc, __m256i u, __m256i s) { return _mm256_dpbusd_epi32(acc, u, s); }
};

// The 16 code bytes of block b of the four rows (w: row 0's block), row k in 128-bit lane k.
template <class Block>
__m512i four_rows_codes(const uint8_t* w, size_t row_bytes) {
  const __m256i low = q8_simd::two_rows_codes<Block>(w, row_bytes);
  return _mm512_inserti64x4(_mm512_castsi256_si512(low), q8_simd::two_rows_codes<Block>(w + 2 * row_bytes, row_bytes),
                            1);
}

// kQ8WeightRows = 4 rows of Q4_1 (or Q4_0) against one activation row, the four rows' blocks in one vector: lanes
// 4k .. 4k + 3 hold row k's 32 products of a block, as in q8_dot_simd.hpp's dot_q4_weight_rows with twice the width:
// a quarter of the instructions per row of a row at a time.
template <class Block>
void dot_q4_weight_rows_x4(const uint8_t* row, size_t row_bytes, const Q8Row& x, size_t blocks, float* out) {
  static_assert(kQ8WeightRows == 4);
  constexpr bool kHasMin = std::is_same_v<Block, ggml::BlockQ4_1>;
  const __m512i low4 = _mm512_set1_epi8(0x0F);
  const __m512i scale_index = _mm512_setr_epi32(0, 0, 0, 0, 2, 2, 2, 2, 4, 4, 4, 4, 6, 6, 6, 6);
  __m512 acc = _mm512_setzero_ps();
  __m256 offset = _mm256_setzero_ps();
  for (size_t b = 0; b < blocks; ++b) {
    const uint8_t* w = row + b * sizeof(Block);
    const int8_t* c = x.codes + b * ggml::QK;
    const __m512i q = four_rows_codes<Block>(w, row_bytes);
    const __m512i x_low = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(c)));
    const __m512i x_high = _mm512_broadcast_i32x4(_mm_loadu_si128(reinterpret_cast<const __m128i*>(c + 16)));
    __m512i i = _mm512_dpbusd_epi32(_mm512_setzero_si512(), _mm512_and_si512(q, low4), x_low);
    i = _mm512_dpbusd_epi32(i, _mm512_and_si512(_mm512_srli_epi16(q, 4), low4), x_high);
    const __m256 head = q8_simd::four_rows_head(w, row_bytes);
    const __m512 scale =
        _mm512_mul_ps(_mm512_permutexvar_ps(scale_index, _mm512_castps256_ps512(head)), _mm512_set1_ps(x.scales[b]));
    acc = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i), scale, acc);
    offset = _mm256_fmadd_ps(head, _mm256_set1_ps(x.sums[b]), offset);
  }
  alignas(64) float lanes[16], offsets[8];
  _mm512_store_ps(lanes, acc);
  _mm256_store_ps(offsets, offset);
  for (int k = 0; k < 4; ++k) {
    const float* l = lanes + 4 * k;
    out[k] = ((l[0] + l[1]) + (l[2] + l[3])) + (kHasMin ? offsets[2 * k + 1] : -8.0f * offsets[2 * k]);
  }
}

// kQ8WeightRows = 4 rows of Q8_0 against one activation row, two rows' blocks per vector (row k in the low 256
// bits): the signed codes w enter vpdpbusd as the unsigned w + 128 (a flipped top bit) against the activation codes
// c, and 128 sum c, the same for every row, starts each block's sums negated. Lanes 0..7 hold row k's products, lanes
// 8..15 row k + 1's, scaled by d_k d_b as in dot_q4_weight_rows_x4.
void dot_q8_0_weight_rows_x4(const uint8_t* row, size_t row_bytes, const Q8Row& x, size_t blocks, float* out) {
  static_assert(kQ8WeightRows == 4);
  using ggml::BlockQ8_0;
  const __m512i flip = _mm512_set1_epi8(static_cast<char>(0x80));
  const __m512i scale_index[2] = {_mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 2, 2, 2, 2, 2, 2, 2, 2),
                                  _mm512_setr_epi32(4, 4, 4, 4, 4, 4, 4, 4, 6, 6, 6, 6, 6, 6, 6, 6)};
  __m512 acc[2] = {_mm512_setzero_ps(), _mm512_setzero_ps()};
  for (size_t b = 0; b < blocks; ++b) {
    const uint8_t* w = row + b * sizeof(BlockQ8_0);
    const __m512i c = _mm512_broadcast_i64x4(q8_simd::load32(x.codes + b * ggml::QK));
    const __m512i bias = _mm512_dpbusd_epi32(_mm512_setzero_si512(), flip, c);  // 128 sum c, four codes per lane
    const __m512i start = _mm512_sub_epi32(_mm512_setzero_si512(), bias);
    const __m512 head = _mm512_castps256_ps512(
        _mm256_mul_ps(q8_simd::four_rows_head(w, row_bytes), _mm256_set1_ps(x.scales[b])));
    for (int pair = 0; pair < 2; ++pair) {
      const uint8_t* qs = w + 2 * pair * row_bytes + offsetof(BlockQ8_0, qs);
      const __m512i q =
          _mm512_inserti64x4(_mm512_castsi256_si512(q8_simd::load32(qs)), q8_simd::load32(qs + row_bytes), 1);
      const __m512i i = _mm512_dpbusd_epi32(start, _mm512_xor_si512(q, flip), c);
      acc[pair] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i), _mm512_permutexvar_ps(scale_index[pair], head), acc[pair]);
    }
  }
  for (int pair = 0; pair < 2; ++pair) {
    alignas(64) float lanes[16];
    _mm512_store_ps(lanes, acc[pair]);
    for (int h = 0; h < 2; ++h) {
      const float* l = lanes + 8 * h;
      out[2 * pair + h] = ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
    }
  }
}

constexpr Q8DotTable vnni_table() {
  Q8DotTable t = q8_simd::table<VnniOps>();
  t.q4_0.weight_rows = dot_q4_weight_rows_x4<ggml::BlockQ4_0>;
  t.q4_1.weight_rows = dot_q4_weight_rows_x4<ggml::BlockQ4_1>;
  t.q8_0.weight_rows = dot_q8_0_weight_rows_x4;
  return t;
}

}  // namespace

const Q8DotTable kQ8DotAvx512Vnni = vnni_table();

}  // namespace kvq::detail
#else
namespace kvq::detail {
const Q8DotTable kQ8DotAvx512Vnni = {};
}  // namespace kvq::detail
#endif

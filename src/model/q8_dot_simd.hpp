// The kernels of q8_dot.hpp on 256-bit integer vectors, written once over `Ops`, which gives the one instruction
// that differs between the instruction sets: dot4(acc, u, s), acc + the sums of four adjacent products of unsigned
// bytes u and signed bytes s per 32-bit lane (AVX2: vpmaddubsw then vpmaddwd; AVX512-VNNI: vpdpbusd). Included only
// by the translation units compiled for those instructions (q8_dot_avx2.cpp, q8_dot_avx512.cpp).
//
// Each block's 32 products land in 8 int32 lanes (the 4-bit weight-row kernel: 4 lanes, two rows to a vector), are
// converted to float once and multiplied by the block's scale product into one float accumulator per row; offsets
// (Q4_0's 8, Q4_1's and Q4_K's mins) go to a scalar sum (the weight-row kernel: the lanes of the blocks' heads).
// Signed weight codes (Q8_0, Q6_K minus 32) use |w| and the activation codes with w's sign (vpsignb), as the
// products need unsigned first operands. The int16 pair sums of vpmaddubsw cannot saturate: at most
// 2 x 128 x 127 = 32512 (Q8_0), 2 x 32 x 127 (Q6_K), 2 x 15 x 127 (4 bits).
#pragma once

#include <immintrin.h>

#include <cstring>
#include <type_traits>

#include "model/q8_dot.hpp"

namespace kvq::detail::q8_simd {

using namespace ggml;

inline float half_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

inline __m256i load32(const void* p) { return _mm256_loadu_si256(static_cast<const __m256i*>(p)); }

inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_shuffle_ps(s, s, 1)));
}

// The 32 codes of a 4-bit block of 16 bytes: low nibbles (elements 0..15), then high nibbles (16..31).
inline __m256i nibbles(const uint8_t* qs) {
  const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(b, 4), b), _mm256_set1_epi8(0x0F));
}

// Unsigned codes u times the block's activation codes: 8 int32 lanes, lane k the elements 4k .. 4k + 3.
template <class Ops>
inline __m256i dot_unsigned(__m256i u, const int8_t* c) {
  return Ops::dot4(_mm256_setzero_si256(), u, load32(c));
}

// Signed codes w (with magnitude |w|) times the activation codes.
template <class Ops>
inline __m256i dot_signed(__m256i w, __m256i magnitude, const int8_t* c) {
  return Ops::dot4(_mm256_setzero_si256(), magnitude, _mm256_sign_epi8(load32(c), w));
}

// out[r] = hsum(acc[r]) + offset_sign * offset[r] for the R rows.
template <int R>
inline void finish(const __m256 (&acc)[R], const float (&offset)[R], float offset_sign, float* out) {
  for (int r = 0; r < R; ++r) out[r] = hsum(acc[r]) + offset_sign * offset[r];
}

// The kernels take R activation rows at once: each weight block is loaded and unpacked once for all of them (R = 1
// for one position, more for the positions of a chunk).
template <class Ops, int R>
void dot_q4_0(const uint8_t* row, const Q8Row* x, size_t blocks, float* out) {
  __m256 acc[R];
  float offset[R] = {};
  for (auto& a : acc) a = _mm256_setzero_ps();
  for (size_t b = 0; b < blocks; ++b) {
    const uint8_t* w = row + b * sizeof(BlockQ4_0);
    const float d = half_at(w + offsetof(BlockQ4_0, d));
    const __m256i q = nibbles(w + offsetof(BlockQ4_0, qs));
    for (int r = 0; r < R; ++r) {
      const __m256i i = dot_unsigned<Ops>(q, x[r].codes + b * QK);
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i), _mm256_set1_ps(d * x[r].scales[b]), acc[r]);
      offset[r] += d * x[r].sums[b];
    }
  }
  finish(acc, offset, -8.0f, out);
}

template <class Ops, int R>
void dot_q4_1(const uint8_t* row, const Q8Row* x, size_t blocks, float* out) {
  __m256 acc[R];
  float offset[R] = {};
  for (auto& a : acc) a = _mm256_setzero_ps();
  for (size_t b = 0; b < blocks; ++b) {
    const uint8_t* w = row + b * sizeof(BlockQ4_1);
    const float d = half_at(w + offsetof(BlockQ4_1, d)), m = half_at(w + offsetof(BlockQ4_1, m));
    const __m256i q = nibbles(w + offsetof(BlockQ4_1, qs));
    for (int r = 0; r < R; ++r) {
      const __m256i i = dot_unsigned<Ops>(q, x[r].codes + b * QK);
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i), _mm256_set1_ps(d * x[r].scales[b]), acc[r]);
      offset[r] += m * x[r].sums[b];
    }
  }
  finish(acc, offset, 1.0f, out);
}

// The 16 code bytes of block b of rows k and k + 1 (w: row k's block), row k in the low 128 bits.
template <class Block>
inline __m256i two_rows_codes(const uint8_t* w, size_t row_bytes) {
  const auto* qs = reinterpret_cast<const __m128i*>(w + offsetof(Block, qs));
  const auto* qs_next = reinterpret_cast<const __m128i*>(w + row_bytes + offsetof(Block, qs));
  return _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128(qs)), _mm_loadu_si128(qs_next), 1);
}

// The first 32 bits of block b of kQ8WeightRows = 4 rows (w: row 0's block) as fp32 pairs, lanes 2k and 2k + 1 of
// row k: Q4_1's d and m; Q4_0's d and two code bytes (read, unused).
inline __m256 four_rows_head(const uint8_t* w, size_t row_bytes) {
  int32_t head[4];
  for (int k = 0; k < 4; ++k) std::memcpy(&head[k], w + k * row_bytes, 4);
  return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(head)));
}

// kQ8WeightRows = 4 rows of Q4_1 (or Q4_0) against one activation row, two rows' blocks per vector: lanes 0..3 hold
// row k's 32 products of a block, lanes 4..7 row k + 1's (low nibbles against activations 0..15, high nibbles
// against 16..31, four per lane), converted once and scaled by d_k d_b; the offsets m_k s_b (or -8 d_k s_b) gather
// in the blocks' heads' lanes. Half the instructions per row of a row at a time; the same sums per block, added in
// another order (within q8_dot_test's rounding bound).
template <class Ops, class Block>
void dot_q4_weight_rows(const uint8_t* row, size_t row_bytes, const Q8Row& x, size_t blocks, float* out) {
  static_assert(kQ8WeightRows == 4);
  constexpr bool kHasMin = std::is_same_v<Block, BlockQ4_1>;
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  const __m256i scale_index[2] = {_mm256_setr_epi32(0, 0, 0, 0, 2, 2, 2, 2), _mm256_setr_epi32(4, 4, 4, 4, 6, 6, 6, 6)};
  __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()}, offset = _mm256_setzero_ps();
  for (size_t b = 0; b < blocks; ++b) {
    const uint8_t* w = row + b * sizeof(Block);
    const int8_t* c = x.codes + b * QK;
    const __m256i x_low = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(c)));
    const __m256i x_high = _mm256_broadcastsi128_si256(_mm_loadu_si128(reinterpret_cast<const __m128i*>(c + 16)));
    const __m256 head = four_rows_head(w, row_bytes);
    const __m256 xd = _mm256_set1_ps(x.scales[b]);
    for (int pair = 0; pair < 2; ++pair) {
      const __m256i q = two_rows_codes<Block>(w + 2 * pair * row_bytes, row_bytes);
      __m256i i = Ops::dot4(_mm256_setzero_si256(), _mm256_and_si256(q, low4), x_low);
      i = Ops::dot4(i, _mm256_and_si256(_mm256_srli_epi16(q, 4), low4), x_high);
      const __m256 scale = _mm256_mul_ps(_mm256_permutevar8x32_ps(head, scale_index[pair]), xd);
      acc[pair] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i), scale, acc[pair]);
    }
    offset = _mm256_fmadd_ps(head, _mm256_set1_ps(x.sums[b]), offset);
  }
  alignas(32) float lanes[2][8], offsets[8];
  for (int pair = 0; pair < 2; ++pair) _mm256_store_ps(lanes[pair], acc[pair]);
  _mm256_store_ps(offsets, offset);
  for (int k = 0; k < 4; ++k) {
    const float* l = lanes[k / 2] + 4 * (k % 2);
    out[k] = ((l[0] + l[1]) + (l[2] + l[3])) + (kHasMin ? offsets[2 * k + 1] : -8.0f * offsets[2 * k]);
  }
}

template <class Ops>
void dot_q8_0_weight_rows(const uint8_t* row, size_t row_bytes, const Q8Row& x, size_t blocks, float* out) {
  constexpr int W = kQ8WeightRows;
  __m256 acc[W];
  const float offset[W] = {};
  for (auto& a : acc) a = _mm256_setzero_ps();
  for (size_t b = 0; b < blocks; ++b) {
    const int8_t* c = x.codes + b * QK;
    for (int k = 0; k < W; ++k) {
      const uint8_t* w = row + static_cast<size_t>(k) * row_bytes + b * sizeof(BlockQ8_0);
      const float d = half_at(w + offsetof(BlockQ8_0, d));
      const __m256i q = load32(w + offsetof(BlockQ8_0, qs)), magnitude = _mm256_abs_epi8(q);
      const __m256i i = dot_signed<Ops>(q, magnitude, c);
      acc[k] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i), _mm256_set1_ps(d * x.scales[b]), acc[k]);
    }
  }
  finish(acc, offset, 0.0f, out);
}

template <class Ops, int R>
void dot_q8_0(const uint8_t* row, const Q8Row* x, size_t blocks, float* out) {
  __m256 acc[R];
  const float offset[R] = {};
  for (auto& a : acc) a = _mm256_setzero_ps();
  for (size_t b = 0; b < blocks; ++b) {
    const uint8_t* w = row + b * sizeof(BlockQ8_0);
    const float d = half_at(w + offsetof(BlockQ8_0, d));
    const __m256i q = load32(w + offsetof(BlockQ8_0, qs)), magnitude = _mm256_abs_epi8(q);
    for (int r = 0; r < R; ++r) {
      const __m256i i = dot_signed<Ops>(q, magnitude, x[r].codes + b * QK);
      acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i), _mm256_set1_ps(d * x[r].scales[b]), acc[r]);
    }
  }
  finish(acc, offset, 0.0f, out);
}

template <class Ops, int R>
void dot_q4_k(const uint8_t* row, const Q8Row* x, size_t blocks, float* out) {
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  __m256 acc[R];
  float offset[R] = {};
  for (auto& a : acc) a = _mm256_setzero_ps();
  for (size_t sb = 0; sb < blocks / 8; ++sb) {
    const uint8_t* w = row + sb * sizeof(BlockQ4_K);
    const float d = half_at(w + offsetof(BlockQ4_K, d)), dmin = half_at(w + offsetof(BlockQ4_K, dmin));
    const uint8_t* scales = w + offsetof(BlockQ4_K, scales);
    for (int pair = 0; pair < 4; ++pair) {  // sub-blocks 2 pair (low nibbles) and 2 pair + 1 (high nibbles)
      const __m256i q = load32(w + offsetof(BlockQ4_K, qs) + 32 * pair);
      const __m256i halves[2] = {_mm256_and_si256(q, low4), _mm256_and_si256(_mm256_srli_epi16(q, 4), low4)};
      for (int h = 0; h < 2; ++h) {
        const int s = 2 * pair + h;
        const size_t b = sb * 8 + static_cast<size_t>(s);
        uint8_t sc, m;
        scale_min_k4(s, scales, sc, m);
        const float ds = d * static_cast<float>(sc), dm = dmin * static_cast<float>(m);
        for (int r = 0; r < R; ++r) {
          const __m256i i = dot_unsigned<Ops>(halves[h], x[r].codes + b * QK);
          acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i), _mm256_set1_ps(ds * x[r].scales[b]), acc[r]);
          offset[r] += dm * x[r].sums[b];
        }
      }
    }
  }
  finish(acc, offset, -1.0f, out);
}

template <class Ops, int R>
void dot_q6_k(const uint8_t* row, const Q8Row* x, size_t blocks, float* out) {
  const __m256i low4 = _mm256_set1_epi8(0x0F), low2 = _mm256_set1_epi8(3), bias = _mm256_set1_epi8(32);
  __m256 acc[R];
  const float offset[R] = {};
  for (auto& a : acc) a = _mm256_setzero_ps();
  for (size_t sb = 0; sb < blocks / 8; ++sb) {
    const uint8_t* w = row + sb * sizeof(BlockQ6_K);
    const float d = half_at(w + offsetof(BlockQ6_K, d));
    for (int half = 0; half < 2; ++half) {
      const uint8_t* ql = w + offsetof(BlockQ6_K, ql) + 64 * half;
      const auto* sc = reinterpret_cast<const int8_t*>(w + offsetof(BlockQ6_K, scales)) + 8 * half;
      const __m256i l0 = load32(ql), l1 = load32(ql + 32), qh = load32(w + offsetof(BlockQ6_K, qh) + 32 * half);
      // Group g: elements 32 g .. 32 g + 31 of the half (ggml_quants.hpp's element l + 32 g).
      const __m256i low[4] = {_mm256_and_si256(l0, low4), _mm256_and_si256(l1, low4),
                              _mm256_and_si256(_mm256_srli_epi16(l0, 4), low4),
                              _mm256_and_si256(_mm256_srli_epi16(l1, 4), low4)};
      for (int g = 0; g < 4; ++g) {
        const __m256i high = _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * g), low2), 4);
        const __m256i q = _mm256_sub_epi8(_mm256_or_si256(low[g], high), bias), magnitude = _mm256_abs_epi8(q);
        const size_t b = sb * 8 + static_cast<size_t>(4 * half + g);
        // Lanes 0..3 are elements 0..15 (scale sc[2g]), lanes 4..7 elements 16..31 (sc[2g + 1]).
        const __m256i scale = _mm256_setr_epi32(sc[2 * g], sc[2 * g], sc[2 * g], sc[2 * g], sc[2 * g + 1],
                                                sc[2 * g + 1], sc[2 * g + 1], sc[2 * g + 1]);
        for (int r = 0; r < R; ++r) {
          const __m256i i = _mm256_mullo_epi32(dot_signed<Ops>(q, magnitude, x[r].codes + b * QK), scale);
          acc[r] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i), _mm256_set1_ps(d * x[r].scales[b]), acc[r]);
        }
      }
    }
  }
  finish(acc, offset, 0.0f, out);
}

template <class Ops>
constexpr Q8DotTable table() {
  return {{dot_q4_0<Ops, 1>, dot_q4_0<Ops, kQ8Rows>, dot_q4_weight_rows<Ops, BlockQ4_0>},
          {dot_q4_1<Ops, 1>, dot_q4_1<Ops, kQ8Rows>, dot_q4_weight_rows<Ops, BlockQ4_1>},
          {dot_q8_0<Ops, 1>, dot_q8_0<Ops, kQ8Rows>, dot_q8_0_weight_rows<Ops>},
          {dot_q4_k<Ops, 1>, dot_q4_k<Ops, kQ8Rows>},
          {dot_q6_k<Ops, 1>, dot_q6_k<Ops, kQ8Rows>}};
}

}  // namespace kvq::detail::q8_simd

#include "model/ggml_dot_avx2.hpp"

#include <cstddef>
#include <cstring>

#include "kvq/detail/ggml_quants.hpp"

#if defined(__x86_64__)
#include <immintrin.h>

#include "core/cpu_f16c.hpp"

namespace kvq::ggml::avx2 {
namespace {

#define KVQ_AVX2 [[gnu::target("avx2,fma,f16c")]]

KVQ_AVX2 inline __m256 half_scale(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _mm256_set1_ps(_cvtsh_ss(h));
}

KVQ_AVX2 inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  return _mm_cvtss_f32(_mm_add_ss(s, _mm_shuffle_ps(s, s, 1)));
}

// Eight unsigned (signed) bytes of b starting at byte 0 or 8, as floats.
template <int kByte>
KVQ_AVX2 inline __m256 u8_floats(__m128i b) {
  return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_srli_si128(b, kByte)));
}
template <int kByte>
KVQ_AVX2 inline __m256 s8_floats(__m128i b) {
  return _mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_srli_si128(b, kByte)));
}

// sum_j q[j] x[j] over a 4-bit block (elements 0..15 the low nibbles, 16..31 the high ones) as 8 lanes, and
// sum_j x[j] likewise.
KVQ_AVX2 inline void nibble_dot(const uint8_t* qs_ptr, const float* x, __m256& qx, __m256& sx) {
  const __m128i qs = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs_ptr));
  const __m128i mask = _mm_set1_epi8(0x0F);
  const __m128i lo = _mm_and_si128(qs, mask), hi = _mm_and_si128(_mm_srli_epi16(qs, 4), mask);
  const __m256 x0 = _mm256_loadu_ps(x), x1 = _mm256_loadu_ps(x + 8), x2 = _mm256_loadu_ps(x + 16),
               x3 = _mm256_loadu_ps(x + 24);
  qx = _mm256_mul_ps(u8_floats<0>(lo), x0);
  qx = _mm256_fmadd_ps(u8_floats<8>(lo), x1, qx);
  qx = _mm256_fmadd_ps(u8_floats<0>(hi), x2, qx);
  qx = _mm256_fmadd_ps(u8_floats<8>(hi), x3, qx);
  sx = _mm256_add_ps(_mm256_add_ps(x0, x1), _mm256_add_ps(x2, x3));
}

}  // namespace

bool available() {
  static const bool yes =
      __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && detail::cpu_has_f16c();
  return yes;
}

KVQ_AVX2 float dot_row_q4_0(const uint8_t* row, const float* x, size_t blocks) {
  __m256 acc = _mm256_setzero_ps();
  const __m256 minus8 = _mm256_set1_ps(-8.0f);
  for (size_t i = 0; i < blocks; ++i, x += QK) {
    const uint8_t* b = row + i * sizeof(BlockQ4_0);
    __m256 qx, sx;
    nibble_dot(b + offsetof(BlockQ4_0, qs), x, qx, sx);
    acc = _mm256_fmadd_ps(half_scale(b + offsetof(BlockQ4_0, d)), _mm256_fmadd_ps(minus8, sx, qx), acc);
  }
  return hsum(acc);
}

KVQ_AVX2 float dot_row_q4_1(const uint8_t* row, const float* x, size_t blocks) {
  __m256 acc = _mm256_setzero_ps();
  for (size_t i = 0; i < blocks; ++i, x += QK) {
    const uint8_t* b = row + i * sizeof(BlockQ4_1);
    __m256 qx, sx;
    nibble_dot(b + offsetof(BlockQ4_1, qs), x, qx, sx);
    acc = _mm256_fmadd_ps(half_scale(b + offsetof(BlockQ4_1, d)), qx, acc);
    acc = _mm256_fmadd_ps(half_scale(b + offsetof(BlockQ4_1, m)), sx, acc);
  }
  return hsum(acc);
}

KVQ_AVX2 float dot_row_q8_0(const uint8_t* row, const float* x, size_t blocks) {
  __m256 acc = _mm256_setzero_ps();
  for (size_t i = 0; i < blocks; ++i, x += QK) {
    const uint8_t* b = row + i * sizeof(BlockQ8_0);
    const __m128i q0 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + offsetof(BlockQ8_0, qs)));
    const __m128i q1 = _mm_loadu_si128(reinterpret_cast<const __m128i*>(b + offsetof(BlockQ8_0, qs) + 16));
    __m256 qx = _mm256_mul_ps(s8_floats<0>(q0), _mm256_loadu_ps(x));
    qx = _mm256_fmadd_ps(s8_floats<8>(q0), _mm256_loadu_ps(x + 8), qx);
    qx = _mm256_fmadd_ps(s8_floats<0>(q1), _mm256_loadu_ps(x + 16), qx);
    qx = _mm256_fmadd_ps(s8_floats<8>(q1), _mm256_loadu_ps(x + 24), qx);
    acc = _mm256_fmadd_ps(half_scale(b + offsetof(BlockQ8_0, d)), qx, acc);
  }
  return hsum(acc);
}

}  // namespace kvq::ggml::avx2

#else

namespace kvq::ggml::avx2 {
bool available() { return false; }
float dot_row_q4_0(const uint8_t*, const float*, size_t) { return 0; }
float dot_row_q4_1(const uint8_t*, const float*, size_t) { return 0; }
float dot_row_q8_0(const uint8_t*, const float*, size_t) { return 0; }
}  // namespace kvq::ggml::avx2

#endif

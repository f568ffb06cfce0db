// CPUs with AVX2 take ggml_dot_avx2.cpp for Q4_0, Q4_1 and Q8_0. The SSE2 path (every x86-64 CPU has it)
// converts 16 bytes at a time to floats in registers; other CPUs take a plain loop. Both compute sum_j q[j] x[j]
// and sum_j x[j] per block and apply the block's scale (and min) after.
#include "model/ggml_dot_kernels.hpp"

#include <cstddef>
#include <cstring>
#include <utility>

#include "core/half.hpp"
#include "kvq/detail/ggml_quants.hpp"
#include "model/ggml_dot_avx2.hpp"

#if defined(__SSE2__)
#include <emmintrin.h>
#endif

namespace kvq::ggml {
namespace {

float half_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return f16_to_f32(h);
}

// Bit 4 of element j is bit j of the little-endian uint32 at qh.
void add_high_bits(const uint8_t* qh, uint8_t* q) {
  uint32_t h;
  std::memcpy(&h, qh, 4);
  for (int j = 0; j < QK; ++j) q[j] = static_cast<uint8_t>(q[j] | (((h >> j) & 1u) << 4));
}

#if defined(__SSE2__)

using Bytes = __m128i;  // 16 quantized values
Bytes load_bytes(const uint8_t* p) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(p)); }
Bytes low_nibbles(Bytes b) { return _mm_and_si128(b, _mm_set1_epi8(0x0F)); }
Bytes high_nibbles(Bytes b) { return _mm_and_si128(_mm_srli_epi16(b, 4), _mm_set1_epi8(0x0F)); }

float hsum(__m128 v) {
  v = _mm_add_ps(v, _mm_movehl_ps(v, v));
  return _mm_cvtss_f32(_mm_add_ss(v, _mm_shuffle_ps(v, v, 1)));
}

// acc += q * x and sum += x over 16 values. Each byte is moved to the top of a 32-bit lane and shifted down:
// arithmetically for signed bytes, logically for unsigned ones.
template <bool kSigned>
[[gnu::always_inline]] inline void accumulate16(Bytes q, const float* x, __m128& acc, __m128& sum) {
  const __m128i z = _mm_setzero_si128();
  const __m128i lo = _mm_unpacklo_epi8(z, q), hi = _mm_unpackhi_epi8(z, q);
  const __m128i lanes[4] = {_mm_unpacklo_epi16(z, lo), _mm_unpackhi_epi16(z, lo), _mm_unpacklo_epi16(z, hi),
                            _mm_unpackhi_epi16(z, hi)};
  for (int k = 0; k < 4; ++k) {
    const __m128 qf = _mm_cvtepi32_ps(kSigned ? _mm_srai_epi32(lanes[k], 24) : _mm_srli_epi32(lanes[k], 24));
    const __m128 xv = _mm_loadu_ps(x + 4 * k);
    acc = _mm_add_ps(acc, _mm_mul_ps(qf, xv));
    sum = _mm_add_ps(sum, xv);
  }
}

// {sum_j q[j] x[j], sum_j x[j]} for the 32 values q0 (elements 0..15) and q1 (16..31).
template <bool kSigned>
[[gnu::always_inline]] inline std::pair<float, float> dot32(Bytes q0, Bytes q1, const float* x) {
  __m128 acc = _mm_setzero_ps(), sum = _mm_setzero_ps();
  accumulate16<kSigned>(q0, x, acc, sum);
  accumulate16<kSigned>(q1, x + 16, acc, sum);
  return {hsum(acc), hsum(sum)};
}

#else

template <bool kSigned>
std::pair<float, float> dot32_values(const uint8_t* q0, const uint8_t* q1, const float* x) {
  float a[4] = {}, s[4] = {};
  for (int j = 0; j < QK; ++j) {
    const uint8_t b = j < 16 ? q0[j] : q1[j - 16];
    a[j % 4] += (kSigned ? static_cast<float>(static_cast<int8_t>(b)) : static_cast<float>(b)) * x[j];
    s[j % 4] += x[j];
  }
  return {(a[0] + a[2]) + (a[1] + a[3]), (s[0] + s[2]) + (s[1] + s[3])};
}

#endif

// The 32 values of a 4-bit block, with bit 4 from qh where given, as q0 (elements 0..15) and q1 (16..31).
// x86: in registers when there is no qh; through a small buffer otherwise.
template <class F>
float with_nibbles(const uint8_t* qs, const uint8_t* qh, const float* x, F scale) {
  uint8_t q[QK];
  for (int j = 0; j < QK / 2; ++j) {
    q[j] = qs[j] & 0xF;
    q[j + QK / 2] = qs[j] >> 4;
  }
  if (qh) add_high_bits(qh, q);
#if defined(__SSE2__)
  const auto [qx, sx] = dot32<false>(load_bytes(q), load_bytes(q + 16), x);
#else
  const auto [qx, sx] = dot32_values<false>(q, q + 16, x);
#endif
  return scale(qx, sx);
}

}  // namespace

float dot_row_q4_0(const uint8_t* row, const float* x, size_t blocks) {
  if (avx2::available()) return avx2::dot_row_q4_0(row, x, blocks);
  float sum = 0;
  for (size_t i = 0; i < blocks; ++i, x += QK) {
    const uint8_t* b = row + i * sizeof(BlockQ4_0);
    const float d = half_at(b + offsetof(BlockQ4_0, d));
    const auto scale = [d](float qx, float sx) { return d * (qx - 8.0f * sx); };
#if defined(__SSE2__)
    const Bytes qs = load_bytes(b + offsetof(BlockQ4_0, qs));
    const auto [qx, sx] = dot32<false>(low_nibbles(qs), high_nibbles(qs), x);
    sum += scale(qx, sx);
#else
    sum += with_nibbles(b + offsetof(BlockQ4_0, qs), nullptr, x, scale);
#endif
  }
  return sum;
}

float dot_row_q4_1(const uint8_t* row, const float* x, size_t blocks) {
  if (avx2::available()) return avx2::dot_row_q4_1(row, x, blocks);
  float sum = 0;
  for (size_t i = 0; i < blocks; ++i, x += QK) {
    const uint8_t* b = row + i * sizeof(BlockQ4_1);
    const float d = half_at(b + offsetof(BlockQ4_1, d)), m = half_at(b + offsetof(BlockQ4_1, m));
    const auto scale = [d, m](float qx, float sx) { return d * qx + m * sx; };
#if defined(__SSE2__)
    const Bytes qs = load_bytes(b + offsetof(BlockQ4_1, qs));
    const auto [qx, sx] = dot32<false>(low_nibbles(qs), high_nibbles(qs), x);
    sum += scale(qx, sx);
#else
    sum += with_nibbles(b + offsetof(BlockQ4_1, qs), nullptr, x, scale);
#endif
  }
  return sum;
}

float dot_row_q5_0(const uint8_t* row, const float* x, size_t blocks) {
  float sum = 0;
  for (size_t i = 0; i < blocks; ++i, x += QK) {
    const uint8_t* b = row + i * sizeof(BlockQ5_0);
    const float d = half_at(b + offsetof(BlockQ5_0, d));
    sum += with_nibbles(b + offsetof(BlockQ5_0, qs), b + offsetof(BlockQ5_0, qh), x,
                        [d](float qx, float sx) { return d * (qx - 16.0f * sx); });
  }
  return sum;
}

float dot_row_q5_1(const uint8_t* row, const float* x, size_t blocks) {
  float sum = 0;
  for (size_t i = 0; i < blocks; ++i, x += QK) {
    const uint8_t* b = row + i * sizeof(BlockQ5_1);
    const float d = half_at(b + offsetof(BlockQ5_1, d)), m = half_at(b + offsetof(BlockQ5_1, m));
    sum += with_nibbles(b + offsetof(BlockQ5_1, qs), b + offsetof(BlockQ5_1, qh), x,
                        [d, m](float qx, float sx) { return d * qx + m * sx; });
  }
  return sum;
}

float dot_row_q8_0(const uint8_t* row, const float* x, size_t blocks) {
  if (avx2::available()) return avx2::dot_row_q8_0(row, x, blocks);
  float sum = 0;
  for (size_t i = 0; i < blocks; ++i, x += QK) {
    const uint8_t* b = row + i * sizeof(BlockQ8_0);
    const uint8_t* qs = b + offsetof(BlockQ8_0, qs);
#if defined(__SSE2__)
    const auto [qx, sx] = dot32<true>(load_bytes(qs), load_bytes(qs + 16), x);
#else
    const auto [qx, sx] = dot32_values<true>(qs, qs + 16, x);
#endif
    (void)sx;
    sum += half_at(b + offsetof(BlockQ8_0, d)) * qx;
  }
  return sum;
}

}  // namespace kvq::ggml

// The reference kernels of q8_dot.hpp: plain loops in the order of the block formats' definitions
// (include/kvq/detail/ggml_quants.hpp), one exact integer sum per block or sub-block.
#include <cstring>

#include "core/half.hpp"
#include "model/q8_dot.hpp"

namespace kvq::detail {
namespace {

using namespace ggml;

float half_at(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return f16_to_f32(h);
}

// sum_j q[j] c[j] over n codes.
template <class Q>
int int_dot(const Q* q, const int8_t* c, int n) {
  int sum = 0;
  for (int j = 0; j < n; ++j) sum += static_cast<int>(q[j]) * c[j];
  return sum;
}

// The 32 codes of a 4-bit block: low nibbles, then high nibbles.
void nibbles(const uint8_t* qs, uint8_t* q) {
  for (int j = 0; j < QK / 2; ++j) {
    q[j] = qs[j] & 0xF;
    q[j + QK / 2] = qs[j] >> 4;
  }
}

float dot_q4_0(const uint8_t* row, Q8Row x, size_t blocks) {
  float sum = 0;
  for (size_t b = 0; b < blocks; ++b) {
    const uint8_t* w = row + b * sizeof(BlockQ4_0);
    uint8_t q[QK];
    nibbles(w + offsetof(BlockQ4_0, qs), q);
    const int i = int_dot(q, x.codes + b * QK, QK);
    sum += half_at(w + offsetof(BlockQ4_0, d)) * (x.scales[b] * static_cast<float>(i) - 8.0f * x.sums[b]);
  }
  return sum;
}

float dot_q4_1(const uint8_t* row, Q8Row x, size_t blocks) {
  float sum = 0;
  for (size_t b = 0; b < blocks; ++b) {
    const uint8_t* w = row + b * sizeof(BlockQ4_1);
    uint8_t q[QK];
    nibbles(w + offsetof(BlockQ4_1, qs), q);
    const int i = int_dot(q, x.codes + b * QK, QK);
    sum += half_at(w + offsetof(BlockQ4_1, d)) * x.scales[b] * static_cast<float>(i) +
           half_at(w + offsetof(BlockQ4_1, m)) * x.sums[b];
  }
  return sum;
}

float dot_q8_0(const uint8_t* row, Q8Row x, size_t blocks) {
  float sum = 0;
  for (size_t b = 0; b < blocks; ++b) {
    const uint8_t* w = row + b * sizeof(BlockQ8_0);
    int8_t q[QK];
    std::memcpy(q, w + offsetof(BlockQ8_0, qs), QK);
    sum += half_at(w + offsetof(BlockQ8_0, d)) * x.scales[b] * static_cast<float>(int_dot(q, x.codes + b * QK, QK));
  }
  return sum;
}

float dot_q4_k(const uint8_t* row, Q8Row x, size_t blocks) {
  float sum = 0;
  for (size_t sb = 0; sb < blocks / 8; ++sb) {
    const uint8_t* w = row + sb * sizeof(BlockQ4_K);
    const float d = half_at(w + offsetof(BlockQ4_K, d)), dmin = half_at(w + offsetof(BlockQ4_K, dmin));
    const uint8_t* scales = w + offsetof(BlockQ4_K, scales);
    const uint8_t* qs = w + offsetof(BlockQ4_K, qs);
    for (int s = 0; s < 8; ++s) {  // sub-block s: nibbles of qs[32 (s / 2) ..], low for even s, high for odd
      const size_t b = sb * 8 + static_cast<size_t>(s);
      uint8_t q[QK];
      for (int l = 0; l < QK; ++l) q[l] = s % 2 ? qs[32 * (s / 2) + l] >> 4 : qs[32 * (s / 2) + l] & 0xF;
      uint8_t sc, m;
      scale_min_k4(s, scales, sc, m);
      sum += d * static_cast<float>(sc) * x.scales[b] * static_cast<float>(int_dot(q, x.codes + b * QK, QK)) -
             dmin * static_cast<float>(m) * x.sums[b];
    }
  }
  return sum;
}

float dot_q6_k(const uint8_t* row, Q8Row x, size_t blocks) {
  float sum = 0;
  for (size_t sb = 0; sb < blocks / 8; ++sb) {
    const uint8_t* w = row + sb * sizeof(BlockQ6_K);
    const float d = half_at(w + offsetof(BlockQ6_K, d));
    for (int half = 0; half < 2; ++half) {
      const uint8_t* ql = w + offsetof(BlockQ6_K, ql) + 64 * half;
      const uint8_t* qh = w + offsetof(BlockQ6_K, qh) + 32 * half;
      const auto* sc = reinterpret_cast<const int8_t*>(w + offsetof(BlockQ6_K, scales)) + 8 * half;
      for (int g = 0; g < 4; ++g) {  // elements 32 g .. 32 g + 31 of the half: one activation block
        int8_t q[QK];
        for (int l = 0; l < QK; ++l) {
          const int low = g % 2 ? ql[l + 32] : ql[l];
          const int code = (g < 2 ? low & 0xF : low >> 4) | ((qh[l] >> (2 * g)) & 3) << 4;
          q[l] = static_cast<int8_t>(code - 32);
        }
        const size_t b = sb * 8 + static_cast<size_t>(4 * half + g);
        const int8_t* c = x.codes + b * QK;
        const int i = sc[2 * g] * int_dot(q, c, 16) + sc[2 * g + 1] * int_dot(q + 16, c + 16, 16);
        sum += d * x.scales[b] * static_cast<float>(i);
      }
    }
  }
  return sum;
}

// The kernel of R rows: the single-row one R times.
template <float (*kDot)(const uint8_t*, Q8Row, size_t), int R>
void for_rows(const uint8_t* row, const Q8Row* x, size_t blocks, float* out) {
  for (int r = 0; r < R; ++r) out[r] = kDot(row, x[r], blocks);
}

template <float (*kDot)(const uint8_t*, Q8Row, size_t)>
constexpr Q8Kernels kernels() {
  return {for_rows<kDot, 1>, for_rows<kDot, kQ8Rows>};
}

}  // namespace

const Q8DotTable kQ8DotScalar = {kernels<dot_q4_0>(), kernels<dot_q4_1>(), kernels<dot_q8_0>(), kernels<dot_q4_k>(),
                                 kernels<dot_q6_k>()};

}  // namespace kvq::detail

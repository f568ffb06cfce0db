// The double-precision oracle: plain loops, no online softmax, no codec.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kvq/attention.hpp"

namespace kvq {

void reference_attention(const float* q, size_t n_q, const float* k, const float* v, size_t n_tokens, int d,
                         size_t first_visible, double scale, float* out, double* magnitude) {
  const size_t ud = static_cast<size_t>(d);
  std::vector<double> s(n_tokens), o(ud);
  for (size_t i = 0; i < n_q; ++i) {
    const size_t n = std::min(n_tokens, first_visible + i);
    const float* qi = q + i * ud;
    double mx = -INFINITY;
    for (size_t t = 0; t < n; ++t) {
      double dot = 0;
      for (size_t c = 0; c < ud; ++c) dot += static_cast<double>(qi[c]) * k[t * ud + c];
      s[t] = dot * scale;
      mx = std::max(mx, s[t]);
    }
    double sum = 0, size = 0;
    std::fill(o.begin(), o.end(), 0.0);
    for (size_t t = 0; t < n; ++t) {
      const double w = std::exp(s[t] - mx);
      double norm = 0;
      for (size_t c = 0; c < ud; ++c) {
        o[c] += w * v[t * ud + c];
        norm += static_cast<double>(v[t * ud + c]) * v[t * ud + c];
      }
      sum += w;
      size += w * std::sqrt(norm);
    }
    for (size_t c = 0; c < ud; ++c) out[i * ud + c] = n == 0 ? 0.f : static_cast<float>(o[c] / sum);
    if (magnitude) magnitude[i] = n == 0 ? 0 : size / sum;
  }
}

}  // namespace kvq

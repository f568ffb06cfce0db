#include <algorithm>
#include <cmath>

#include "attention/online_softmax.hpp"
#include "kvq/attention.hpp"

namespace kvq {

void AttnState::reset() {
  std::fill(o.begin(), o.end(), 0.f);
  m = -std::numeric_limits<float>::infinity();
  l = 0;
}

void AttnState::merge(const AttnState& other) {
  if (other.empty()) return;
  if (empty()) {
    std::copy(other.o.begin(), other.o.end(), o.begin());
    m = other.m;
    l = other.l;
    return;
  }
  const float mx = std::max(m, other.m);
  const float a = std::exp(m - mx), b = std::exp(other.m - mx);
  for (size_t j = 0; j < o.size(); ++j) o[j] = a * o[j] + b * other.o[j];
  l = a * l + b * other.l;
  m = mx;
}

void AttnState::normalize() {
  const float inv = empty() ? 0.f : 1.f / l;
  for (float& x : o) x *= inv;
}

namespace detail {

void online_softmax_block(float* s, size_t stride, int n_q, int n, AttnState* states) {
  if (n <= 0) return;
  for (int i = 0; i < n_q; ++i) {
    float* row = s + static_cast<size_t>(i) * stride;
    AttnState& st = states[i];
    const float block_max = *std::max_element(row, row + n);
    if (block_max == -std::numeric_limits<float>::infinity()) {  // every token masked: nothing changes
      std::fill(row, row + n, 0.f);
      continue;
    }
    const float mx = std::max(st.m, block_max);
    if (!st.empty() && mx > st.m) {
      const float alpha = std::exp(st.m - mx);
      for (float& x : st.o) x *= alpha;
      st.l *= alpha;
    }
    float sum = 0;
    for (int t = 0; t < n; ++t) {
      row[t] = std::exp(row[t] - mx);
      sum += row[t];
    }
    st.l += sum;
    st.m = mx;
  }
}

}  // namespace detail
}  // namespace kvq

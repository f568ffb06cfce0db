#include "core/finite.hpp"

#include <cmath>

namespace kvq {

size_t first_non_finite(const float* x, size_t n) {
  size_t i = 0;
  while (i < n && std::isfinite(x[i])) ++i;
  return i;
}

}  // namespace kvq

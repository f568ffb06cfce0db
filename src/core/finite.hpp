// A scan for NaN and Inf, in the core layer: the fuzz build traces the comparisons of the cache layer (it parses
// files), and there the scan's per-element bounds checks were traced too (src/CMakeLists.txt).
#pragma once

#include <cstddef>

namespace kvq {

/// The index of the first NaN or Inf of x[0, n), or n when all are finite.
size_t first_non_finite(const float* x, size_t n);

}  // namespace kvq

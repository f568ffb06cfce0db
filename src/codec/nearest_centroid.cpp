#include "codec/nearest_centroid.hpp"

#include <cstring>
#include <limits>

#include "kvq/error.hpp"

namespace kvq {
namespace {

// Centroids are scanned in tiles of kLanes: every lane keeps its own running minimum (independent compares in
// vector registers), and the lanes are merged once per point. The 16-lane GCC/Clang vector type compiles to four
// SSE2 (or NEON) registers, two AVX2 or one AVX-512 register; on x86-64 Linux (glibc ifuncs) the compiler builds
// one clone per level and the loader picks the best the CPU has. Every level does the same float operations in the
// same order (this file is built with -ffp-contract=off, src/CMakeLists.txt: GCC fused the product into the sum in
// the avx512f clone otherwise), so every level returns the same indices.
constexpr int kLanes = 16;
using f32xL = float __attribute__((vector_size(4 * kLanes)));
using i32xL = int32_t __attribute__((vector_size(4 * kLanes)));

#if defined(__x86_64__) && defined(__linux__) && defined(__GLIBC__)
#define KVQ_SEARCH_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define KVQ_SEARCH_CLONES
#endif

// S > 0: the dimension as a compile-time constant (the codec's s = 4 and 8); S = 0: `dim` at run time.
// Always inlined into search_clones, so that each clone compiles it for its own instruction set.
template <int S>
[[gnu::always_inline]] inline void search(const float* coords, const float* norms, int k_padded, int dim,
                                          const float* x, size_t n, uint32_t* idx) {
  const int s = S > 0 ? S : dim;
  i32xL lane;
  for (int l = 0; l < kLanes; ++l) lane[l] = l;
  for (size_t p = 0; p < n; ++p) {
    const float* xp = x + p * static_cast<size_t>(s);
    f32xL minus_2x[CentroidTable::kMaxDim];
    for (int i = 0; i < s; ++i) minus_2x[i] = f32xL{} + (-2.0f * xp[i]);
    f32xL best = f32xL{} + std::numeric_limits<float>::infinity();
    i32xL arg = i32xL{}, at = lane;
    for (int base = 0; base < k_padded; base += kLanes) {
      f32xL value;
      std::memcpy(&value, norms + base, sizeof value);
      for (int i = 0; i < s; ++i) {
        f32xL c;
        std::memcpy(&c, coords + static_cast<size_t>(i) * k_padded + base, sizeof c);
        const f32xL product = minus_2x[i] * c;
        value += product;
      }
      // Strictly smaller only: within a lane the earliest (lowest) index of a tie stays.
      const i32xL smaller = value < best;
      best = smaller ? value : best;
      arg = smaller ? at : arg;
      at += kLanes;
    }
    float b = best[0];
    int32_t a = arg[0];
    for (int l = 1; l < kLanes; ++l)
      if (best[l] < b || (best[l] == b && arg[l] < a)) b = best[l], a = arg[l];
    idx[p] = static_cast<uint32_t>(a);
  }
}

KVQ_SEARCH_CLONES void search_clones(const float* coords, const float* norms, int k_padded, int dim, const float* x,
                                     size_t n, uint32_t* idx) {
  switch (dim) {
    case 4: return search<4>(coords, norms, k_padded, dim, x, n, idx);
    case 8: return search<8>(coords, norms, k_padded, dim, x, n, idx);
    default: return search<0>(coords, norms, k_padded, dim, x, n, idx);
  }
}

}  // namespace

CentroidTable::CentroidTable(const float* centroids, int k, int dim)
    : k_(k), dim_(dim), k_padded_((k + kLanes - 1) / kLanes * kLanes) {
  KVQ_CHECK(k >= 1, "centroid table: need at least one centroid, got ", k);
  KVQ_CHECK(dim >= 1 && dim <= kMaxDim, "centroid table: dimension ", dim, " not in [1, ", kMaxDim, "]");
  KVQ_CHECK(centroids != nullptr, "centroid table: null centroids");
  coords_.assign(static_cast<size_t>(dim) * k_padded_, 0.0f);
  norms_.assign(k_padded_, std::numeric_limits<float>::infinity());
  for (int j = 0; j < k; ++j) {
    float norm = 0;
    for (int i = 0; i < dim; ++i) {
      const float c = centroids[static_cast<size_t>(j) * dim + i];
      coords_[static_cast<size_t>(i) * k_padded_ + j] = c;
      norm += c * c;
    }
    norms_[j] = norm;
  }
}

void CentroidTable::nearest(const float* x, size_t n, uint32_t* idx) const {
  search_clones(coords_.data(), norms_.data(), k_padded_, dim_, x, n, idx);
}

}  // namespace kvq

#include "codec/qjl_sketch.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numbers>

#include "kvq/detail/random.hpp"
#include "kvq/error.hpp"

namespace kvq {
namespace {

// Two doubles per vector (the GCC and clang vector extensions), loaded from any address.
using Double2 = double __attribute__((vector_size(16), aligned(8)));
using Float4 = float __attribute__((vector_size(16), aligned(4)));

// x[0, 4) as two pairs of doubles.
void load_pairs(const double* x, Double2& lo, Double2& hi) {
  std::memcpy(&lo, x, sizeof lo);
  std::memcpy(&hi, x + 2, sizeof hi);
}
void load_pairs(const float* x, Double2& lo, Double2& hi) {
  Float4 v;
  std::memcpy(&v, x, sizeof v);
  lo = Double2{v[0], v[1]};
  hi = Double2{v[2], v[3]};
}

// sum_j s_j x_j in double with four independent partial sums (of the j of each residue mod 4), so that the
// additions pipeline instead of waiting on each other (a fixed order: the result is the same on every call); n a
// multiple of 4. The four sums as two vectors of two: the products and additions of four scalars, in half the
// instructions and a third of the loads a sanitized build checks.
template <class T>
double dot_f64(const float* s, const T* x, int n) {
  Double2 a01 = {0, 0}, a23 = {0, 0};
  for (int j = 0; j < n; j += 4) {
    Double2 s01, s23, x01, x23;
    load_pairs(s + j, s01, s23);
    load_pairs(x + j, x01, x23);
    a01 += s01 * x01;
    a23 += s23 * x23;
  }
  return (a01[0] + a01[1]) + (a23[0] + a23[1]);
}

}  // namespace

QjlSketch::QjlSketch(int rows, int dim, uint64_t seed)
    : rows_(rows),
      dim_(dim),
      scale_(static_cast<float>(std::sqrt(std::numbers::pi / 2) / rows)),
      s_(static_cast<size_t>(rows) * dim) {
  KVQ_CHECK(dim > 0 && dim % 8 == 0, "QjlSketch: dimension ", dim, " is not a positive multiple of 8");
  Rng rng(seed);
  for (float& v : s_) v = static_cast<float>(rng.normal());
}

void QjlSketch::apply(const float* x, float* y, size_t n) const {
  for (size_t r = 0; r < n; ++r) {
    const float* xr = x + r * dim_;
    for (int i = 0; i < rows_; ++i)
      y[r * rows_ + i] = static_cast<float>(dot_f64(s_.data() + static_cast<size_t>(i) * dim_, xr, dim_));
  }
}

void QjlSketch::apply_transpose(const float* y, float* x, size_t n) const {
  // Eight coordinates at a time, each summed over i = 0, 1, ... in a register: the order of a sum over a column
  // kept in memory, at a third of the loads and stores (which dominate under the sanitizers).
  for (size_t r = 0; r < n; ++r) {
    const float* yr = y + r * rows_;
    float* xr = x + r * dim_;
    for (int j = 0; j < dim_; j += 8) {
      double a0 = 0, a1 = 0, a2 = 0, a3 = 0, a4 = 0, a5 = 0, a6 = 0, a7 = 0;
      const float* si = s_.data() + j;
      for (int i = 0; i < rows_; ++i, si += dim_) {
        const double yi = yr[i];
        a0 += yi * si[0];
        a1 += yi * si[1];
        a2 += yi * si[2];
        a3 += yi * si[3];
        a4 += yi * si[4];
        a5 += yi * si[5];
        a6 += yi * si[6];
        a7 += yi * si[7];
      }
      const double a[8] = {a0, a1, a2, a3, a4, a5, a6, a7};
      for (int k = 0; k < 8; ++k) xr[j + k] = static_cast<float>(a[k]);
    }
  }
}

void QjlSketch::sign_bits(const double* x, uint8_t* bits) const {
  std::memset(bits, 0, static_cast<size_t>(rows_) / 8);
  for (int i = 0; i < rows_; ++i)
    if (dot_f64(s_.data() + static_cast<size_t>(i) * dim_, x, dim_) >= 0)
      bits[i >> 3] |= static_cast<uint8_t>(1u << (i & 7));
}

}  // namespace kvq

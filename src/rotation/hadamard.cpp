// Randomized Hadamard rotation R = H diag(s) / sqrt(d), with H the Sylvester Hadamard matrix (symmetric), so
// R^-1 = R^T = diag(s) H / sqrt(d). Applied with the in-place fast Walsh-Hadamard transform, O(d log d).
#include <cmath>
#include <vector>

#include "kvq/detail/random.hpp"
#include "kvq/error.hpp"
#include "rotation/rotations.hpp"

namespace kvq {
namespace {

void fwht(float* v, int d) {
  for (int h = 1; h < d; h <<= 1)
    for (int i = 0; i < d; i += 2 * h)
      for (int j = i; j < i + h; ++j) {
        const float a = v[j], b = v[j + h];
        v[j] = a + b;
        v[j + h] = a - b;
      }
}

class Hadamard final : public Rotation {
 public:
  Hadamard(int dim, uint64_t seed) : Rotation(dim), signs_(dim), scale_(1.0f / std::sqrt(static_cast<float>(dim))) {
    Rng rng(seed);
    for (auto& s : signs_) s = rng.sign();
  }
  RotationKind kind() const override { return RotationKind::hadamard; }
  std::string spec() const override { return "hadamard"; }

  void apply(const float* x, float* y, size_t n) const override {
    const int d = dim();
    for (size_t r = 0; r < n; ++r) {
      const float* xr = x + r * d;
      float* yr = y + r * d;
      for (int j = 0; j < d; ++j) yr[j] = xr[j] * signs_[j];
      fwht(yr, d);
      for (int j = 0; j < d; ++j) yr[j] *= scale_;
    }
  }
  void apply_inverse(const float* x, float* y, size_t n) const override {
    const int d = dim();
    for (size_t r = 0; r < n; ++r) {
      const float* xr = x + r * d;
      float* yr = y + r * d;
      if (yr != xr)
        for (int j = 0; j < d; ++j) yr[j] = xr[j];
      fwht(yr, d);
      for (int j = 0; j < d; ++j) yr[j] *= scale_ * signs_[j];
    }
  }

 private:
  std::vector<float> signs_;
  float scale_;
};

}  // namespace

std::unique_ptr<Rotation> make_hadamard_rotation(int dim, uint64_t seed) {
  KVQ_CHECK(dim > 0 && (dim & (dim - 1)) == 0, "hadamard rotation needs a power-of-two dimension, got ", dim,
            " (use srft for other even dimensions)");
  return std::make_unique<Hadamard>(dim, seed);
}

}  // namespace kvq

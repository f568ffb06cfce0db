// SRFT rotation for any even d: y = P F diag(s) x, with s random signs from the seed, F the unitary DFT of size d
// (Y_k = d^{-1/2} sum_j u_j e^{-2 pi i jk/d}) and P the orthogonal packing of the Hermitian spectrum into d reals:
//   y = [Re Y_0, Re Y_{d/2}, sqrt2 Re Y_1, sqrt2 Im Y_1, sqrt2 Re Y_2, sqrt2 Im Y_2, ..., sqrt2 Re Y_{d/2-1},
//        sqrt2 Im Y_{d/2-1}].
// Y_0 and Y_{d/2} are real and Y_{d-k} = conj Y_k, so |y| = |Y| = |x|. This is RealFft's packed order scaled
// by 1/sqrt(d) (first two entries) and sqrt(2/d) (the rest); R^-1 = R^T undoes the scaling and runs the inverse
// real FFT. O(d log d) per vector when d/2 factors into 2, 3, 5 (an odd prime factor p costs O(p) per value).
#include <cmath>
#include <vector>

#include "kvq/detail/random.hpp"
#include "kvq/error.hpp"
#include "rotation/fft.hpp"
#include "rotation/rotations.hpp"

namespace kvq {
namespace {

class Srft final : public Rotation {
 public:
  Srft(int dim, uint64_t seed) : Rotation(dim), fft_(dim), signs_(dim), out_scale_(dim), in_scale_(dim) {
    Rng rng(seed);
    for (auto& s : signs_) s = rng.sign();
    const double d = dim;
    for (int j = 0; j < dim; ++j) {
      const double scale = j < 2 ? 1.0 / std::sqrt(d) : std::sqrt(2.0 / d);
      out_scale_[j] = static_cast<float>(scale);
      in_scale_[j] = static_cast<float>(1.0 / scale);
    }
  }
  RotationKind kind() const override { return RotationKind::srft; }
  std::string spec() const override { return "srft"; }

  void apply(const float* x, float* y, size_t n) const override {
    const int d = dim();
    for (size_t r = 0; r < n; ++r) {
      const float* xr = x + r * d;
      float* yr = y + r * d;
      for (int j = 0; j < d; ++j) yr[j] = xr[j] * signs_[j];
      fft_.forward(yr, yr);
      for (int j = 0; j < d; ++j) yr[j] *= out_scale_[j];
    }
  }
  void apply_inverse(const float* x, float* y, size_t n) const override {
    const int d = dim();
    for (size_t r = 0; r < n; ++r) {
      const float* xr = x + r * d;
      float* yr = y + r * d;
      for (int j = 0; j < d; ++j) yr[j] = xr[j] * in_scale_[j];
      fft_.inverse(yr, yr);
      for (int j = 0; j < d; ++j) yr[j] *= signs_[j];
    }
  }

 private:
  fft::RealFft fft_;
  std::vector<float> signs_;
  std::vector<float> out_scale_;  ///< unnormalized packed spectrum -> orthogonal packing
  std::vector<float> in_scale_;   ///< 1 / out_scale_
};

}  // namespace

std::unique_ptr<Rotation> make_srft_rotation(int dim, uint64_t seed) {
  KVQ_CHECK(dim >= 2 && dim % 2 == 0, "srft rotation needs an even dimension, got ", dim,
            " (use haar or householder for odd dimensions)");
  return std::make_unique<Srft>(dim, seed);
}

}  // namespace kvq

#include <cstring>

#include "rotation/rotations.hpp"

namespace kvq {
namespace {

class Identity final : public Rotation {
 public:
  explicit Identity(int dim) : Rotation(dim) {}
  RotationKind kind() const override { return RotationKind::identity; }
  std::string spec() const override { return "identity"; }
  void apply(const float* x, float* y, size_t n) const override { copy(x, y, n); }
  void apply_inverse(const float* x, float* y, size_t n) const override { copy(x, y, n); }

 private:
  void copy(const float* x, float* y, size_t n) const {
    if (x != y) std::memcpy(y, x, n * static_cast<size_t>(dim()) * sizeof(float));
  }
};

}  // namespace

std::unique_ptr<Rotation> make_identity_rotation(int dim) { return std::make_unique<Identity>(dim); }

}  // namespace kvq

// R = B2 B1: one rotation after another (a learned rotation on top of a codec's base rotation, the SRFT paper's
// "learned R with the fixed random rotation underneath"). Its kind is the second's, so that nothing takes it for
// the base alone (the device encoders' Hadamard path checks the kind).
#include <memory>
#include <string>
#include <utility>

#include "kvq/error.hpp"
#include "rotation/rotations.hpp"

namespace kvq {
namespace {

class Composed final : public Rotation {
 public:
  Composed(std::unique_ptr<Rotation> first, std::unique_ptr<Rotation> then)
      : Rotation(first->dim()), first_(std::move(first)), then_(std::move(then)) {}
  RotationKind kind() const override { return then_->kind(); }
  // Not recreatable by make_rotation when the second is learned; it names both parts.
  std::string spec() const override { return first_->spec() + "+" + then_->spec(); }

  void apply(const float* x, float* y, size_t n) const override {
    first_->apply(x, y, n);
    then_->apply(y, y, n);
  }
  void apply_inverse(const float* x, float* y, size_t n) const override {
    then_->apply_inverse(x, y, n);
    first_->apply_inverse(y, y, n);
  }

 private:
  std::unique_ptr<Rotation> first_, then_;
};

}  // namespace

std::unique_ptr<Rotation> make_composed_rotation(std::unique_ptr<Rotation> first, std::unique_ptr<Rotation> then) {
  KVQ_CHECK(first && then && first->dim() == then->dim(), "composed rotation: two rotations of one dimension needed");
  return std::make_unique<Composed>(std::move(first), std::move(then));
}

}  // namespace kvq

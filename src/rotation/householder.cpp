// Householder rotation R = H_k ... H_1 with H_i = I - 2 u_i u_i^T (u_i = v_i / |v_i|): k random Gaussian reflectors
// from the seed, or given (learned) ones. apply runs H_1 first; every H_i is symmetric, so R^T = H_1 ... H_k runs
// them in reverse order. O(k d) per vector.
#include <algorithm>
#include <cmath>
#include <string>
#include <utility>
#include <vector>

#include "kvq/detail/random.hpp"
#include "kvq/error.hpp"
#include "rotation/rotations.hpp"

namespace kvq {
namespace {

/// Eight partial sums, so the compiler vectorizes the loop without reassociating a single sum.
float dot(const float* a, const float* b, int d) {
  float part[8] = {};
  int i = 0;
  for (; i + 8 <= d; i += 8)
    for (int t = 0; t < 8; ++t) part[t] += a[i + t] * b[i + t];
  float sum = 0;
  for (; i < d; ++i) sum += a[i] * b[i];
  for (float p : part) sum += p;
  return sum;
}

class Householder final : public Rotation {
 public:
  /// `units` holds the k unit reflector vectors u_1 .. u_k, k x dim row-major.
  Householder(int dim, std::vector<float> units)
      : Rotation(dim), k_(static_cast<int>(units.size() / static_cast<size_t>(dim))), units_(std::move(units)) {}
  RotationKind kind() const override { return RotationKind::householder; }
  // Learned reflectors give the same spec as random ones: they cannot be recreated from the spec alone.
  std::string spec() const override { return "householder:" + std::to_string(k_); }

  void apply(const float* x, float* y, size_t n) const override {
    for (size_t r = 0; r < n; ++r) {
      float* yr = copy_row(x, y, r);
      for (int i = 0; i < k_; ++i) reflect(i, yr);
    }
  }
  void apply_inverse(const float* x, float* y, size_t n) const override {
    for (size_t r = 0; r < n; ++r) {
      float* yr = copy_row(x, y, r);
      for (int i = k_ - 1; i >= 0; --i) reflect(i, yr);
    }
  }

 private:
  float* copy_row(const float* x, float* y, size_t r) const {
    const size_t d = static_cast<size_t>(dim());
    float* yr = y + r * d;
    if (yr != x + r * d) std::copy_n(x + r * d, d, yr);
    return yr;
  }
  /// v <- H_i v = v - 2 (u_i . v) u_i.
  void reflect(int i, float* v) const {
    const int d = dim();
    const float* u = units_.data() + static_cast<size_t>(i) * d;
    const float c = 2.0f * dot(u, v, d);
    for (int t = 0; t < d; ++t) v[t] -= c * u[t];
  }

  int k_;
  std::vector<float> units_;
};

/// Appends v / |v| (normalized in double) to units; `what` names the vector in the error message.
void append_unit(std::vector<float>& units, const float* v, int d, const std::string& what) {
  double norm2 = 0;
  for (int t = 0; t < d; ++t) norm2 += static_cast<double>(v[t]) * v[t];
  KVQ_CHECK(std::isfinite(norm2), "householder rotation: ", what, " has a non-finite entry or norm");
  KVQ_CHECK(norm2 > 0, "householder rotation: ", what, " is the zero vector (a reflector needs a non-zero vector)");
  const double inv = 1.0 / std::sqrt(norm2);
  for (int t = 0; t < d; ++t) units.push_back(static_cast<float>(v[t] * inv));
}

}  // namespace

std::unique_ptr<Rotation> make_householder_rotation(int dim, int k, uint64_t seed) {
  KVQ_CHECK(k >= 1 && k <= dim, "householder rotation: reflector count ", k, " out of range [1, ", dim,
            "] for dimension ", dim);
  Rng rng(seed);
  std::vector<float> v(static_cast<size_t>(dim)), units;
  units.reserve(static_cast<size_t>(k) * dim);
  for (int i = 0; i < k; ++i) {
    for (auto& e : v) e = static_cast<float>(rng.normal());
    append_unit(units, v.data(), dim, "random reflector " + std::to_string(i));
  }
  return std::make_unique<Householder>(dim, std::move(units));
}

std::unique_ptr<Rotation> make_householder(int dim, std::span<const std::vector<float>> reflectors) {
  KVQ_CHECK(dim >= 1 && dim <= 4096, "householder rotation: dimension ", dim, " out of range [1, 4096]");
  const size_t k = reflectors.size();
  KVQ_CHECK(k >= 1 && k <= static_cast<size_t>(dim), "householder rotation: ", k,
            " reflectors given, expected between 1 and the dimension ", dim);
  std::vector<float> units;
  units.reserve(k * static_cast<size_t>(dim));
  for (size_t i = 0; i < k; ++i) {
    KVQ_CHECK(reflectors[i].size() == static_cast<size_t>(dim), "householder rotation: reflector ", i, " has ",
              reflectors[i].size(), " entries, expected the dimension ", dim);
    append_unit(units, reflectors[i].data(), dim, "reflector " + std::to_string(i));
  }
  return std::make_unique<Householder>(dim, std::move(units));
}

}  // namespace kvq

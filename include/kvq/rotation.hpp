// Orthogonal maps R on R^d. Attention never un-rotates keys, since q.k = (Rq).(Rk); values are summed in the
// rotated space and un-rotated once per query. Every rotation is deterministic from (kind, d, seed).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace kvq {

enum class RotationKind { identity, hadamard, srft, householder, haar };

class Rotation {
 public:
  virtual ~Rotation() = default;

  int dim() const { return dim_; }
  virtual RotationKind kind() const = 0;
  /// The spec that recreates this rotation with make_rotation (e.g. "householder:64").
  virtual std::string spec() const = 0;

  /// y = R x for n row vectors: x and y are n x dim, row-major; y may equal x (in place).
  virtual void apply(const float* x, float* y, size_t n) const = 0;
  /// y = R^T x (= R^-1 x) for n row vectors; in place allowed.
  virtual void apply_inverse(const float* x, float* y, size_t n) const = 0;

  /// The dense dim x dim matrix of R (row-major), for tests, GPU upload and small-d fast paths.
  std::vector<float> matrix() const;

 protected:
  explicit Rotation(int dim) : dim_(dim) {}

 private:
  int dim_;
};

/// Builds a rotation from a spec:
///   "identity" | "hadamard" (d a power of two) | "srft" (any even d) | "haar" (any d) |
///   "householder" (k = d/2 random reflectors) | "householder:K" (K reflectors, 1 <= K <= d).
/// Throws kvq::Error naming the problem for an unknown spec or an unsupported d.
///
/// srft: y = P F diag(s) x with s random signs, F the unitary DFT (Y_k = d^{-1/2} sum_j u_j e^{-2 pi i jk/d}) and
/// P the orthogonal packing of the Hermitian half of Y into d reals, in this order:
///   [Re Y_0, Re Y_{d/2}, sqrt2 Re Y_1, sqrt2 Im Y_1, sqrt2 Re Y_2, sqrt2 Im Y_2, ..., sqrt2 Re Y_{d/2-1},
///    sqrt2 Im Y_{d/2-1}].
/// O(d log d) through a real FFT; a prime factor p of d/2 above 5 costs O(p) per value instead of O(log p).
/// haar: Q of the QR of a d x d Gaussian matrix with positive diag(R) (Haar distributed); dense, O(d^2) per vector.
/// householder: R = H_K ... H_1 with H_i = I - 2 v_i v_i^T / |v_i|^2 and Gaussian v_i; O(K d) per vector.
std::unique_ptr<Rotation> make_rotation(std::string_view spec, int dim, uint64_t seed);

/// Householder rotation from given (learned) reflector vectors, each of size `dim`, finite and non-zero, with
/// 1 <= k <= dim of them: R = H_k ... H_1 with H_i = I - 2 v_i v_i^T / |v_i|^2 (apply runs H_1 first).
/// Its spec() is "householder:k" like a random one: learned reflectors cannot be recreated from the spec alone.
std::unique_ptr<Rotation> make_householder(int dim, std::span<const std::vector<float>> reflectors);

}  // namespace kvq

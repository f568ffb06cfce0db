// Haar-random orthogonal rotation: Q of the QR factorization of a d x d standard Gaussian matrix, with the sign
// fix Q <- Q diag(sign(diag R)) that makes Q exactly Haar distributed. The reference rotation: O(d^2) per vector
// and O(d^3) to build, any d >= 1.
#include <algorithm>
#include <cmath>
#include <vector>

#include "kvq/detail/random.hpp"
#include "rotation/rotations.hpp"

namespace kvq {
namespace {

/// Q (d x d, row-major) from the QR of a Gaussian matrix, by modified Gram-Schmidt run twice per column in double
/// ("twice is enough" for orthogonality to rounding). Gram-Schmidt makes R_jj = |residual| > 0, so the sign fix
/// is built in: Q is the unique QR factor with a positive diagonal.
std::vector<double> haar_q(int d, uint64_t seed) {
  const size_t n = static_cast<size_t>(d);
  std::vector<double> cols(n * n);  // column j of the Gaussian matrix at [j * d, (j + 1) * d)
  Rng rng(seed);
  for (auto& v : cols) v = rng.normal();
  for (size_t j = 0; j < n; ++j) {
    double* v = &cols[j * n];
    for (int pass = 0; pass < 2; ++pass)
      for (size_t i = 0; i < j; ++i) {
        const double* q = &cols[i * n];
        double c = 0;
        for (size_t t = 0; t < n; ++t) c += q[t] * v[t];
        for (size_t t = 0; t < n; ++t) v[t] -= c * q[t];
      }
    double norm = 0;
    for (size_t t = 0; t < n; ++t) norm += v[t] * v[t];
    norm = std::sqrt(norm);
    for (size_t t = 0; t < n; ++t) v[t] /= norm;
  }
  std::vector<double> q(n * n);
  for (size_t i = 0; i < n; ++i)
    for (size_t j = 0; j < n; ++j) q[i * n + j] = cols[j * n + i];
  return q;
}

/// y_r = sum_j x_r[j] * m_j for n rows, with m_j the rows of the d x d matrix m (an axpy per matrix row, which
/// vectorizes without reassociating sums). Rows go four at a time so each matrix row is loaded once per four;
/// each output row sees the same operations in the same order whatever n is. y may equal x.
void rows_times_matrix(const float* m, int d, const float* x, float* y, size_t n) {
  constexpr size_t kRows = 4;
  const size_t dd = static_cast<size_t>(d);
  thread_local std::vector<float> acc;
  if (acc.size() < kRows * dd) acc.resize(kRows * dd);
  for (size_t r0 = 0; r0 < n; r0 += kRows) {
    const size_t rows = std::min(kRows, n - r0);
    std::fill_n(acc.begin(), rows * dd, 0.0f);
    for (size_t j = 0; j < dd; ++j) {
      const float* mj = m + j * dd;
      for (size_t r = 0; r < rows; ++r) {
        const float c = x[(r0 + r) * dd + j];
        float* a = acc.data() + r * dd;
        for (size_t i = 0; i < dd; ++i) a[i] += c * mj[i];
      }
    }
    std::copy_n(acc.begin(), rows * dd, y + r0 * dd);
  }
}

class Haar final : public Rotation {
 public:
  Haar(int dim, uint64_t seed) : Rotation(dim) {
    const size_t n = static_cast<size_t>(dim);
    const std::vector<double> q = haar_q(dim, seed);
    q_.resize(n * n);
    qt_.resize(n * n);
    for (size_t i = 0; i < n; ++i)
      for (size_t j = 0; j < n; ++j) {
        q_[i * n + j] = static_cast<float>(q[i * n + j]);
        qt_[j * n + i] = q_[i * n + j];
      }
  }
  RotationKind kind() const override { return RotationKind::haar; }
  std::string spec() const override { return "haar"; }

  // R x = sum_j x_j (column j of Q) = sum_j x_j (row j of Q^T);  R^T y = sum_i y_i (row i of Q).
  void apply(const float* x, float* y, size_t n) const override { rows_times_matrix(qt_.data(), dim(), x, y, n); }
  void apply_inverse(const float* x, float* y, size_t n) const override {
    rows_times_matrix(q_.data(), dim(), x, y, n);
  }

 private:
  std::vector<float> q_;   ///< Q, d x d row-major
  std::vector<float> qt_;  ///< Q^T, d x d row-major
};

}  // namespace

std::unique_ptr<Rotation> make_haar_rotation(int dim, uint64_t seed) { return std::make_unique<Haar>(dim, seed); }

}  // namespace kvq

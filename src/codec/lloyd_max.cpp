// Lloyd–Max on the sphere-coordinate density, in double.
//
// Integrals: the moments int x^p f(x) dx (p = 0, 1, 2) over [0, L] are tabulated on a uniform grid of panels, each
// integrated with 16-point Gauss–Legendre (f is smooth and at most ~0.02 standard deviations wide per panel, so
// each panel is exact to rounding); a moment over any [a, b] is the table's sum over whole panels plus
// Gauss–Legendre on the two partial panels. L = min(1, 20 / sqrt(d)): beyond 20 standard deviations f is below
// e^-160 of its peak.
//
// Solver: the codebooks are symmetric, so only the 2^(b-1) positive centroids are unknowns (boundary 0 fixed in
// the middle). Newton's method on F(c) = c - mu(c), where mu_i is the conditional mean of cell i; the Jacobian is
// tridiagonal (cell i moves with its two boundaries, each the midpoint of two centroids). A Newton step that does
// not lower max |F| is replaced by a plain Lloyd step (c = mu), which always lowers the distortion.
#include "codec/lloyd_max.hpp"

#include <array>
#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <numbers>
#include <tuple>

#include "kvq/error.hpp"

namespace kvq {
namespace {

/// int g, int x g, int x^2 g over an interval.
struct Moments {
  double m0 = 0, m1 = 0, m2 = 0;
  Moments& operator+=(const Moments& o) {
    m0 += o.m0, m1 += o.m1, m2 += o.m2;
    return *this;
  }
  Moments operator-(const Moments& o) const { return {m0 - o.m0, m1 - o.m1, m2 - o.m2}; }
  Moments scaled(double s) const { return {m0 * s, m1 * s, m2 * s}; }
  /// The moments of x -> -x (mirror image of the interval).
  Moments mirrored() const { return {m0, -m1, m2}; }
  /// The moments of x - c.
  Moments about(double c) const { return {m0, m1 - c * m0, m2 - 2 * c * m1 + c * c * m0}; }
};

constexpr int kGaussPoints = 16;
constexpr int kPanels = 1024;

/// Gauss–Legendre nodes and weights on [-1, 1], by Newton's method on the Legendre polynomial P_n.
struct GaussLegendre {
  std::array<double, kGaussPoints> x{}, w{};
  GaussLegendre() {
    constexpr int n = kGaussPoints;
    for (int i = 0; i < n; ++i) {
      double z = std::cos(std::numbers::pi * (i + 0.75) / (n + 0.5)), dp = 1;
      for (int it = 0; it < 100; ++it) {
        double p0 = 1, p1 = z;
        for (int k = 2; k <= n; ++k) {
          const double p2 = ((2 * k - 1) * z * p1 - (k - 1) * p0) / k;
          p0 = p1;
          p1 = p2;
        }
        dp = n * (z * p1 - p0) / (z * z - 1);
        const double step = p1 / dp;
        z -= step;
        if (std::abs(step) < 1e-16) break;
      }
      x[i] = z;
      w[i] = 2 / ((1 - z * z) * dp * dp);
    }
  }
};

const GaussLegendre& gauss_legendre() {
  static const GaussLegendre rule;
  return rule;
}

/// The density of one coordinate of a uniform random unit vector in R^d, normalized to mass 1.
class SphereCoordinate {
 public:
  explicit SphereCoordinate(int d)
      : exponent_((d - 3) / 2.0),
        support_(std::min(1.0, 20.0 / std::sqrt(static_cast<double>(d)))),
        panel_(support_ / kPanels),
        tail_(kPanels + 1) {
    for (int p = kPanels - 1; p >= 0; --p) {
      tail_[p] = tail_[p + 1];
      tail_[p] += raw_moments(p * panel_, (p + 1) * panel_);
    }
    norm_ = 0.5 / tail_[0].m0;  // f is even: the full mass is twice that of [0, L]
  }

  double support() const { return support_; }
  double density(double x) const { return std::abs(x) < support_ ? raw(x) * norm_ : 0.0; }

  /// Moments over [a, b] for any a <= b.
  Moments over(double a, double b) const {
    a = std::max(a, -support_);
    b = std::min(b, support_);
    if (a >= b) return {};
    if (a >= 0) return positive(a, b);
    if (b <= 0) return positive(-b, -a).mirrored();
    Moments m = positive(0, -a).mirrored();
    m += positive(0, b);
    return m;
  }

 private:
  double raw(double x) const { return exponent_ == 0 ? 1.0 : std::exp(exponent_ * std::log1p(-x * x)); }

  Moments raw_moments(double a, double b) const {
    const GaussLegendre& gl = gauss_legendre();
    const double half = (b - a) / 2, mid = (a + b) / 2;
    Moments m;
    for (int i = 0; i < kGaussPoints; ++i) {
      const double x = mid + half * gl.x[i], fx = gl.w[i] * half * raw(x);
      m += Moments{fx, fx * x, fx * x * x};
    }
    return m;
  }

  // 0 <= a < b <= L.
  Moments positive(double a, double b) const {
    const int pa = std::min(kPanels - 1, static_cast<int>(a / panel_));
    const int pb = std::min(kPanels - 1, static_cast<int>(b / panel_));
    if (pa == pb) return raw_moments(a, b).scaled(norm_);
    Moments m = raw_moments(a, (pa + 1) * panel_);
    m += tail_[pa + 1] - tail_[pb];
    m += raw_moments(pb * panel_, b);
    return m.scaled(norm_);
  }

  double exponent_, support_, panel_, norm_ = 1;
  std::vector<Moments> tail_;  // tail_[p]: raw moments over [p * panel, L]
};

/// A density symmetric about 0, as the solver sees it (x >= 0 only).
struct SymmetricDensity {
  double support;                                  ///< zero beyond
  double stddev;                                   ///< sets the starting codebook and the tolerance
  std::function<Moments(double, double)> moments;  ///< over [a, b], 0 <= a <= b <= support; total mass 1
  std::function<double(double)> density;
};

/// Conditional means of the cells of positive centroids c (ascending), and how far c is from them.
struct LloydState {
  std::vector<double> mean, mass;
  double error = 0;  ///< max_i |c_i - mean_i|; infinite where a cell is empty or out of order
};

LloydState evaluate(const SymmetricDensity& g, const std::vector<double>& c) {
  const size_t h = c.size();
  LloydState s{std::vector<double>(h), std::vector<double>(h), 0.0};
  for (size_t i = 0; i < h; ++i) {
    const double lo = i == 0 ? 0.0 : (c[i - 1] + c[i]) / 2, hi = i + 1 == h ? g.support : (c[i] + c[i + 1]) / 2;
    const Moments m = lo < hi ? g.moments(lo, hi) : Moments{};
    if (!(m.m0 > 0) || c[i] <= 0 || c[i] >= g.support) {
      s.error = INFINITY;
      return s;
    }
    s.mass[i] = m.m0;
    s.mean[i] = m.m1 / m.m0;
    s.error = std::max(s.error, std::abs(c[i] - s.mean[i]));
  }
  return s;
}

/// One Newton step for F(c) = c - mean(c), with a tridiagonal Jacobian (Thomas algorithm).
std::vector<double> newton_step(const SymmetricDensity& g, const std::vector<double>& c, const LloydState& s) {
  const size_t h = c.size();
  std::vector<double> lower(h, 0), diag(h, 1), upper(h, 0), rhs(h);
  for (size_t i = 0; i < h; ++i) {
    rhs[i] = c[i] - s.mean[i];
    if (i > 0) {  // d mean_i / d t_i, with t_i = (c_{i-1} + c_i) / 2
      const double t = (c[i - 1] + c[i]) / 2, a = g.density(t) * (s.mean[i] - t) / s.mass[i];
      lower[i] -= a / 2;
      diag[i] -= a / 2;
    }
    if (i + 1 < h) {  // d mean_i / d t_{i+1}
      const double t = (c[i] + c[i + 1]) / 2, b = g.density(t) * (t - s.mean[i]) / s.mass[i];
      upper[i] -= b / 2;
      diag[i] -= b / 2;
    }
  }
  for (size_t i = 1; i < h; ++i) {
    const double f = lower[i] / diag[i - 1];
    diag[i] -= f * upper[i - 1];
    rhs[i] -= f * rhs[i - 1];
  }
  std::vector<double> next(c);
  double delta = 0;
  for (size_t k = h; k-- > 0;) {
    delta = (rhs[k] - (k + 1 < h ? upper[k] * delta : 0.0)) / diag[k];
    next[k] -= delta;
  }
  return next;
}

ScalarCodebook solve_symmetric(const SymmetricDensity& g, int bits) {
  const size_t h = size_t{1} << (bits - 1);
  std::vector<double> c(h);
  for (size_t i = 0; i < h; ++i) c[i] = std::min(g.stddev * 3.0 * (i + 0.5) / h, g.support * (i + 0.5) / h);
  LloydState s = evaluate(g, c);
  KVQ_CHECK(std::isfinite(s.error), "lloyd_max: empty cell in the starting codebook (", bits, " bits)");
  const double tolerance = 1e-13 * g.stddev;
  for (int iter = 0; iter < 2000 && s.error > tolerance; ++iter) {
    const std::vector<double> next = newton_step(g, c, s);
    LloydState t = evaluate(g, next);
    if (t.error < s.error) {
      c = next;
      s = std::move(t);
    } else {
      c = s.mean;
      s = evaluate(g, c);
    }
  }
  ScalarCodebook book;
  book.bits = bits;
  for (size_t i = h; i-- > 0;) book.centroids.push_back(-c[i]);
  book.centroids.insert(book.centroids.end(), c.begin(), c.end());
  for (size_t i = 0; i + 1 < 2 * h; ++i) book.boundaries.push_back((book.centroids[i] + book.centroids[i + 1]) / 2);
  double excess = 0;  // what the centroids' distances from their cells' means add to the distortion
  for (size_t i = 0; i < h; ++i) {  // twice the positive half's distortion
    const double lo = i == 0 ? 0.0 : (c[i - 1] + c[i]) / 2, hi = i + 1 == h ? g.support : (c[i] + c[i + 1]) / 2;
    book.mse += 2 * g.moments(lo, hi).about(c[i]).m2;
    excess += 2 * s.mass[i] * (c[i] - s.mean[i]) * (c[i] - s.mean[i]);
  }
  // A density with jumps (the residual's, cut by the stage-1 cells) may have no exact fixed point: where a cell
  // boundary sits on a jump the iteration stalls (turbo_rvq:4 at d = 272: centroids 0.5 % of a standard deviation
  // from their means). Such a codebook is kept when that costs under 1e-3 of its distortion (there: 1.1e-4).
  KVQ_CHECK(s.error <= 1e-10 * g.stddev || excess <= 1e-3 * book.mse, "lloyd_max: did not converge (", bits,
            " bits, centroids up to ", s.error / g.stddev, " standard deviations from their cells' means, adding ",
            excess / book.mse, " of the distortion)");
  return book;
}

ScalarCodebook solve_sphere(int d, int bits) {
  const auto f = std::make_shared<const SphereCoordinate>(d);
  const SymmetricDensity g{f->support(), 1 / std::sqrt(static_cast<double>(d)),
                           [f](double a, double b) { return f->over(a, b); },
                           [f](double x) { return f->density(x); }};
  return solve_symmetric(g, bits);
}

// The residual r = u - c1(u): on stage-1 cell k = [lo_k, hi_k] with centroid c_k, r = u - c_k, so its density is
// sum_k f(r + c_k) [lo_k <= r + c_k <= hi_k].
ScalarCodebook solve_residual(int d, int stage1_bits, int bits) {
  const ScalarCodebook& stage1 = sphere_lloyd_max(d, stage1_bits);
  const auto f = std::make_shared<const SphereCoordinate>(d);
  struct Cell {
    double lo, hi, c;
  };
  auto cells = std::make_shared<std::vector<Cell>>();
  double support = 0;
  const size_t k = stage1.centroids.size();
  for (size_t i = 0; i < k; ++i) {
    const double lo = i == 0 ? -f->support() : stage1.boundaries[i - 1];
    const double hi = i + 1 == k ? f->support() : stage1.boundaries[i];
    cells->push_back({lo, hi, stage1.centroids[i]});
    support = std::max({support, hi - stage1.centroids[i], stage1.centroids[i] - lo});
  }
  const SymmetricDensity g{support, std::sqrt(stage1.mse),
                           [f, cells](double a, double b) {
                             Moments m;
                             for (const Cell& cell : *cells)
                               m += f->over(std::max(a + cell.c, cell.lo), std::min(b + cell.c, cell.hi)).about(cell.c);
                             return m;
                           },
                           [f, cells](double r) {
                             double sum = 0;
                             for (const Cell& cell : *cells)
                               if (r + cell.c >= cell.lo && r + cell.c <= cell.hi) sum += f->density(r + cell.c);
                             return sum;
                           }};
  return solve_symmetric(g, bits);
}

/// Solved codebooks by (d, stage-1 bits or 0, bits). Solving happens outside the lock (a residual codebook
/// needs its stage-1 codebook); if two threads solve the same key, the first result is kept.
const ScalarCodebook& cached(int d, int stage1_bits, int bits, const std::function<ScalarCodebook()>& solve) {
  static std::mutex mutex;
  static std::map<std::tuple<int, int, int>, std::unique_ptr<const ScalarCodebook>> cache;
  const auto key = std::make_tuple(d, stage1_bits, bits);
  {
    const std::lock_guard lock(mutex);
    if (const auto it = cache.find(key); it != cache.end()) return *it->second;
  }
  auto book = std::make_unique<const ScalarCodebook>(solve());
  const std::lock_guard lock(mutex);
  return *cache.try_emplace(key, std::move(book)).first->second;
}

void check_range(int d, int bits, const char* what) {
  KVQ_CHECK(d >= 3 && d <= 65536, what, ": dimension ", d, " out of range [3, 65536]");
  KVQ_CHECK(bits >= 1 && bits <= 8, what, ": ", bits, " bits out of range [1, 8]");
}

}  // namespace

const ScalarCodebook& sphere_lloyd_max(int d, int bits) {
  check_range(d, bits, "sphere_lloyd_max");
  return cached(d, 0, bits, [=] { return solve_sphere(d, bits); });
}

const ScalarCodebook& sphere_residual_lloyd_max(int d, int stage1_bits, int bits) {
  check_range(d, bits, "sphere_residual_lloyd_max");
  check_range(d, stage1_bits, "sphere_residual_lloyd_max (stage 1)");
  return cached(d, stage1_bits, bits, [=] { return solve_residual(d, stage1_bits, bits); });
}

}  // namespace kvq

// Adam over unit reflector vectors, the gradient by backpropagation through the reflections (each H_i is its own
// inverse, so the backward pass recovers every intermediate vector instead of storing it) and projected onto the
// sphere's tangent space; each vector is renormalized after its step.
#include "codec/reflector_learning.hpp"

#include <algorithm>
#include <cmath>

#include "kvq/detail/random.hpp"
#include "kvq/error.hpp"

namespace kvq::detail {
namespace {

using Vec = std::vector<double>;

// Four partial sums, so that the loop vectorizes without reassociation (d is a multiple of 16).
double dot(const double* a, const double* b, int d) {
  double s[4] = {};
  for (int c = 0; c < d; c += 4)
    for (int j = 0; j < 4; ++j) s[j] += a[c + j] * b[c + j];
  return (s[0] + s[1]) + (s[2] + s[3]);
}

double power(double x, int p) {
  double r = 1;
  for (int i = 0; i < p; ++i) r *= x;
  return r;
}

/// v <- v - 2 (u . v) u.
void reflect(const double* u, double* v, int d) {
  const double a = 2 * dot(u, v, d);
  for (int c = 0; c < d; ++c) v[c] -= a * u[c];
}

/// The objective of one vector z; adds its gradient to g where g is not null.
double row_objective(const double* z, int d, int group, int p, double* g) {
  double total = 0;
  for (int g0 = 0; g0 < d; g0 += group) {
    double amax = 0;
    for (int c = g0; c < g0 + group; ++c) amax = std::max(amax, std::fabs(z[c]));
    if (amax == 0) continue;
    double sum = 0;  // the norm relative to the maximum, so that no power overflows
    for (int c = g0; c < g0 + group; ++c) sum += power(std::fabs(z[c]) / amax, p);
    const double m = amax * std::pow(sum, 1.0 / p);
    total += m * m;
    if (g)  // d(m^2)/dz_c = 2 m (|z_c| / m)^(p-1) sign(z_c)
      for (int c = g0; c < g0 + group; ++c) g[c] += 2 * m * std::copysign(power(std::fabs(z[c]) / m, p - 1), z[c]);
  }
  return total;
}

double objective(const std::vector<Vec>& units, const float* y, size_t n, int d, int group, int p) {
  Vec z(d);
  double total = 0;
  for (size_t r = 0; r < n; ++r) {
    for (int c = 0; c < d; ++c) z[c] = y[r * d + c];
    for (const Vec& u : units) reflect(u.data(), z.data(), d);
    total += row_objective(z.data(), d, group, p, nullptr);
  }
  return total;
}

}  // namespace

double group_max_objective(const float* y, size_t n, int d, int group, int p) {
  return objective({}, y, n, d, group, p);
}

std::vector<std::vector<float>> learn_reflectors(const float* y, size_t n, int d, const ReflectorLearning& how) {
  const int k = how.reflectors;
  KVQ_CHECK(k >= 2 && k <= d && k % 2 == 0, "learned rotation: ", k, " reflectors (need an even count in [2, ", d,
            "])");
  KVQ_CHECK(how.group >= 1 && d % how.group == 0, "learned rotation: group ", how.group, " does not divide ", d);
  KVQ_CHECK(d % 4 == 0 && how.p >= 2, "learned rotation: dimension ", d, " (a multiple of 4) or norm ", how.p);
  Rng rng(how.seed);
  std::vector<Vec> units(k, Vec(d));
  for (int i = 0; i < k; i += 2) {  // equal pairs: the product starts as the identity
    for (double& e : units[i]) e = rng.normal();
    const double norm = std::sqrt(dot(units[i].data(), units[i].data(), d));
    for (double& e : units[i]) e /= norm;
    units[i + 1] = units[i];
  }
  const std::vector<Vec> start = units;
  std::vector<Vec> grad(k, Vec(d)), m1(k, Vec(d)), m2(k, Vec(d));
  Vec z(d), g(d), prev(d);
  const double beta1 = 0.9, beta2 = 0.999;
  for (int step = 1; n > 0 && step <= how.steps; ++step) {
    for (Vec& gr : grad) std::fill(gr.begin(), gr.end(), 0.0);
    for (int b = 0; b < how.batch; ++b) {
      const size_t r = static_cast<size_t>(rng.uniform() * static_cast<double>(n)) % n;
      for (int c = 0; c < d; ++c) z[c] = y[r * d + c];
      for (const Vec& u : units) reflect(u.data(), z.data(), d);
      std::fill(g.begin(), g.end(), 0.0);
      row_objective(z.data(), d, how.group, how.p, g.data());
      for (int i = k - 1; i >= 0; --i) {  // z is the output of H_i; prev its input
        const double* u = units[i].data();
        prev = z;
        reflect(u, prev.data(), d);
        // out = prev - 2 (u . prev) u: d out / d u against g is -2 ((u . prev) g + (u . g) prev)
        const double up = dot(u, prev.data(), d), ug = dot(u, g.data(), d);
        for (int c = 0; c < d; ++c) grad[i][c] -= 2 * (up * g[c] + ug * prev[c]);
        for (int c = 0; c < d; ++c) g[c] -= 2 * ug * u[c];  // g <- H_i g
        z.swap(prev);
      }
    }
    const double c1 = 1 - std::pow(beta1, step), c2 = 1 - std::pow(beta2, step);
    for (int i = 0; i < k; ++i) {
      Vec& u = units[i];
      const double radial = dot(grad[i].data(), u.data(), d);
      for (int c = 0; c < d; ++c) {
        const double gc = (grad[i][c] - radial * u[c]) / how.batch;
        m1[i][c] = beta1 * m1[i][c] + (1 - beta1) * gc;
        m2[i][c] = beta2 * m2[i][c] + (1 - beta2) * gc * gc;
        u[c] -= how.rate * (m1[i][c] / c1) / (std::sqrt(m2[i][c] / c2) + 1e-12);
      }
      const double norm = std::sqrt(dot(u.data(), u.data(), d));
      for (double& e : u) e /= norm;
    }
  }
  const bool better = objective(units, y, n, d, how.group, how.p) < objective(start, y, n, d, how.group, how.p);
  std::vector<std::vector<float>> out(k, std::vector<float>(d));
  for (int i = 0; i < k; ++i)
    for (int c = 0; c < d; ++c) out[i][c] = static_cast<float>(better ? units[i][c] : start[i][c]);
  return out;
}

}  // namespace kvq::detail

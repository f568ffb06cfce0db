#include "rotation/fft.hpp"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <numbers>
#include <utility>

#include "kvq/error.hpp"

namespace kvq::fft {
namespace {

static_assert(sizeof(Complex) == 2 * sizeof(float), "float arrays are reinterpreted as Complex arrays by memcpy");

// Written out by hand: std::complex<float> multiplication calls a slow NaN-handling routine without -ffast-math.
Complex operator+(Complex a, Complex b) { return {a.re + b.re, a.im + b.im}; }
Complex operator-(Complex a, Complex b) { return {a.re - b.re, a.im - b.im}; }
Complex operator*(Complex a, float c) { return {a.re * c, a.im * c}; }
Complex mul(Complex a, Complex w) { return {a.re * w.re - a.im * w.im, a.re * w.im + a.im * w.re}; }
Complex mul_conj(Complex a, Complex w) { return {a.re * w.re + a.im * w.im, a.im * w.re - a.re * w.im}; }
Complex conj(Complex a) { return {a.re, -a.im}; }

/// a times the twiddle w (forward) or its conjugate (backward): the backward transform uses conjugate roots.
template <bool Backward>
Complex twiddle(Complex a, Complex w) {
  return Backward ? mul_conj(a, w) : mul(a, w);
}
/// a * (sigma i) with sigma = -1 forward, +1 backward (the sign of the roots' imaginary part).
template <bool Backward>
Complex times_sigma_i(Complex a) {
  return Backward ? Complex{-a.im, a.re} : Complex{a.im, -a.re};
}

/// e^{-2 pi i k/n}, computed in double.
Complex root(int64_t k, int64_t n) {
  const double angle = -2.0 * std::numbers::pi * static_cast<double>(k) / static_cast<double>(n);
  return {static_cast<float>(std::cos(angle)), static_cast<float>(std::sin(angle))};
}

/// Radices 4 first (fewest passes), then 2, 3, 5, then the remaining primes in increasing order.
std::vector<int> factorize(int n) {
  std::vector<int> factors;
  while (n % 4 == 0) {
    factors.push_back(4);
    n /= 4;
  }
  for (int p : {2, 3, 5})
    while (n % p == 0) {
      factors.push_back(p);
      n /= p;
    }
  for (int p = 7; p * p <= n; p += 2)
    while (n % p == 0) {
      factors.push_back(p);
      n /= p;
    }
  if (n > 1) factors.push_back(n);
  return factors;
}

/// b = the DFT of size R of a (roots e^{sigma 2 pi i/R}).
template <int R, bool Backward>
void butterfly(const Complex* a, Complex* b) {
  if constexpr (R == 2) {
    b[0] = a[0] + a[1];
    b[1] = a[0] - a[1];
  } else if constexpr (R == 3) {
    constexpr float kSin60 = 0.866025403784438646763723170752936183f;
    const Complex t1 = a[1] + a[2];
    const Complex t2 = times_sigma_i<Backward>((a[1] - a[2]) * kSin60);
    const Complex m = a[0] - t1 * 0.5f;
    b[0] = a[0] + t1;
    b[1] = m + t2;
    b[2] = m - t2;
  } else if constexpr (R == 4) {
    const Complex t0 = a[0] + a[2], t1 = a[0] - a[2], t2 = a[1] + a[3];
    const Complex t3 = times_sigma_i<Backward>(a[1] - a[3]);
    b[0] = t0 + t2;
    b[1] = t1 + t3;
    b[2] = t0 - t2;
    b[3] = t1 - t3;
  } else {
    static_assert(R == 5);
    constexpr float kC1 = 0.309016994374947424102293417182819059f;   // cos(2 pi/5)
    constexpr float kC2 = -0.809016994374947424102293417182819059f;  // cos(4 pi/5)
    constexpr float kS1 = 0.951056516295153572116439333379382143f;   // sin(2 pi/5)
    constexpr float kS2 = 0.587785252292473129168705954639072769f;   // sin(4 pi/5)
    const Complex t1 = a[1] + a[4], t2 = a[2] + a[3], t3 = a[1] - a[4], t4 = a[2] - a[3];
    const Complex m1 = a[0] + t1 * kC1 + t2 * kC2, m2 = a[0] + t1 * kC2 + t2 * kC1;
    const Complex n1 = times_sigma_i<Backward>(t3 * kS1 + t4 * kS2);
    const Complex n2 = times_sigma_i<Backward>(t3 * kS2 - t4 * kS1);
    b[0] = a[0] + t1 + t2;
    b[1] = m1 + n1;
    b[2] = m2 + n2;
    b[3] = m2 - n2;
    b[4] = m1 - n1;
  }
}

// One Stockham pass (decimation in frequency): with sub-transform length r*m and stride s, for p in [0, m) and
// q in [0, s):  y[q + s (r p + k)] = w_{rm}^{pk} * sum_j x[q + s (p + j m)] w_r^{jk}.  Output k of the length-rm
// transform then sits at q + s k after the remaining passes, which is why no reordering is needed.
template <int R, bool Backward>
void fixed_pass(int m, int s, const Complex* tw, const Complex* x, Complex* y) {
  for (int p = 0; p < m; ++p) {
    const Complex* w = tw + static_cast<size_t>(p) * (R - 1);
    for (int q = 0; q < s; ++q) {
      Complex a[R], b[R];
      for (int j = 0; j < R; ++j) a[j] = x[q + s * (p + j * m)];
      butterfly<R, Backward>(a, b);
      Complex* out = y + q + s * R * p;
      out[0] = b[0];
      for (int k = 1; k < R; ++k) out[s * k] = twiddle<Backward>(b[k], w[k - 1]);
    }
  }
}

/// The same pass for any radix r with a direct O(r^2) DFT, accumulated in double (r can be ~2000).
template <bool Backward>
void generic_pass(int r, int m, int s, const Complex* tw, const Complex* roots, const Complex* x, Complex* y) {
  for (int p = 0; p < m; ++p) {
    const Complex* w = tw + static_cast<size_t>(p) * (r - 1);
    for (int q = 0; q < s; ++q) {
      const Complex* in = x + q + s * p;
      Complex* out = y + q + s * r * p;
      for (int k = 0; k < r; ++k) {
        double re = 0, im = 0;
        int jk = 0;  // j * k mod r
        for (int j = 0; j < r; ++j) {
          const Complex t = twiddle<Backward>(in[static_cast<size_t>(s) * j * m], roots[jk]);
          re += t.re;
          im += t.im;
          jk += k;
          if (jk >= r) jk -= r;
        }
        const Complex sum{static_cast<float>(re), static_cast<float>(im)};
        out[s * k] = k == 0 ? sum : twiddle<Backward>(sum, w[k - 1]);
      }
    }
  }
}

/// A per-thread buffer of at least `count` values that only grows, so transforms do not allocate per call.
Complex* scratch(size_t count) {
  thread_local std::vector<Complex> buffer;
  if (buffer.size() < count) buffer.resize(count);
  return buffer.data();
}

int checked_half(int n) {
  KVQ_CHECK(n >= 2 && n % 2 == 0, "fft: a real transform needs an even size, got ", n);
  return n / 2;
}

}  // namespace

ComplexFft::ComplexFft(int n) : n_(n) {
  KVQ_CHECK(n >= 1, "fft: size must be positive, got ", n);
  int len = n, s = 1;
  for (int r : factorize(n)) {
    const int m = len / r;
    Stage stage{r, m, s, table_.size(), 0};
    for (int p = 0; p < m; ++p)
      for (int k = 1; k < r; ++k) table_.push_back(root(static_cast<int64_t>(p) * k % len, len));
    if (r > 5) {
      stage.roots = table_.size();
      for (int j = 0; j < r; ++j) table_.push_back(root(j, r));
    }
    stages_.push_back(stage);
    len = m;
    s *= r;
  }
}

template <bool Backward>
Complex* ComplexFft::run(Complex* x, Complex* y) const {
  for (const Stage& st : stages_) {
    const Complex* tw = table_.data() + st.twiddles;
    switch (st.radix) {
      case 2: fixed_pass<2, Backward>(st.m, st.s, tw, x, y); break;
      case 3: fixed_pass<3, Backward>(st.m, st.s, tw, x, y); break;
      case 4: fixed_pass<4, Backward>(st.m, st.s, tw, x, y); break;
      case 5: fixed_pass<5, Backward>(st.m, st.s, tw, x, y); break;
      default: generic_pass<Backward>(st.radix, st.m, st.s, tw, table_.data() + st.roots, x, y);
    }
    std::swap(x, y);
  }
  return x;
}

Complex* ComplexFft::forward(Complex* data, Complex* work) const { return run<false>(data, work); }
Complex* ComplexFft::backward(Complex* data, Complex* work) const { return run<true>(data, work); }

RealFft::RealFft(int n) : n_(n), half_(checked_half(n)) {
  split_.reserve(n / 2);
  for (int k = 0; k < n / 2; ++k) split_.push_back(root(k, n));
}

// With Z = DFT_{n/2}(z), the DFTs of the even and odd samples are E_k = (Z_k + conj Z_{h-k}) / 2 and
// O_k = (Z_k - conj Z_{h-k}) / (2i), and X_k = E_k + w_n^k O_k (h = n/2, Z_h = Z_0).
void RealFft::forward(const float* x, float* packed) const {
  const int h = n_ / 2;
  Complex* buffer = scratch(2 * static_cast<size_t>(h));
  std::memcpy(buffer, x, static_cast<size_t>(n_) * sizeof(float));
  const Complex* z = half_.forward(buffer, buffer + h);
  packed[0] = z[0].re + z[0].im;
  packed[1] = z[0].re - z[0].im;
  for (int k = 1; k < h; ++k) {
    const Complex a = z[k], b = conj(z[h - k]);
    const Complex even = (a + b) * 0.5f;
    const Complex odd = times_sigma_i<false>((a - b) * 0.5f);  // (a - b) / (2i)
    const Complex xk = even + mul(odd, split_[k]);
    packed[2 * k] = xk.re;
    packed[2 * k + 1] = xk.im;
  }
}

// The same relations solved for E_k and O_k (O_k = (X_k - conj X_{h-k}) conj(w_n^k) / 2); then z = IDFT_{n/2}(E + iO)
// holds the even samples in its real parts and the odd ones in its imaginary parts. 1/h and the halves fold into 1/n.
void RealFft::inverse(const float* packed, float* x) const {
  const int h = n_ / 2;
  const float inv_n = 1.0f / static_cast<float>(n_);
  Complex* buffer = scratch(2 * static_cast<size_t>(h));
  buffer[0] = {(packed[0] + packed[1]) * inv_n, (packed[0] - packed[1]) * inv_n};
  for (int k = 1; k < h; ++k) {
    const Complex a{packed[2 * k], packed[2 * k + 1]};
    const Complex b{packed[2 * (h - k)], -packed[2 * (h - k) + 1]};
    const Complex odd = mul_conj(a - b, split_[k]);
    buffer[k] = (a + b + Complex{-odd.im, odd.re}) * inv_n;
  }
  const Complex* z = half_.backward(buffer, buffer + h);
  std::memcpy(x, z, static_cast<size_t>(n_) * sizeof(float));
}

}  // namespace kvq::fft

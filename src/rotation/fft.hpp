// Small FFTs for the SRFT rotation: a mixed-radix complex FFT (radices 2, 3, 4, 5 and a direct DFT for any other
// prime factor) and a real FFT of even size n built on the complex FFT of size n/2. Plans (factorization and
// twiddles, computed in double and stored as float) are built once; transforms allocate nothing but a
// thread-local scratch buffer that only grows.
#pragma once

#include <cstddef>
#include <vector>

namespace kvq::fft {

struct Complex {
  float re, im;
};

/// Unnormalized DFT of a fixed size n >= 1: forward X_k = sum_j x_j e^{-2 pi i jk/n}, backward with e^{+2 pi i jk/n}.
/// Self-sorting (Stockham) passes alternate between two buffers, so no bit reversal is needed.
class ComplexFft {
 public:
  explicit ComplexFft(int n);
  int size() const { return n_; }

  /// Transforms `data` (n values), using `work` (n values) as the other buffer; returns the one holding the result
  /// (either pointer). Both buffers are overwritten.
  Complex* forward(Complex* data, Complex* work) const;
  Complex* backward(Complex* data, Complex* work) const;

 private:
  /// One pass of radix r over sub-transforms of length r*m, interleaved with stride s (r*m*s = n).
  struct Stage {
    int radix, m, s;
    size_t twiddles;  ///< offset in table_ of w_{r m}^{p k}, p in [0, m), k in [1, r): m * (r - 1) values
    size_t roots;     ///< offset in table_ of w_r^j, j in [0, r) (generic radices only)
  };
  template <bool Backward>
  Complex* run(Complex* data, Complex* work) const;

  int n_;
  std::vector<Stage> stages_;
  std::vector<Complex> table_;
};

/// Unnormalized real DFT of even size n, through the complex FFT of size n/2 on z_j = x_{2j} + i x_{2j+1}.
/// The spectrum X_0 .. X_{n/2} (the rest follows by Hermitian symmetry) is packed into n floats:
///   [X_0, X_{n/2}, Re X_1, Im X_1, Re X_2, Im X_2, ..., Re X_{n/2-1}, Im X_{n/2-1}]   (X_0 and X_{n/2} are real).
class RealFft {
 public:
  explicit RealFft(int n);
  int size() const { return n_; }

  /// packed = the packed spectrum of x (n floats each; may be the same array).
  void forward(const float* x, float* packed) const;
  /// x = the real signal whose spectrum is `packed` (exact inverse of forward, 1/n included; may alias).
  void inverse(const float* packed, float* x) const;

 private:
  int n_;
  ComplexFft half_;
  std::vector<Complex> split_;  ///< w_n^k = e^{-2 pi i k/n}, k in [0, n/2)
};

}  // namespace kvq::fft

// Distortion of a codec on random unit vectors: reconstruction MSE and the bias and variance of its inner-product
// estimate, the figures the TurboQuant and QJL papers report (`kvq distortion`).
#pragma once

#include <cstdint>
#include <functional>
#include <string>

#include "kvq/codec.hpp"

namespace kvq {

struct DistortionOptions {
  std::string codec = "turbo_mse:2";
  int dim = 128;
  size_t n = 10000;   ///< unit vectors for the MSE, and inner-product trials
  uint64_t seed = 0;  ///< seeds the codec of the MSE pass, the data, and every trial's codec
  int block_tokens = 64;
  Role role = Role::key;
  /// Called now and then with (done, total) work units, for progress output on long runs.
  std::function<void(size_t, size_t)> progress;
};

struct DistortionResult {
  std::string codec;
  int dim = 0;
  size_t n = 0;
  double bits_per_element = 0;
  double mse = 0;             ///< mean ||x - decode(encode(x))||^2 over unit vectors x
  double ip_bias = 0;         ///< mean(est - 0.5), est = the codec's score of y against x, <x, y> = 0.5
  double ip_bias_stderr = 0;  ///< standard error of ip_bias
  double ip_mse_d = 0;        ///< d * mean((est - 0.5)^2)
};

/// The inner-product trials draw a fresh codec (seed derived from `seed` and the trial) for every pair, so
/// rotation and sketch randomness is averaged over, as the papers' expectations are. The key x is token 0 of a
/// block whose other tokens are fresh unit vectors (codecs with per-block statistics see realistic blocks).
/// Codecs that need training are trained once, on unit vectors independent of the test vectors, and that one
/// codec serves every trial.
DistortionResult measure_distortion(const DistortionOptions& options);

}  // namespace kvq

// vecinfer:c/s — product vector quantization after outlier smoothing (VecInfer).
//
// A vector x is smoothed per channel (x / lambda), rotated (Hadamard for d a power of two, else SRFT), and the
// rotated d-vector is cut into d/s sub-vectors of s floats, each coded by the index of its nearest centroid in ONE
// codebook of K = 2^c centroids shared by every sub-vector position. Smoothing factors and codebook are trained.
//
// In the codec model (codec.hpp): A = R diag(lambda), so
//     to_space(q)   = R (lambda ⊙ q)
//     decode_space  = the concatenated centroids (the smoothed, rotated space)
//     from_space(y) = lambda ⊙ R^T y
// and a key scores as <R (lambda ⊙ q), y> = <q, decode(k)>. Scoring goes through a per-query lookup table
// LUT[j][k] = <q~_j, centroid_k> (q~ = to_space(q), j the sub-vector position): a score is d/s table reads.
//
// Smoothing (the option smooth=0 turns it off): lambda_c = sqrt(rms_c), rms_c the root mean square of channel c
// over the training vectors, normalized to geometric mean 1. Why the square root: after the rotation the
// quantization error is spread about evenly over the channels of the smoothed space, and mapping back multiplies
// channel c's error by lambda_c; the error is then proportional to sum_c lambda_c^2 * sum_c rms_c^2 / lambda_c^2,
// smallest (Cauchy-Schwarz) for lambda_c^2 ∝ rms_c. VecInfer's own factor, sqrt(max_t |x_tc|), is the same idea
// with the channel's maximum instead of its RMS; the RMS does not grow with the size of the training set.
// Measured on 200 key-like profiles (d = 128, vecinfer:8/4, relative error on held-out vectors): sqrt(rms) and
// sqrt(max) both 0.005..0.029, dividing by the RMS itself 0.09..0.11, no smoothing 0.008..0.075.
//
// Bits per element: c/s exactly when (d/s)·c is a multiple of 8 (every power-of-two d); each token's codes are
// padded to whole bytes otherwise. By default nothing else is stored, as in VecInfer. A nearest-centroid decode
// x^ shrinks: <x, x^> ~ |x^|^2 ~ (1 - D)|x|^2 at relative error D, so <q, x^> underestimates <q, x> by the
// factor 1 - D (a softmax temperature of 1 / (1 - D) on every score). The option norm=1 stores per token the fp16
// factor gamma = |x|^2 / <x, x^> (capped at 2) and decodes gamma x^, which makes the inner product with x itself exact and
// removes that bias. kvq distortion at d = 128 (unit vectors): vecinfer:8/4 ip_bias -0.048 -> 0.000, ip_mse_d
// 0.395 -> 0.085; vecinfer:8/8 ip_bias -0.160 -> 0.001, ip_mse_d 3.47 -> 0.37. It costs 16/d bits per element and
// raises the reconstruction error (mse 0.099 -> 0.110, 0.326 -> 0.484), so it suits keys, not values.
// Layout: layout::VecInfer in block_layout.hpp.
#pragma once

#include <optional>
#include <vector>

#include "codec/nearest_centroid.hpp"
#include "kvq/codec.hpp"

namespace kvq {

class VecInferCodec final : public Codec {
 public:
  /// bits: c in 8..12; sub_dim: s, 4 or 8; smooth: train the per-channel smoothing (else lambda = 1);
  /// norm: store the per-token inner-product correction gamma.
  VecInferCodec(const CodecSpec& spec, const CodecParams& params, int bits, int sub_dim, bool smooth, bool norm);

  bool needs_training() const override { return true; }
  /// lambda (d fp32) then the codebook (2^c x s fp32, row-major), little-endian; empty before training.
  std::vector<uint8_t> state() const override;

  int codeword_bits() const { return bits_; }
  int sub_dim() const { return sub_dim_; }
  int centroids() const { return 1 << bits_; }
  /// The trained state: lambda (d floats; all 1 before training or with smooth=0) and the codebook
  /// (centroids() x sub_dim() floats, row-major; empty before training).
  const std::vector<float>& smoothing() const { return lambda_; }
  const std::vector<float>& codebook() const { return codebook_; }
  /// The vectors the encoder quantizes: y = R (x / lambda) for n vectors (n x d in and out).
  void smoothed_rotated(const float* x, size_t n, float* y) const;

 protected:
  void encode_block(const float* x, int n, uint8_t* block) const override;
  void decode_block_space(const uint8_t* block, int n, float* y) const override;
  void map_to_space(const float* q, int n_q, float* y) const override;
  void map_from_space(const float* y, int n_q, float* x) const override;
  std::unique_ptr<Scorer> make_scorer(const float* q, int n_q) const override;
  void accumulate_block(const float* w, int n_q, const uint8_t* block, int n, float* acc) const override;
  void train_impl(const float* x, size_t n) override;
  void load_state_impl(const std::vector<uint8_t>& bytes) override;

 private:
  class LutScorer;

  void smooth_and_rotate(const std::vector<float>& lambda, const float* x, size_t n, float* y) const;
  /// The d/s codeword indices of token t of a block.
  void read_codes(const uint8_t* block, int t, uint16_t* codes) const;
  /// Token t's gamma (1 without norm=1).
  float read_gamma(const uint8_t* block, int t) const;

  int bits_, sub_dim_, n_sub_;
  bool smooth_, norm_;
  size_t row_bytes_, norms_offset_;
  std::vector<float> lambda_;    // d smoothing factors
  std::vector<float> codebook_;  // 2^c x s
  std::optional<CentroidTable> table_;
};

}  // namespace kvq

#include "codec/vecinfer.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "codec/block_layout.hpp"
#include "codec/codec_factories.hpp"
#include "codec/kmeans.hpp"
#include "core/bitpack.hpp"
#include "core/half.hpp"
#include "kvq/detail/random.hpp"
#include "kvq/error.hpp"

namespace kvq {
namespace {

// The largest norm=1 factor stored.
constexpr double kMaxGamma = 2.0;

// k-means sees at most 256 sub-vectors per centroid (a uniform subsample, faiss's default cap) and runs at most 6
// Lloyd updates. Measured on held-out key-like vectors (d = 128, 4096 training vectors): 256 points per centroid
// and 6 updates quantize as well as 64 points and 25 updates (vecinfer:8/4: 0.909 vs 0.912 mean squared error in
// the smoothed space) at a quarter of the work, and training vecinfer:10/8 on 4096 vectors stays under half a
// second on one core.
constexpr size_t kTrainPointsPerCentroid = 256;
constexpr int kTrainIterations = 6;
constexpr double kTrainTolerance = 1e-4;
// Channels whose RMS is below this fraction of the largest are smoothed as if they had it (no division by ~0).
constexpr double kRmsFloor = 1e-6;

}  // namespace

// Per-query lookup tables: lut_[(i * n_sub + j) * K + k] = <q~_i[j*s .. j*s+s), centroid_k>.
class VecInferCodec::LutScorer final : public Scorer {
 public:
  LutScorer(const VecInferCodec& codec, const float* q, int n_q)
      : Scorer(n_q, codec.block_tokens()), codec_(codec), codes_(codec.n_sub_) {
    const int d = codec.dim(), s = codec.sub_dim_, n_sub = codec.n_sub_, K = codec.centroids();
    std::vector<float> qs(static_cast<size_t>(n_q) * d);
    codec.map_to_space(q, n_q, qs.data());
    lut_.resize(static_cast<size_t>(n_q) * n_sub * K);
    for (int i = 0; i < n_q; ++i)
      for (int j = 0; j < n_sub; ++j) {
        const float* qj = qs.data() + static_cast<size_t>(i) * d + static_cast<size_t>(j) * s;
        float* row = lut_.data() + (static_cast<size_t>(i) * n_sub + j) * K;
        for (int k = 0; k < K; ++k) {
          const float* c = codec.codebook_.data() + static_cast<size_t>(k) * s;
          float dot = 0;
          for (int l = 0; l < s; ++l) dot += qj[l] * c[l];
          row[k] = dot;
        }
      }
  }

  void scores(const uint8_t* block, int n, float* out) override {
    const int n_sub = codec_.n_sub_;
    const size_t K = static_cast<size_t>(codec_.centroids());
    for (int t = 0; t < n; ++t) {
      codec_.read_codes(block, t, codes_.data());
      const float gamma = codec_.read_gamma(block, t);
      for (int i = 0; i < n_queries(); ++i) {
        const float* lut = lut_.data() + static_cast<size_t>(i) * n_sub * K;
        float s = 0;
        for (int j = 0; j < n_sub; ++j) s += lut[j * K + codes_[j]];
        out[static_cast<size_t>(i) * block_tokens() + t] = gamma * s;
      }
    }
  }

 private:
  const VecInferCodec& codec_;
  std::vector<float> lut_;
  std::vector<uint16_t> codes_;
};

VecInferCodec::VecInferCodec(const CodecSpec& spec, const CodecParams& params, int bits, int sub_dim, bool smooth,
                             bool norm)
    : Codec(spec, params),
      bits_(bits),
      sub_dim_(sub_dim),
      n_sub_(0),
      smooth_(smooth),
      norm_(norm),
      lambda_(params.dim, 1.0f) {
  KVQ_CHECK(bits >= 8 && bits <= 12, spec.str(), ": codeword bits c must be in 8..12, got ", bits);
  KVQ_CHECK(sub_dim == 4 || sub_dim == 8, spec.str(), ": sub-vector length s must be 4 or 8, got ", sub_dim);
  KVQ_CHECK(params.dim % sub_dim == 0, spec.str(), ": head dimension ", params.dim, " is not a multiple of s = ",
            sub_dim);
  n_sub_ = params.dim / sub_dim;
  const layout::VecInfer l{static_cast<size_t>(params.dim), static_cast<size_t>(params.block_tokens),
                           static_cast<size_t>(sub_dim), static_cast<size_t>(bits), norm};
  row_bytes_ = l.row_bytes();
  norms_offset_ = l.norms_offset();
  rotation_ = rotation_from_spec(spec, params);
  set_layout(l.block_bytes(), params.dim);
}

void VecInferCodec::smoothed_rotated(const float* x, size_t n, float* y) const {
  smooth_and_rotate(lambda_, x, n, y);
}

void VecInferCodec::smooth_and_rotate(const std::vector<float>& lambda, const float* x, size_t n, float* y) const {
  const int d = dim();
  for (size_t t = 0; t < n; ++t)
    for (int c = 0; c < d; ++c) y[t * d + c] = x[t * d + c] / lambda[c];
  rotation_->apply(y, y, n);
}

void VecInferCodec::train_impl(const float* x, size_t n) {
  const int d = dim(), K = centroids();
  KVQ_CHECK(n * n_sub_ >= static_cast<size_t>(K), spec().str(), ": training needs at least ", K,
            " sub-vectors (one per centroid), got ", n, " vectors x ", n_sub_, " sub-vectors");
  std::vector<float> lambda(d, 1.0f);
  if (smooth_) {
    std::vector<double> rms(d, 0.0);
    for (size_t t = 0; t < n; ++t)
      for (int c = 0; c < d; ++c) rms[c] += static_cast<double>(x[t * d + c]) * x[t * d + c];
    for (double& r : rms) r = std::sqrt(r / static_cast<double>(n));
    const double top = *std::max_element(rms.begin(), rms.end());
    if (top > 0) {
      double log_sum = 0;
      for (double& r : rms) r = std::sqrt(std::max(r, kRmsFloor * top)), log_sum += std::log(r);
      const double geometric_mean = std::exp(log_sum / d);
      for (int c = 0; c < d; ++c) lambda[c] = static_cast<float>(rms[c] / geometric_mean);
    }
  }
  std::vector<float> y(n * d);
  smooth_and_rotate(lambda, x, n, y.data());
  KMeansOptions o;
  o.k = K;
  o.max_iterations = kTrainIterations;
  o.tolerance = kTrainTolerance;
  o.max_points = kTrainPointsPerCentroid * static_cast<size_t>(K);
  o.seed = derive_seed(params().seed, 2);
  codebook_ = kmeans(y.data(), n * n_sub_, sub_dim_, o).centroids;
  lambda_ = std::move(lambda);
  table_.emplace(codebook_.data(), K, sub_dim_);
}

std::vector<uint8_t> VecInferCodec::state() const {
  if (codebook_.empty()) return {};
  std::vector<uint8_t> bytes((lambda_.size() + codebook_.size()) * sizeof(float));
  std::memcpy(bytes.data(), lambda_.data(), lambda_.size() * sizeof(float));
  std::memcpy(bytes.data() + lambda_.size() * sizeof(float), codebook_.data(), codebook_.size() * sizeof(float));
  return bytes;
}

void VecInferCodec::load_state_impl(const std::vector<uint8_t>& bytes) {
  const size_t d = static_cast<size_t>(dim()), entries = static_cast<size_t>(centroids()) * sub_dim_;
  KVQ_CHECK(bytes.size() == (d + entries) * sizeof(float), spec().str(), ": state of ", bytes.size(),
            " bytes, expected ", (d + entries) * sizeof(float), " (", d, " fp32 smoothing factors and a codebook of ",
            centroids(), " x ", sub_dim_, " fp32)");
  std::vector<float> lambda(d), codebook(entries);
  std::memcpy(lambda.data(), bytes.data(), d * sizeof(float));
  std::memcpy(codebook.data(), bytes.data() + d * sizeof(float), entries * sizeof(float));
  for (size_t c = 0; c < d; ++c)
    KVQ_CHECK(std::isfinite(lambda[c]) && lambda[c] > 0, spec().str(), ": state gives channel ", c,
              " the smoothing factor ", lambda[c], " (must be positive and finite)");
  for (size_t i = 0; i < entries; ++i)
    KVQ_CHECK(std::isfinite(codebook[i]), spec().str(), ": state gives centroid ", i / sub_dim_, " the coordinate ",
              codebook[i]);
  lambda_ = std::move(lambda);
  codebook_ = std::move(codebook);
  table_.emplace(codebook_.data(), centroids(), sub_dim_);
}

void VecInferCodec::encode_block(const float* x, int n, uint8_t* block) const {
  const int d = dim(), T = block_tokens();
  // Tokens n..T-1 are encoded as zero vectors.
  std::vector<float> y(static_cast<size_t>(T) * d, 0.0f);
  smoothed_rotated(x, static_cast<size_t>(n), y.data());
  std::vector<uint32_t> idx(static_cast<size_t>(T) * n_sub_);
  table_->nearest(y.data(), idx.size(), idx.data());
  std::vector<uint16_t> row(n_sub_);
  for (int t = 0; t < T; ++t) {
    std::copy_n(idx.begin() + static_cast<std::ptrdiff_t>(t) * n_sub_, n_sub_, row.begin());
    pack_bits16(row.data(), static_cast<size_t>(n_sub_), bits_, block + static_cast<size_t>(t) * row_bytes_);
  }
  if (!norm_) return;
  std::memset(block + static_cast<size_t>(T) * row_bytes_, 0, norms_offset_ - static_cast<size_t>(T) * row_bytes_);
  // gamma from the plain reconstruction x^ = lambda ⊙ R^T [centroids], in the original space.
  std::vector<float> xhat(static_cast<size_t>(n) * d);
  for (size_t j = 0; j < static_cast<size_t>(n) * n_sub_; ++j)
    std::copy_n(codebook_.begin() + static_cast<std::ptrdiff_t>(idx[j]) * sub_dim_, sub_dim_, y.begin() + j * sub_dim_);
  map_from_space(y.data(), n, xhat.data());
  for (int t = 0; t < T; ++t) {
    double norm2 = 0, dot = 0;
    for (int c = 0; t < n && c < d; ++c) {
      const double v = x[static_cast<size_t>(t) * d + c];
      norm2 += v * v;
      dot += v * xhat[static_cast<size_t>(t) * d + c];
    }
    // Capped at kMaxGamma: a reconstruction that far from x (<x, x^> < |x|^2 / 2) is not worth amplifying.
    const uint16_t gamma = f32_to_f16(dot > 0 ? static_cast<float>(std::min(norm2 / dot, kMaxGamma)) : 0.0f);
    std::memcpy(block + norms_offset_ + 2 * static_cast<size_t>(t), &gamma, 2);
  }
}

void VecInferCodec::read_codes(const uint8_t* block, int t, uint16_t* codes) const {
  unpack_bits16(block + static_cast<size_t>(t) * row_bytes_, static_cast<size_t>(n_sub_), bits_, codes);
}

float VecInferCodec::read_gamma(const uint8_t* block, int t) const {
  if (!norm_) return 1.0f;
  uint16_t h;
  std::memcpy(&h, block + norms_offset_ + 2 * static_cast<size_t>(t), 2);
  return f16_to_f32(h);
}

void VecInferCodec::decode_block_space(const uint8_t* block, int n, float* y) const {
  const int d = dim(), s = sub_dim_;
  std::vector<uint16_t> codes(n_sub_);
  for (int t = 0; t < n; ++t) {
    read_codes(block, t, codes.data());
    const float gamma = read_gamma(block, t);
    float* yt = y + static_cast<size_t>(t) * d;
    for (int j = 0; j < n_sub_; ++j) {
      const float* c = codebook_.data() + static_cast<size_t>(codes[j]) * s;
      for (int l = 0; l < s; ++l) yt[j * s + l] = gamma * c[l];
    }
  }
}

void VecInferCodec::map_to_space(const float* q, int n_q, float* y) const {
  const int d = dim();
  for (size_t i = 0; i < static_cast<size_t>(n_q); ++i)
    for (int c = 0; c < d; ++c) y[i * d + c] = lambda_[c] * q[i * d + c];
  rotation_->apply(y, y, static_cast<size_t>(n_q));
}

void VecInferCodec::map_from_space(const float* y, int n_q, float* x) const {
  const int d = dim();
  rotation_->apply_inverse(y, x, static_cast<size_t>(n_q));
  for (size_t i = 0; i < static_cast<size_t>(n_q); ++i)
    for (int c = 0; c < d; ++c) x[i * d + c] *= lambda_[c];
}

std::unique_ptr<Scorer> VecInferCodec::make_scorer(const float* q, int n_q) const {
  return std::make_unique<LutScorer>(*this, q, n_q);
}

// Adds each token's weighted centroids (T x d work, as a decode); per-(position, centroid) weight sums would pay
// off only for blocks much longer than K.
void VecInferCodec::accumulate_block(const float* w, int n_q, const uint8_t* block, int n, float* acc) const {
  const int d = dim(), s = sub_dim_, T = block_tokens();
  std::vector<uint16_t> codes(n_sub_);
  for (int t = 0; t < n; ++t) {
    read_codes(block, t, codes.data());
    const float gamma = read_gamma(block, t);
    for (int i = 0; i < n_q; ++i) {
      const float wt = gamma * w[static_cast<size_t>(i) * T + t];
      float* a = acc + static_cast<size_t>(i) * d;
      for (int j = 0; j < n_sub_; ++j) {
        const float* c = codebook_.data() + static_cast<size_t>(codes[j]) * s;
        for (int l = 0; l < s; ++l) a[j * s + l] += wt * c[l];
      }
    }
  }
}

std::unique_ptr<Codec> make_vecinfer_codec(const CodecSpec& spec, const CodecParams& params) {
  check_spec_shape(spec, 2, "rot,smooth,norm");
  auto flag = [&spec](const char* key, const char* fallback) {
    const std::string v = spec.option(key, fallback);
    KVQ_CHECK(v == "0" || v == "1", spec.str(), ": option ", key, " must be 0 or 1, got '", v, "'");
    return v == "1";
  };
  return std::make_unique<VecInferCodec>(spec, params, spec.arg(0, 8), spec.arg(1, 4), flag("smooth", "1"),
                                         flag("norm", "0"));
}

}  // namespace kvq

// turbo_prod:b (TurboQuant-prod, arXiv 2504.19874): (b-1)-bit turbo_mse of x, then 1-bit QJL (m = d rows) of the
// residual r = x - x^mse, storing sign(S r) and ||r||. The QJL estimate of <q, r> is unbiased, so
// <q, x^mse> + est(<q, r>) is an unbiased estimate of <q, x>, with d * variance ~ (pi/2) * D_mse(b-1) for unit
// vectors. The residual is taken against x^mse exactly as decode produces it (fp16 norm, float centroids, float
// inverse rotation), so that the decoded key's error is exactly what the sketch encodes.
// Codec model: space [rotated (d) | sketch (m)], A q = [R q, S q], y = [||x|| c[idx], sqrt(pi/2)/m ||r|| sign(S r)],
// decode = R^T a + S^T b. Layout: layout::TurboProd.
#include <cstring>
#include <memory>

#include "codec/turbo_mse.hpp"

#include "codec/block_layout.hpp"
#include "codec/codec_factories.hpp"
#include "codec/lane_norm.hpp"
#include "codec/qjl_sketch.hpp"
#include "codec/turbo_parts.hpp"
#include "kvq/detail/random.hpp"
#include "kvq/error.hpp"

namespace kvq {
namespace {

class TurboProdCodec final : public Codec {
 public:
  TurboProdCodec(const CodecSpec& spec, const CodecParams& params, int bits)
      : Codec(spec, params),
        layout_{static_cast<size_t>(params.dim), static_cast<size_t>(params.block_tokens), static_cast<size_t>(bits),
                static_cast<size_t>(params.dim), params.role == Role::key},
        codebook_(sphere_lloyd_max(params.dim, bits - 1)),
        nibble_levels_(nibble_levels(bits - 1, codebook_.centroids())),
        sketch_(params.dim, params.dim, derive_seed(params.seed, 2)) {
    rotation_ = rotation_from_spec(spec, params);
    set_layout(layout_.block_bytes(), params.dim + sketch_.rows());
  }

  int rows() const { return sketch_.rows(); }
  const float* centroids() const { return codebook_.centroids(); }
  /// Token t's MSE-stage indices (d bytes), and its stored norm.
  float unpack(const uint8_t* block, int t, uint8_t* idx) const {
    read_lane_codes(layout_.mse().codes(), t, block, idx);
    return load_f16(block + layout_.mse().norms_offset(), t);
  }
  const layout::TurboProd& layout() const { return layout_; }
  const float* nibble_level_table() const { return nibble_levels_.data(); }
  float sketch_scale() const { return sketch_.scale(); }
  /// Token t's residual sign bits (m bits, bitpack.hpp order) gathered from the sign tiles into `bits`.
  const uint8_t* signs(const uint8_t* block, int t, uint8_t* bits) const {
    return read_sign_bits(layout_.signs(), block + layout_.signs_offset(), static_cast<size_t>(t), bits);
  }
  /// sqrt(pi/2)/m ||r_t||: the magnitude of token t's coordinates in the sketch space.
  float magnitude(const uint8_t* block, int t) const {
    return sketch_.scale() * load_f16(block + layout_.residual_norms_offset(), t);
  }

 protected:
  void encode_block(const float* x, int n, uint8_t* block) const override {
    const int d = dim();
    const float zero[kMaxCodecDim] = {};
    float u[kMaxCodecDim], mse[kMaxCodecDim];
    uint8_t idx[kMaxCodecDim];
    double r[kMaxCodecDim];
    std::memset(block, 0, block_bytes());
    for (int t = 0; t < block_tokens(); ++t) {
      const float* xt = t < n ? x + static_cast<size_t>(t) * d : zero;  // tokens past n: zero vectors
      const uint16_t norm = split_norm(*rotation_, xt, u, spec().str());
      for (int j = 0; j < d; ++j) idx[j] = codebook_.nearest(u[j]);
      write_lane_codes(layout_.mse().codes(), t, idx, block);
      store_f16(block + layout_.mse().norms_offset(), t, norm);

      // The residual against the decoded MSE stage: the same float products and inverse rotation as decode.
      const float stored = f16_to_f32(norm);
      for (int j = 0; j < d; ++j) u[j] = stored * centroids()[idx[j]];
      rotation_->apply_inverse(u, mse, 1);
      for (int j = 0; j < d; ++j) r[j] = static_cast<double>(xt[j]) - mse[j];
      uint8_t bits[kMaxCodecDim / 8];
      sketch_.sign_bits(r, bits);
      write_sign_bits(layout_.signs(), static_cast<size_t>(t), bits, block + layout_.signs_offset());
      store_f16(block + layout_.residual_norms_offset(), t, stored_norm(lane_norm(r, d), spec().str()));
    }
  }

  void decode_block_space(const uint8_t* block, int n, float* y) const override {
    uint8_t idx[kMaxCodecDim];
    const int d = dim(), m = space_dim();
    for (int t = 0; t < n; ++t) {
      float* yt = y + static_cast<size_t>(t) * m;
      const float norm = unpack(block, t, idx);
      for (int j = 0; j < d; ++j) yt[j] = norm * centroids()[idx[j]];
      uint8_t bits[kMaxCodecDim / 8];
      decode_signs(signs(block, t, bits), magnitude(block, t), rows(), yt + d);
    }
  }

  void accumulate_block(const float* w, int n_q, const uint8_t* block, int n, float* acc) const override {
    uint8_t idx[kMaxCodecDim], bits[kMaxCodecDim / 8];
    const int d = dim(), m = space_dim();
    for (int t = 0; t < n; ++t) {
      const float norm = unpack(block, t, idx), magnitude_t = magnitude(block, t);
      signs(block, t, bits);
      for (int i = 0; i < n_q; ++i) {
        const float wt = w[static_cast<size_t>(i) * block_tokens() + t], a = wt * norm;
        float* ai = acc + static_cast<size_t>(i) * m;
        for (int j = 0; j < d; ++j) ai[j] += a * centroids()[idx[j]];
        add_signs(bits, wt * magnitude_t, rows(), ai + d);
      }
    }
  }

  void map_to_space(const float* q, int n_q, float* y) const override {
    const int d = dim(), m = space_dim();
    for (int i = 0; i < n_q; ++i) {
      rotation_->apply(q + static_cast<size_t>(i) * d, y + static_cast<size_t>(i) * m, 1);
      sketch_.apply(q + static_cast<size_t>(i) * d, y + static_cast<size_t>(i) * m + d, 1);
    }
  }

  void map_from_space(const float* y, int n_q, float* x) const override {
    const int d = dim(), m = space_dim();
    float sketched[kMaxCodecDim];
    for (int i = 0; i < n_q; ++i) {
      float* xi = x + static_cast<size_t>(i) * d;
      rotation_->apply_inverse(y + static_cast<size_t>(i) * m, xi, 1);
      sketch_.apply_transpose(y + static_cast<size_t>(i) * m + d, sketched, 1);
      for (int j = 0; j < d; ++j) xi[j] += sketched[j];
    }
  }

  std::unique_ptr<Scorer> make_scorer(const float* q, int n_q) const override;

 private:
  layout::TurboProd layout_;
  FloatCodebook codebook_;
  std::array<float, 16> nibble_levels_;
  QjlSketch sketch_;
};

/// Scores both parts in place: rotated query against the centroids, sketched query against the residual's signs.
class TurboProdScorer final : public Scorer {
 public:
  TurboProdScorer(const TurboProdCodec& codec, const float* q, int n_q)
      : Scorer(n_q, codec.block_tokens()), codec_(codec), q_(static_cast<size_t>(n_q) * codec.space_dim()) {
    codec.to_space(q, n_q, q_.data());
  }

  void scores(const uint8_t* block, int n, float* out) override {
    uint8_t idx[kMaxCodecDim], bits[kMaxCodecDim / 8];
    const int d = codec_.dim(), m = codec_.space_dim();
    const float* c = codec_.centroids();
    for (int t = 0; t < n; ++t) {
      const float norm = codec_.unpack(block, t, idx), magnitude = codec_.magnitude(block, t);
      codec_.signs(block, t, bits);
      for (int i = 0; i < n_queries(); ++i) {
        const float* qi = q_.data() + static_cast<size_t>(i) * m;
        out[static_cast<size_t>(i) * block_tokens() + t] =
            norm * level_dot(qi, c, idx, d) + magnitude * signed_sum(bits, qi + d, codec_.rows());
      }
    }
  }

 private:
  const TurboProdCodec& codec_;
  std::vector<float> q_;  // n_q x (d + m): [R q, S q]
};

std::unique_ptr<Scorer> TurboProdCodec::make_scorer(const float* q, int n_q) const {
  return std::make_unique<TurboProdScorer>(*this, q, n_q);
}

}  // namespace

std::optional<TurboProdParams> turbo_prod_params(const Codec& codec) {
  const auto* c = dynamic_cast<const TurboProdCodec*>(&codec);
  if (!c) return std::nullopt;
  return TurboProdParams{c->layout(), c->nibble_level_table(), c->sketch_scale()};
}

std::unique_ptr<Codec> make_turbo_prod_codec(const CodecSpec& spec, const CodecParams& params) {
  check_spec_shape(spec, 1, "rot");
  KVQ_CHECK(spec.args.size() == 1, "codec '", spec.str(), "' needs a bit width: turbo_prod:B with B in 2..4");
  const int bits = spec.args[0];
  KVQ_CHECK(bits >= 2 && bits <= 4, "codec '", spec.str(), "': turbo_prod bit width ", bits,
            " out of range (2..4: b-1 bits of turbo_mse plus a 1-bit residual sketch)");
  return std::make_unique<TurboProdCodec>(spec, params, bits);
}

}  // namespace kvq

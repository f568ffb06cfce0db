// qjl:m (QJL, arXiv 2406.03482): a key is stored as sign(S k) (m bits) and ||k|| (fp16), S an m x d Gaussian
// sketch; <q, k> ~= sqrt(pi/2)/m ||k|| <S q, sign(S k)>, unbiased. m defaults to d.
// Codec model: A = S (space_dim = m), y = sqrt(pi/2)/m ||k|| sign(S k), decode = S^T y. No rotation.
// Layout: layout::Qjl.
#include <cstring>
#include <memory>

#include "codec/block_layout.hpp"
#include "codec/codec_factories.hpp"
#include "codec/lane_norm.hpp"
#include "codec/qjl_sketch.hpp"
#include "codec/turbo_mse.hpp"
#include "codec/turbo_parts.hpp"
#include "kvq/detail/random.hpp"
#include "kvq/error.hpp"

namespace kvq {
namespace {

constexpr int kMaxSignBytes = 4096 / 8;  // the most sketch rows a qjl codec takes

class QjlCodec final : public Codec {
 public:
  QjlCodec(const CodecSpec& spec, const CodecParams& params, int rows)
      : Codec(spec, params),
        layout_{static_cast<size_t>(params.dim), static_cast<size_t>(params.block_tokens), static_cast<size_t>(rows)},
        sketch_(rows, params.dim, derive_seed(params.seed, 2)) {
    set_layout(layout_.block_bytes(), rows);
  }

  const QjlSketch& sketch() const { return sketch_; }
  /// Token t's sign bits (m bits, bitpack.hpp order) gathered from the sign tiles into `bits`.
  const uint8_t* signs(const uint8_t* block, int t, uint8_t* bits) const {
    return read_sign_bits(layout_.signs(), block, static_cast<size_t>(t), bits);
  }
  const layout::Qjl& layout() const { return layout_; }
  /// sqrt(pi/2)/m ||k_t||: the magnitude of every coordinate of token t in the sketch space.
  float magnitude(const uint8_t* block, int t) const {
    return sketch_.scale() * load_f16(block + layout_.norms_offset(), t);
  }

 protected:
  void encode_block(const float* x, int n, uint8_t* block) const override {
    double k[kMaxCodecDim];
    uint8_t bits[kMaxSignBytes];
    const int d = dim();
    std::memset(block, 0, block_bytes());
    for (int t = 0; t < block_tokens(); ++t) {
      for (int j = 0; j < d; ++j) k[j] = t < n ? x[static_cast<size_t>(t) * d + j] : 0.0f;  // past n: zero vectors
      sketch_.sign_bits(k, bits);
      write_sign_bits(layout_.signs(), static_cast<size_t>(t), bits, block);
      store_f16(block + layout_.norms_offset(), t, stored_norm(lane_norm(k, d), spec().str()));
    }
  }

  void decode_block_space(const uint8_t* block, int n, float* y) const override {
    uint8_t bits[kMaxSignBytes];
    const int m = space_dim();
    for (int t = 0; t < n; ++t)
      decode_signs(signs(block, t, bits), magnitude(block, t), m, y + static_cast<size_t>(t) * m);
  }

  void accumulate_block(const float* w, int n_q, const uint8_t* block, int n, float* acc) const override {
    uint8_t bits[kMaxSignBytes];
    const int m = space_dim();
    for (int t = 0; t < n; ++t) {
      signs(block, t, bits);
      for (int i = 0; i < n_q; ++i) {
        const float a = w[static_cast<size_t>(i) * block_tokens() + t] * magnitude(block, t);
        add_signs(bits, a, m, acc + static_cast<size_t>(i) * m);
      }
    }
  }

  void map_to_space(const float* q, int n_q, float* y) const override { sketch_.apply(q, y, n_q); }
  void map_from_space(const float* y, int n_q, float* x) const override { sketch_.apply_transpose(y, x, n_q); }
  std::unique_ptr<Scorer> make_scorer(const float* q, int n_q) const override;

 private:
  layout::Qjl layout_;
  QjlSketch sketch_;
};

/// Scores with the sketched queries S q: a signed sum per key, no decoded keys.
class QjlScorer final : public Scorer {
 public:
  QjlScorer(const QjlCodec& codec, const float* q, int n_q)
      : Scorer(n_q, codec.block_tokens()), codec_(codec), sq_(static_cast<size_t>(n_q) * codec.space_dim()) {
    codec.to_space(q, n_q, sq_.data());
  }

  void scores(const uint8_t* block, int n, float* out) override {
    uint8_t bits[kMaxSignBytes];
    const int m = codec_.space_dim();
    for (int t = 0; t < n; ++t) {
      const float a = codec_.magnitude(block, t);
      codec_.signs(block, t, bits);
      for (int i = 0; i < n_queries(); ++i)
        out[static_cast<size_t>(i) * block_tokens() + t] =
            a * signed_sum(bits, sq_.data() + static_cast<size_t>(i) * m, m);
    }
  }

 private:
  const QjlCodec& codec_;
  std::vector<float> sq_;  // n_q x m
};

std::unique_ptr<Scorer> QjlCodec::make_scorer(const float* q, int n_q) const {
  return std::make_unique<QjlScorer>(*this, q, n_q);
}

}  // namespace

std::optional<QjlParams> qjl_params(const Codec& codec) {
  const auto* c = dynamic_cast<const QjlCodec*>(&codec);
  if (!c) return std::nullopt;
  return QjlParams{c->layout(), c->sketch().scale()};
}

std::unique_ptr<Codec> make_qjl_codec(const CodecSpec& spec, const CodecParams& params) {
  check_spec_shape(spec, 1, "");
  const int rows = spec.arg(0, params.dim);  // the default m = d is valid for every d the codecs accept
  KVQ_CHECK(spec.args.empty() || (rows >= 8 && rows <= 4096 && rows % 8 == 0), "codec '", spec.str(),
            "': qjl sketch rows ", rows, " unsupported (need a multiple of 8 in 8..4096)");
  return std::make_unique<QjlCodec>(spec, params, rows);
}

}  // namespace kvq

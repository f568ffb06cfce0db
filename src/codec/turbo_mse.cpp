// turbo_mse:b (TurboQuant-MSE, arXiv 2504.19874): x = ||x|| u; u is rotated, and each coordinate of R u, whose
// density is that of one coordinate of a random unit vector, goes to the nearest centroid of its b-bit Lloyd–Max
// codebook. Codec space: the rotated space, y = ||x|| c[idx]. Layout: layout::TurboMse.
#include <cstring>
#include <memory>

#include "codec/turbo_mse.hpp"

#include "codec/block_layout.hpp"
#include "codec/codec_factories.hpp"
#include "codec/turbo_parts.hpp"
#include "kvq/error.hpp"

namespace kvq {
namespace {

class TurboMseCodec final : public Codec {
 public:
  TurboMseCodec(const CodecSpec& spec, const CodecParams& params, int bits)
      : Codec(spec, params),
        layout_{static_cast<size_t>(params.dim), static_cast<size_t>(params.block_tokens), static_cast<size_t>(bits),
                params.role == Role::key},
        codebook_(sphere_lloyd_max(params.dim, bits)),
        nibble_levels_(nibble_levels(bits, codebook_.centroids())) {
    rotation_ = rotation_from_spec(spec, params);
    set_layout(layout_.block_bytes(), params.dim);
  }

  int bits() const { return codebook_.bits(); }
  const float* levels() const { return codebook_.centroids(); }
  const layout::TurboMse& layout() const { return layout_; }
  const float* nibble_level_table() const { return nibble_levels_.data(); }
  /// Token t's indices (d bytes) and stored norm.
  float unpack(const uint8_t* block, int t, uint8_t* idx) const {
    read_lane_codes(layout_.codes(), t, block, idx);
    return load_f16(block + layout_.norms_offset(), t);
  }

 protected:
  void encode_block(const float* x, int n, uint8_t* block) const override {
    float u[kMaxCodecDim];
    uint8_t idx[kMaxCodecDim];
    const int d = dim();
    std::memset(block, 0, block_bytes());
    for (int t = 0; t < block_tokens(); ++t) {
      uint16_t norm = 0;
      if (t < n) {
        norm = split_norm(*rotation_, x + static_cast<size_t>(t) * d, u, spec().str());
        for (int j = 0; j < d; ++j) idx[j] = codebook_.nearest(u[j]);
      } else {
        for (int j = 0; j < d; ++j) idx[j] = 0;  // a zero vector: norm 0
      }
      write_lane_codes(layout_.codes(), t, idx, block);
      store_f16(block + layout_.norms_offset(), t, norm);
    }
  }

  void decode_block_space(const uint8_t* block, int n, float* y) const override {
    decode_levels(*this, block, n, y);
  }
  void accumulate_block(const float* w, int n_q, const uint8_t* block, int n, float* acc) const override {
    accumulate_levels(*this, w, n_q, block, n, acc);
  }
  std::unique_ptr<Scorer> make_scorer(const float* q, int n_q) const override {
    return std::make_unique<LevelScorer<TurboMseCodec>>(*this, q, n_q);
  }

 private:
  layout::TurboMse layout_;
  FloatCodebook codebook_;
  std::array<float, 16> nibble_levels_;
};

}  // namespace

std::optional<TurboMseParams> turbo_mse_params(const Codec& codec) {
  const auto* c = dynamic_cast<const TurboMseCodec*>(&codec);
  if (!c) return std::nullopt;
  return TurboMseParams{c->layout(), c->nibble_level_table()};
}

std::unique_ptr<Codec> make_turbo_mse_codec(const CodecSpec& spec, const CodecParams& params) {
  check_spec_shape(spec, 1, "rot");
  KVQ_CHECK(spec.args.size() == 1, "codec '", spec.str(), "' needs a bit width: turbo_mse:B with B in 1..4");
  const int bits = spec.args[0];
  KVQ_CHECK(bits >= 1 && bits <= 4, "codec '", spec.str(), "': turbo_mse bit width ", bits,
            " out of range (1..4)");
  return std::make_unique<TurboMseCodec>(spec, params, bits);
}

}  // namespace kvq

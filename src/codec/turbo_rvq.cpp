// turbo_rvq:b: two-stage residual scalar quantization of the rotated unit vector, 2b bits per coordinate. Stage 1
// is turbo_mse's b-bit Lloyd–Max codebook c1; stage 2 quantizes the residual u_j - c1[i1_j] with the b-bit
// Lloyd–Max codebook c2 of that residual's distribution (lloyd_max.hpp). Decode: ||x|| (c1[i1] + c2[i2]) in the
// rotated space. The two stages together form a 2^(2b)-level codebook that is not optimal (turbo_mse:2b is
// better), but each stage stays a b-bit stream that a kernel can read separately.
// Layout: layout::TurboRvq.
#include <array>
#include <memory>

#include "codec/block_layout.hpp"
#include "codec/codec_factories.hpp"
#include "codec/turbo_mse.hpp"
#include "codec/turbo_parts.hpp"
#include "core/bitpack.hpp"
#include "kvq/error.hpp"

namespace kvq {
namespace {

class TurboRvqCodec final : public Codec {
 public:
  TurboRvqCodec(const CodecSpec& spec, const CodecParams& params, int bits)
      : Codec(spec, params),
        layout_{static_cast<size_t>(params.dim), static_cast<size_t>(params.block_tokens), static_cast<size_t>(bits)},
        stage1_(sphere_lloyd_max(params.dim, bits)),
        stage2_(sphere_residual_lloyd_max(params.dim, bits, bits)) {
    // levels_[i1 << b | i2] = c1[i1] + c2[i2] of the fp16-precision codebooks (the sum is exact in float).
    for (int i = 0; i < stage1_.size(); ++i)
      for (int j = 0; j < stage2_.size(); ++j) levels_.push_back(stage1_[i] + stage2_[j]);
    for (int e = 0; e < 16; ++e) {
      stage_levels_[0][e] = stage1_[e % stage1_.size()];
      stage_levels_[1][e] = stage2_[e % stage2_.size()];
    }
    rotation_ = rotation_from_spec(spec, params);
    set_layout(layout_.block_bytes(), params.dim);
  }

  const float* levels() const { return levels_.data(); }
  const layout::TurboRvq& layout() const { return layout_; }
  /// Stage s's level of each value 0..15 of a b-bit index (e % 2^b), for the CUDA kernels' lookup tables.
  const float* stage_levels(int s) const { return stage_levels_[s].data(); }
  /// Token t's combined level indices (i1 << b | i2, d bytes) and its stored norm.
  float unpack(const uint8_t* block, int t, uint8_t* level) const {
    uint8_t second[kMaxCodecDim];
    const int d = dim(), b = stage1_.bits();
    unpack_bits(block + t * layout_.code_bytes(), d, b, level);
    unpack_bits(block + layout_.stage2_offset() + t * layout_.code_bytes(), d, b, second);
    for (int j = 0; j < d; ++j) level[j] = static_cast<uint8_t>(level[j] << b | second[j]);
    return load_f16(block + layout_.norms_offset(), t);
  }

 protected:
  void encode_block(const float* x, int n, uint8_t* block) const override {
    float u[kMaxCodecDim];
    uint8_t first[kMaxCodecDim], second[kMaxCodecDim];
    const int d = dim(), b = stage1_.bits();
    for (int t = 0; t < block_tokens(); ++t) {
      uint16_t norm = 0;
      if (t < n) {
        norm = split_norm(*rotation_, x + static_cast<size_t>(t) * d, u, spec().str());
        for (int j = 0; j < d; ++j) {
          first[j] = stage1_.nearest(u[j]);
          second[j] = stage2_.nearest(u[j] - stage1_[first[j]]);
        }
      } else {
        for (int j = 0; j < d; ++j) first[j] = second[j] = 0;  // a zero vector: norm 0
      }
      pack_bits(first, d, b, block + t * layout_.code_bytes());
      pack_bits(second, d, b, block + layout_.stage2_offset() + t * layout_.code_bytes());
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
    return std::make_unique<LevelScorer<TurboRvqCodec>>(*this, q, n_q);
  }

 private:
  layout::TurboRvq layout_;
  FloatCodebook stage1_, stage2_;
  std::vector<float> levels_;  // 2^(2b) combined levels
  std::array<std::array<float, 16>, 2> stage_levels_;
};

}  // namespace

std::optional<TurboRvqParams> turbo_rvq_params(const Codec& codec) {
  const auto* c = dynamic_cast<const TurboRvqCodec*>(&codec);
  if (!c) return std::nullopt;
  return TurboRvqParams{c->layout(), {c->stage_levels(0), c->stage_levels(1)}};
}

std::unique_ptr<Codec> make_turbo_rvq_codec(const CodecSpec& spec, const CodecParams& params) {
  check_spec_shape(spec, 1, "rot");
  KVQ_CHECK(spec.args.size() == 1, "codec '", spec.str(), "' needs a bit width per stage: turbo_rvq:B with B in 1..4");
  const int bits = spec.args[0];
  KVQ_CHECK(bits >= 1 && bits <= 4, "codec '", spec.str(), "': turbo_rvq bit width ", bits,
            " out of range (1..4 per stage, 2..8 bits per element in all)");
  return std::make_unique<TurboRvqCodec>(spec, params, bits);
}

}  // namespace kvq

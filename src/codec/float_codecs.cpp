// f32, f16, bf16: the uncompressed baselines. Layout: T tokens x d values, token-major, little-endian;
// bits per element 32 / 16 / 16. No rotation: the codec space is the original space. A value that would round to
// Inf in f16 (|x| >= 65520) or bf16 is rejected like a non-finite one: blocks hold finite values only.
#include <cstring>

#include "codec/block_layout.hpp"
#include "codec/codec_factories.hpp"
#include "core/half.hpp"
#include "kvq/error.hpp"

namespace kvq {
namespace {

enum class FloatFormat { f32, f16, bf16 };

class FloatCodec final : public Codec {
 public:
  FloatCodec(const CodecSpec& spec, const CodecParams& params, FloatFormat format)
      : Codec(spec, params), format_(format) {
    const size_t width = format == FloatFormat::f32 ? 4 : 2;
    const layout::Float l{static_cast<size_t>(params.dim), static_cast<size_t>(params.block_tokens), width};
    set_layout(l.block_bytes(), params.dim);
  }

 protected:
  void encode_block(const float* x, int n, uint8_t* block) const override {
    const size_t count = static_cast<size_t>(n) * dim();
    std::memset(block, 0, block_bytes());
    if (format_ == FloatFormat::f32) {
      std::memcpy(block, x, count * sizeof(float));
      return;
    }
    for (size_t i = 0; i < count; ++i) {
      const uint16_t h = format_ == FloatFormat::f16 ? f32_to_f16(x[i]) : f32_to_bf16(x[i]);
      // A finite input beyond the format's range would be stored as Inf and poison every later attention call.
      KVQ_CHECK((h & 0x7fffu) != (format_ == FloatFormat::f16 ? 0x7c00u : 0x7f80u), spec().str(), ": token ",
                i / static_cast<size_t>(dim()), " channel ", i % static_cast<size_t>(dim()), " is ", x[i],
                ", beyond the format's range");
      std::memcpy(block + 2 * i, &h, 2);  // blocks carry no alignment promise
    }
  }
  void decode_block_space(const uint8_t* block, int n, float* y) const override {
    const size_t count = static_cast<size_t>(n) * dim();
    if (format_ == FloatFormat::f32) {
      std::memcpy(y, block, count * sizeof(float));
      return;
    }
    for (size_t i = 0; i < count; ++i) {
      uint16_t h;
      std::memcpy(&h, block + 2 * i, 2);
      y[i] = format_ == FloatFormat::f16 ? f16_to_f32(h) : bf16_to_f32(h);
    }
  }

 private:
  FloatFormat format_;
};

}  // namespace

std::unique_ptr<Codec> make_float_codec(const CodecSpec& spec, const CodecParams& params) {
  check_spec_shape(spec, 0, "");
  const FloatFormat format = spec.name == "f32" ? FloatFormat::f32
                             : spec.name == "f16" ? FloatFormat::f16
                                                  : FloatFormat::bf16;
  return std::make_unique<FloatCodec>(spec, params, format);
}

}  // namespace kvq

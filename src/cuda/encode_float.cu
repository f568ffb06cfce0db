// The append kernel of f32, f16 and bf16 (src/codec/float_codecs.cpp): token-major values, rounded to nearest even;
// an f16 or bf16 value that would round to Inf is reported. Bit-exact with the CPU encoder.
#include <memory>

#include "cuda/device_half.cuh"
#include "cuda/encode_kernel.cuh"

namespace kvq::cuda::detail {
namespace {

enum class Width { f32, f16, bf16 };

struct FloatEnc {
  static constexpr int kBlocksPerSM = 4;  // as many as fit in shared memory at T = 64, d = 128
  Width width = Width::f16;
  __host__ __device__ size_t scratch_floats(int, int) const { return 0; }
  __device__ void encode(const EncodeContext& ctx, float* x, float*, uint32_t* block) const {
    const int n = ctx.T * ctx.d;
    if (width == Width::f32) {
      for (int i = threadIdx.x; i < n; i += blockDim.x) block[i] = __float_as_uint(x[i]);
      return;
    }
    const uint32_t inf = width == Width::f16 ? 0x7c00u : 0x7f80u;
    for (int w = threadIdx.x; w < n / 2; w += blockDim.x) {
      uint32_t word = 0;
      for (int k = 0; k < 2; ++k) {
        const int i = 2 * w + k;
        const uint16_t h = width == Width::f16 ? to_f16_bits(x[i]) : to_bf16_bits(x[i]);
        if ((h & 0x7fffu) == inf) ctx.report(ctx.dd.div(i), ctx.dd.mod(i));
        word |= static_cast<uint32_t>(h) << (16 * k);
      }
      block[w] = word;  // one thread per word
    }
  }
};

class FloatEncoder final : public EncoderOf<FloatEnc> {
 public:
  FloatEncoder(Width width, std::string name) : EncoderOf(std::move(name)) { enc_.width = width; }
};

}  // namespace

std::unique_ptr<DeviceEncoder> make_float_encoder(const Codec& codec) {
  const std::string& name = codec.spec().name;
  if (name != "f32" && name != "f16" && name != "bf16") return nullptr;
  const Width w = name == "f32" ? Width::f32 : name == "f16" ? Width::f16 : Width::bf16;
  return std::make_unique<FloatEncoder>(w, codec.spec().str());
}

}  // namespace kvq::cuda::detail

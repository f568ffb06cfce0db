// The append kernel of turbo_rvq:b (src/codec/turbo_rvq.cpp): the turbo_mse stage (turbo_mse_device.cuh) in place
// on the page's tile gives stage 1's index i1 of each rotated coordinate u; stage 2's index is the nearest level of
// the residual codebook to u - c1[i1] (a rounded float difference, as the CPU). Both stages are packed per token as
// bitpack.hpp streams of b-bit indices, the norm as fp16. Bit-exact with the CPU encoder under the Hadamard
// rotation; other rotations differ in float order (dense matrix).
#include <memory>

#include "codec/codec_factories.hpp"
#include "codec/lloyd_max.hpp"
#include "codec/turbo_mse.hpp"
#include "codec/turbo_parts.hpp"
#include "cuda/encode_kernel.cuh"
#include "cuda/rotate_device.cuh"
#include "cuda/stream_bits.cuh"
#include "cuda/turbo_mse_device.cuh"

namespace kvq::cuda::detail {
namespace {

constexpr int kMaxStageLevels = 16;  // 4 bits per stage

struct TurboRvqEnc {
  static constexpr int kBlocksPerSM = 4;
  TurboMseStage stage1;
  float stage1_levels[kMaxStageLevels] = {};
  LevelBoundaries stage2;
  uint32_t code_bytes = 0, stage2_offset = 0;

  // The token norms (TokenNorm), then the dense rotation's spare rows.
  __host__ __device__ size_t scratch_floats(int T, int d) const {
    return TurboMseStage::norms_floats(T) + stage1.spare_floats(T, d);
  }

  __device__ void encode(const EncodeContext& ctx, float* x, float* scratch, uint32_t* block) const {
    const int T = ctx.T, d = ctx.d, b = stage1.book.bits;
    TokenNorm* norms = reinterpret_cast<TokenNorm*>(scratch);
    stage1.store_norms(ctx, x, norms, block);
    __syncthreads();
    TurboMseStage::normalize(ctx.dd, x, norms, x, T * d);
    __syncthreads();
    stage1.rotate_page(ctx, x, scratch + TurboMseStage::norms_floats(T));
    const uint32_t width = static_cast<uint32_t>(b);
    for (int i = threadIdx.x; i < T * d; i += blockDim.x) {
      const int t = ctx.dd.div(i), c = ctx.dd.mod(i);
      const uint32_t first = stage1.book.index(x[i]);
      const uint32_t second = stage2.index(__fsub_rn(x[i], stage1_levels[first]));
      put_stream_bits(block, stream_code_bit(0, code_bytes, t, c, b), first, width);
      put_stream_bits(block, stream_code_bit(stage2_offset, code_bytes, t, c, b), second, width);
    }
  }
};

class TurboRvqEncoder final : public EncoderOf<TurboRvqEnc> {
 public:
  TurboRvqEncoder(const Codec& codec, const TurboRvqParams& p) : EncoderOf(codec.spec().str()) {
    const int d = codec.dim(), b = static_cast<int>(p.layout.bits);
    rotation_ = upload_rotation(*rotation_from_spec(codec.spec(), codec.params()));  // the codec's own (same seed)
    const FloatCodebook stage1(sphere_lloyd_max(d, b)), stage2(sphere_residual_lloyd_max(d, b, b));
    enc_.stage1 = turbo_mse_stage({rotation_.signs.get(), rotation_.columns.get(), rotation_.scale}, stage1,
                                  p.layout.norms_offset());
    for (int k = 0; k < stage1.size(); ++k) enc_.stage1_levels[k] = stage1[k];
    enc_.stage2 = level_boundaries(stage2);
    enc_.code_bytes = static_cast<uint32_t>(p.layout.code_bytes());
    enc_.stage2_offset = static_cast<uint32_t>(p.layout.stage2_offset());
  }

 private:
  DeviceRotation rotation_;
};

}  // namespace

std::unique_ptr<DeviceEncoder> make_turbo_rvq_encoder(const Codec& codec) {
  const auto p = turbo_rvq_params(codec);
  if (!p) return nullptr;
  return std::make_unique<TurboRvqEncoder>(codec, *p);
}

}  // namespace kvq::cuda::detail

// The append kernel of turbo_mse:1..4 (src/codec/turbo_mse.cpp): the turbo_mse stage (turbo_mse_device.cuh) in
// place on the page's tile, the indices packed as layout::LaneCodes, the norm as fp16. Bit-exact with the CPU
// encoder under the Hadamard rotation; other rotations differ in float order (dense matrix).
#include <memory>

#include "codec/lloyd_max.hpp"
#include "codec/turbo_mse.hpp"
#include "codec/turbo_parts.hpp"
#include "cuda/encode_kernel.cuh"
#include "cuda/rotate_device.cuh"
#include "cuda/turbo_mse_device.cuh"

namespace kvq::cuda::detail {
namespace {

struct TurboMseEnc {
  TurboMseStage stage;
  bool key = true;

  // The token norms (T doubles), then the dense rotation's spare rows.
  __host__ __device__ size_t scratch_floats(int T, int d) const {
    return 2 * static_cast<size_t>(T) + stage.spare_floats(T, d);
  }

  __device__ void encode(const EncodeContext& ctx, float* x, float* scratch, uint32_t* block) const {
    const int T = ctx.T, d = ctx.d;
    double* norms = reinterpret_cast<double*>(scratch);
    stage.store_norms(ctx, x, norms, block);
    __syncthreads();
    TurboMseStage::normalize(ctx.dd, x, norms, x, T * d);
    __syncthreads();
    stage.rotate_page(ctx, x, scratch + 2 * T);
    for (int i = threadIdx.x; i < T * d; i += blockDim.x)
      put_lane_index(block, key, d, stage.book.bits, ctx.dd.div(i), ctx.dd.mod(i), stage.book.index(x[i]));
  }
};

class TurboMseEncoder final : public EncoderOf<TurboMseEnc> {
 public:
  TurboMseEncoder(const Codec& codec, const TurboMseParams& p)
      : EncoderOf(codec.spec().str()), rotation_(upload_rotation(codec)) {
    const FloatCodebook book(sphere_lloyd_max(codec.dim(), static_cast<int>(p.layout.bits)));
    enc_.stage = turbo_mse_stage({rotation_.signs.get(), rotation_.columns.get(), rotation_.scale}, book,
                                 p.layout.norms_offset());
    enc_.key = p.layout.key;
  }

 private:
  DeviceRotation rotation_;
};

}  // namespace

std::unique_ptr<DeviceEncoder> make_turbo_mse_encoder(const Codec& codec) {
  const auto p = turbo_mse_params(codec);
  if (!p) return nullptr;
  return std::make_unique<TurboMseEncoder>(codec, *p);
}

}  // namespace kvq::cuda::detail

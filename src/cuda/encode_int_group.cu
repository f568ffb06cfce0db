// The append kernel of int8 and int4 (src/codec/int_group.cpp): rotate, divide by the trained per-channel lambda,
// then per token and group an fp16 absmax scale (nearest, up where the nearest would leave a code past qmax + 1/2)
// and codes round(x / s) clamped to +-qmax in the 64-byte lane tiles of layout::IntGroup, each 32-bit lane built
// by one thread. Bit-exact with the CPU encoder under the Hadamard rotation; other rotations differ in float order
// (dense matrix).
#include <memory>

#include "codec/block_layout.hpp"
#include "codec/int_group.hpp"
#include "cuda/device_half.cuh"
#include "cuda/encode_kernel.cuh"
#include "cuda/rotate_device.cuh"

namespace kvq::cuda::detail {
namespace {

struct IntEnc {
  static constexpr int kBlocksPerSM = 4;
  RotationView rot;
  const float* lambda = nullptr;
  int lb = 2, lg = 5, qmax = 7;  // log2 of the code bits and of the group size
  bool key = true;
  uint32_t scales_offset = 0;
  int code_words = 0;  // 32-bit words of the codes section

  // The dense rotation's spare tile, then the group scales as floats.
  __host__ __device__ size_t scratch_floats(int T, int d) const {
    return (rot.hadamard() ? 0 : static_cast<size_t>(T) * d) + static_cast<size_t>(T) * (d >> lg);
  }

  __device__ void encode(const EncodeContext& ctx, float* x, float* scratch, uint32_t* block) const {
    const int T = ctx.T, d = ctx.d, G = 1 << lg, groups = d >> lg;
    rotate_rows(rot, x, scratch, T, d, ctx.dd);
    float* scales = scratch + (rot.hadamard() ? 0 : T * d);
    for (int i = threadIdx.x; i < T * d; i += blockDim.x) x[i] = __fdiv_rn(x[i], lambda[ctx.dd.mod(i)]);
    __syncthreads();
    const FastDiv gd = FastDiv::of(groups);
    for (int k = threadIdx.x; k < T * groups; k += blockDim.x) {  // group_scale of int_group.cpp
      const int t = gd.div(k), g = gd.mod(k);
      const float* v = x + t * d + g * G;
      // Each lane starts at another element: the groups of a warp start in one shared-memory bank, and the
      // maximum of the magnitudes does not depend on the order.
      const int start = static_cast<int>(threadIdx.x) & 31;
      float amax = 0;
      for (int i = 0; i < G; ++i) amax = fmaxf(amax, fabsf(v[(i + start) & (G - 1)]));
      const double exact = __ddiv_rn(static_cast<double>(amax), static_cast<double>(qmax));
      uint16_t h = to_f16_bits(__double2float_rn(exact));
      if (!(static_cast<double>(amax) <= __dmul_rn(qmax + 0.5, static_cast<double>(f16_bits_to_float(h)))))
        h = f16_bits_round_up(exact);
      float s = f16_bits_to_float(h);
      if (!isfinite(s)) {
        ctx.report(t, g * G);
        s = 0;
      }
      scales[k] = s;
      put_half(block, scales_offset + int_scale_byte(groups, t, g), h);
    }
    __syncthreads();
    const uint32_t mask = (1u << (1 << lb)) - 1;
    const float lim = static_cast<float>(qmax);
    auto code = [&](int t, int c, float v) {
      const float s = scales[t * groups + (c >> lg)];
      const int q = s > 0 ? static_cast<int>(fminf(fmaxf(rintf(__fdiv_rn(v, s)), -lim), lim)) : 0;
      return static_cast<uint32_t>(q) & mask;
    };
    pack_lane_tile_words(key, lb, T, d, code_words, x, block, code);
  }
};

int log2_of(int x) { return FastDiv::of(x).shift; }

class IntGroupEncoder final : public EncoderOf<IntEnc> {
 public:
  IntGroupEncoder(const Codec& codec, const IntGroupParams& p)
      : EncoderOf(codec.spec().str()), rotation_(upload_rotation(codec)) {
    const size_t d = static_cast<size_t>(codec.dim());
    lambda_ = upload_floats(p.lambda, d);
    const bool key = codec.role() == Role::key;
    const layout::IntGroup l{d, static_cast<size_t>(codec.block_tokens()), static_cast<size_t>(p.bits),
                             static_cast<size_t>(p.group), key};
    enc_.rot = {rotation_.signs.get(), rotation_.columns.get(), rotation_.scale};
    enc_.lambda = lambda_.get();
    enc_.lb = log2_of(p.bits);
    enc_.lg = log2_of(p.group);
    enc_.qmax = p.bits == 8 ? 127 : 7;
    enc_.key = key;
    enc_.scales_offset = static_cast<uint32_t>(l.scales_offset());
    enc_.code_words = static_cast<int>(l.code_tokens() * d * l.bits / 32);
  }

 private:
  DeviceRotation rotation_;
  std::shared_ptr<float> lambda_;
};

}  // namespace

std::unique_ptr<DeviceEncoder> make_int_group_encoder(const Codec& codec) {
  const auto p = int_group_params(codec);
  if (!p) return nullptr;
  return std::make_unique<IntGroupEncoder>(codec, *p);
}

}  // namespace kvq::cuda::detail

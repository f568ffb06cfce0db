// The append kernel of int8 and int4 (src/codec/int_group.cpp): rotate, divide by the trained per-channel lambda,
// then per token and group an fp16 absmax scale (nearest, up where the nearest would leave a code past qmax + 1/2)
// and codes round(x / s) clamped to +-qmax in the 64-byte lane tiles of layout::IntGroup. Bit-exact with the CPU
// encoder under the Hadamard rotation; other rotations differ in float order (dense matrix).
#include <memory>

#include "codec/int_group.hpp"
#include "cuda/device_half.cuh"
#include "cuda/encode_kernel.cuh"
#include "cuda/rotate_device.cuh"
#include "kvq/block_layout.hpp"

namespace kvq::cuda::detail {
namespace {

struct IntEnc {
  RotationView rot;
  const float* lambda;
  int bits, G, qmax;
  bool key;
  uint32_t scales_offset;

  __host__ __device__ size_t scratch_floats(int T, int d) const {
    return rot.hadamard() ? 0 : static_cast<size_t>(T) * d;
  }

  __device__ void encode(const EncodeContext& ctx, float* x, float* scratch, uint32_t* block) const {
    const int T = ctx.T, d = ctx.d, groups = d / G;
    rotate_rows(rot, x, scratch, T, d);
    for (int i = threadIdx.x; i < T * d; i += blockDim.x) x[i] = __fdiv_rn(x[i], lambda[i % d]);
    __syncthreads();
    const uint32_t mask = (1u << bits) - 1;
    const float lim = static_cast<float>(qmax);
    for (int k = threadIdx.x; k < T * groups; k += blockDim.x) {
      const int t = k / groups, g = k % groups;
      const float* v = x + t * d + g * G;
      float amax = 0;
      for (int i = 0; i < G; ++i) amax = fmaxf(amax, fabsf(v[i]));
      // group_scale of int_group.cpp
      const double exact = __ddiv_rn(static_cast<double>(amax), static_cast<double>(qmax));
      uint16_t h = to_f16_bits(__double2float_rn(exact));
      if (!(static_cast<double>(amax) <= __dmul_rn(qmax + 0.5, static_cast<double>(f16_bits_to_float(h)))))
        h = f16_bits_round_up(exact);
      const float s = f16_bits_to_float(h);
      if (!isfinite(s)) {
        ctx.report(t, g * G);
        continue;
      }
      for (int i = 0; i < G; ++i) {
        const int q = s > 0 ? static_cast<int>(fminf(fmaxf(rintf(__fdiv_rn(v[i], s)), -lim), lim)) : 0;
        put_bits(block, lane_tile_place(key, d, bits, t, g * G + i), static_cast<uint32_t>(q) & mask);
      }
      put_half(block, scales_offset + int_scale_byte(groups, t, g), h);
    }
  }
};

class IntGroupEncoder final : public DeviceEncoder {
 public:
  IntGroupEncoder(const Codec& codec, const IntGroupParams& p)
      : rotation_(upload_rotation(codec)), name_(codec.spec().str()) {
    const size_t d = static_cast<size_t>(codec.dim());
    lambda_ = upload_floats(p.lambda, d);
    const bool key = codec.role() == Role::key;
    const layout::IntGroup l{d, static_cast<size_t>(codec.block_tokens()), static_cast<size_t>(p.bits),
                             static_cast<size_t>(p.group), key};
    enc_ = IntEnc{{rotation_.signs.get(), rotation_.columns.get(), rotation_.scale},
                  lambda_.get(),
                  p.bits,
                  p.group,
                  p.bits == 8 ? 127 : 7,
                  key,
                  static_cast<uint32_t>(l.scales_offset())};
  }
  void encode(const EncodeSource& src, const EncodeTarget& dst, size_t n_pages, unsigned long long* error,
              unsigned long long* nonfinite, cudaStream_t stream) const override {
    launch_encode(enc_, name_.c_str(), src, dst, n_pages, error, nonfinite, stream);
  }
  bool bit_exact() const override { return rotation_.hadamard; }

 private:
  DeviceRotation rotation_;
  std::shared_ptr<float> lambda_;
  std::string name_;
  IntEnc enc_{};
};

}  // namespace

std::unique_ptr<DeviceEncoder> make_int_group_encoder(const Codec& codec) {
  const auto p = int_group_params(codec);
  if (!p) return nullptr;
  return std::make_unique<IntGroupEncoder>(codec, *p);
}

}  // namespace kvq::cuda::detail

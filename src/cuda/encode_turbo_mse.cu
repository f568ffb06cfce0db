// The append kernel of turbo_mse:1..4 (src/codec/turbo_mse.cpp): per token the norm (a sequential sum in double,
// as the CPU's split_norm), u = x / ||x|| in double rounded to float, rotated, and each coordinate's index = the
// number of Lloyd–Max boundaries below it, packed as layout::LaneCodes (each 32-bit lane built by one thread); the
// norm as fp16. Bit-exact with the CPU
// encoder under the Hadamard rotation; other rotations differ in float order (dense matrix).
#include <memory>

#include "codec/lloyd_max.hpp"
#include "codec/turbo_mse.hpp"
#include "codec/turbo_parts.hpp"
#include "cuda/device_half.cuh"
#include "cuda/encode_kernel.cuh"
#include "cuda/rotate_device.cuh"

namespace kvq::cuda::detail {
namespace {

constexpr int kMaxBoundaries = 15;  // 4 bits

struct TurboMseEnc {
  RotationView rot;
  float boundaries[kMaxBoundaries] = {};
  int bits = 3;
  bool key = true;
  uint32_t norms_offset = 0;
  int code_words = 0;  // 32-bit words of the codes section

  // Row pitch of the index bytes: d + 4, so that the rows of 16 or 32 consecutive tokens start in different
  // shared-memory banks (the key code words read one channel of 16 tokens).
  __host__ __device__ static int index_pitch(int d) { return d + 4; }

  // The token norms (T doubles), the dense rotation's spare tile, then the index bytes [T][pitch].
  __host__ __device__ size_t scratch_floats(int T, int d) const {
    return 2 * static_cast<size_t>(T) + (rot.hadamard() ? 0 : static_cast<size_t>(T) * d) +
           (static_cast<size_t>(T) * index_pitch(d) + 3) / 4;
  }

  __device__ void encode(const EncodeContext& ctx, float* x, float* scratch, uint32_t* block) const {
    const int T = ctx.T, d = ctx.d;
    double* norms = reinterpret_cast<double*>(scratch);
    for (int t = threadIdx.x; t < T; t += blockDim.x) {
      // In the CPU's order, each lane one step behind the previous: the rows of a warp start in one shared-memory
      // bank, so in step s lane l reads channel s - l.
      const int lag = static_cast<int>(threadIdx.x) & 31;
      double sum = 0;
      for (int step = 0; step < d + lag; ++step) {
        const int j = step - lag;
        if (j < 0) continue;
        const double v = x[t * d + j];
        sum = __dadd_rn(sum, __dmul_rn(v, v));
      }
      const double norm = sqrt(sum);
      norms[t] = norm;
      if (!(norm <= 65504.0)) {
        ctx.report(t, 0);
        continue;
      }
      put_half(block, norms_offset + 2 * t, to_f16_bits(__double2float_rn(norm)));
    }
    __syncthreads();
    for (int i = threadIdx.x; i < T * d; i += blockDim.x) {
      const double norm = norms[ctx.dd.div(i)];
      x[i] = norm == 0 ? 0.0f : __double2float_rn(__ddiv_rn(static_cast<double>(x[i]), norm));
    }
    __syncthreads();
    rotate_rows(rot, x, scratch + 2 * T, T, d, ctx.dd);
    // Each coordinate's index once (a coordinate per thread), then each code word from the indices.
    uint8_t* indices = reinterpret_cast<uint8_t*>(scratch + 2 * T + (rot.hadamard() ? 0 : T * d));
    const int pitch = index_pitch(d), n_bounds = (1 << bits) - 1;
    for (int i = threadIdx.x; i < T * d; i += blockDim.x) {
      const float v = x[i];
      uint32_t idx = 0;
      for (int k = 0; k < n_bounds; ++k) idx += v > boundaries[k];
      indices[ctx.dd.div(i) * pitch + ctx.dd.mod(i)] = static_cast<uint8_t>(idx);
    }
    __syncthreads();
    const auto index_of = [&](int t, int c) { return static_cast<uint32_t>(indices[t * pitch + c]); };
    for (int w = threadIdx.x; w < code_words; w += blockDim.x)
      block[w] = lane_codes_pack_word(key, d, T, bits, w, index_of);  // one thread per word
  }
};

class TurboMseEncoder final : public EncoderOf<TurboMseEnc> {
 public:
  TurboMseEncoder(const Codec& codec, const TurboMseParams& p)
      : EncoderOf(codec.spec().str()), rotation_(upload_rotation(codec)) {
    const int bits = static_cast<int>(p.layout.bits);
    const FloatCodebook book(sphere_lloyd_max(codec.dim(), bits));  // the codec's own (fp16-rounded) codebook
    enc_.rot = {rotation_.signs.get(), rotation_.columns.get(), rotation_.scale};
    for (size_t k = 0; k < book.boundaries().size(); ++k) enc_.boundaries[k] = book.boundaries()[k];
    enc_.bits = bits;
    enc_.key = p.layout.key;
    enc_.norms_offset = static_cast<uint32_t>(p.layout.norms_offset());
    enc_.code_words = static_cast<int>(p.layout.codes().bytes() / 4);
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

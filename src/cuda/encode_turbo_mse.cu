// The append kernel of turbo_mse:1..4 (src/codec/turbo_mse.cpp): the turbo_mse stage (turbo_mse_device.cuh) in
// place on the page's tile, the indices packed as layout::LaneCodes (each 32-bit lane built by one thread), the
// norm as fp16. Bit-exact with the CPU encoder under the Hadamard rotation; other rotations differ in float order
// (dense matrix).
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
  static constexpr int kBlocksPerSM = 4;
  TurboMseStage stage;
  bool key = true;
  int code_words = 0;  // 32-bit words of the codes section

  // Row pitch of the index bytes: d + 4, so that the rows of 16 or 32 consecutive tokens start in different
  // shared-memory banks (the key code words read one channel of 16 tokens).
  __host__ __device__ static int index_pitch(int d) { return d + 4; }

  // The token norms (TokenNorm), the dense rotation's spare rows, then the index bytes [T][pitch].
  __host__ __device__ size_t scratch_floats(int T, int d) const {
    const size_t index_floats = (static_cast<size_t>(T) * index_pitch(d) + 3) / 4;
    return TurboMseStage::norms_floats(T) + stage.spare_floats(T, d) + index_floats;
  }

  __device__ void encode(const EncodeContext& ctx, float* x, float* scratch, uint32_t* block) const {
    const int T = ctx.T, d = ctx.d;
    TokenNorm* norms = reinterpret_cast<TokenNorm*>(scratch);
    float* spare = scratch + TurboMseStage::norms_floats(T);
    stage.store_norms(ctx, x, norms, block);
    __syncthreads();
    TurboMseStage::normalize(ctx.dd, x, norms, x, T * d);
    __syncthreads();
    stage.rotate_page(ctx, x, spare);
    // Each coordinate's index once (a coordinate per thread), then each code word from the indices.
    uint8_t* indices = reinterpret_cast<uint8_t*>(spare + stage.spare_floats(T, d));
    const int pitch = index_pitch(d);
    for (int i = threadIdx.x; i < T * d; i += blockDim.x)
      indices[ctx.dd.div(i) * pitch + ctx.dd.mod(i)] = static_cast<uint8_t>(stage.book.index(x[i]));
    __syncthreads();
    switch (stage.book.bits) {
      case 1: pack_words<1>(T, d, indices, block); break;
      case 2: pack_words<2>(T, d, indices, block); break;
      case 3: pack_words<3>(T, d, indices, block); break;
      default: pack_words<4>(T, d, indices, block); break;
    }
  }

  // Each code word from the indices, one thread per word; the bit width a constant, so that a word's field
  // positions are too.
  template <int Bits>
  __device__ void pack_words(int T, int d, const uint8_t* indices, uint32_t* block) const {
    const int pitch = index_pitch(d);
    const auto index_of = [&](int t, int c) { return static_cast<uint32_t>(indices[t * pitch + c]); };
    for (int w = threadIdx.x; w < code_words; w += blockDim.x)
      block[w] = lane_codes_pack_word(key, d, T, Bits, w, index_of);
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

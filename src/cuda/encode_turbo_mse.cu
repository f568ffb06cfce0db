// The append kernel of turbo_mse:1..4 (src/codec/turbo_mse.cpp): the turbo_mse stage (turbo_mse_device.cuh) in
// place on the page's tile, the indices packed as layout::LaneCodes (each 32-bit word built by one warp reduction,
// keys, or by one thread, values), the norm as fp16. Bit-exact with the CPU encoder under the Hadamard rotation;
// other rotations differ in float order (dense matrix).
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

  // The token norms (TokenNorm), then the dense rotation's spare rows.
  __host__ __device__ size_t scratch_floats(int T, int d) const {
    return TurboMseStage::norms_floats(T) + stage.spare_floats(T, d);
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
    switch (stage.book.bits) {
      case 1: pack_groups<1>(ctx, x, block); break;
      case 2: pack_groups<2>(ctx, x, block); break;
      case 3: pack_groups<3>(ctx, x, block); break;
      default: pack_groups<4>(ctx, x, block); break;
    }
  }

  // Each element's index once, straight into its group's code words (encode_layout.cuh), the bit width a constant
  // so that the boundaries and the fields' positions are too. Reads of u go along a row (no bank conflicts).
  template <int Bits>
  __device__ void pack_groups(const EncodeContext& ctx, const float* u, uint32_t* block) const {
    const int groups = code_words / (16 * Bits);
    if (key) {
      pack_key_groups<Bits>(ctx, u, block, groups);
    } else {
      pack_value_groups<Bits>(ctx, u, block, groups);
    }
  }

  // Keys: a warp per token of a group, lane e reading channel c0 + e; each word is the OR of the lanes' fields
  // (one warp reduction per word).
  template <int Bits>
  __device__ void pack_key_groups(const EncodeContext& ctx, const float* u, uint32_t* block, int groups) const {
    const BoundarySearch<Bits> book = stage.book.search<Bits>();
    const int lane = threadIdx.x & 31, warps = blockDim.x / 32;
    const LaneCodesSlot slot = lane_codes_slot(Bits, lane);
    const FastDiv per_row = FastDiv::of(lane_codes_groups_per_row(true, ctx.d));
    for (int item = threadIdx.x / 32; item < 16 * groups; item += warps) {  // warp-uniform
      const int g = item >> 4, tt = item & 15;
      const LaneCodesGroup at = lane_codes_group(true, per_row, g, tt);
      const int c = at.c0 + lane;
      const uint32_t idx = at.t0 < ctx.T && c < ctx.d ? book.index(u[at.t0 * ctx.d + c]) : 0u;
#pragma unroll
      for (int sub = 0; sub < Bits; ++sub) {
        uint32_t field = sub == slot.sub ? (idx & ((1u << slot.width) - 1)) << slot.shift : 0u;
        if (Bits == 3 && sub == 2) field = (idx >> 2) << slot.high_shift;
        const uint32_t word = __reduce_or_sync(0xffffffffu, field);
        if (lane == 0) block[16 * (Bits * g + sub) + tt] = word;
      }
    }
  }

  // Values: a thread per channel of 32 tokens, its group's words in registers.
  template <int Bits>
  __device__ void pack_value_groups(const EncodeContext& ctx, const float* u, uint32_t* block, int groups) const {
    const BoundarySearch<Bits> book = stage.book.search<Bits>();
    const int d = ctx.d;
    for (int item = threadIdx.x; item < 16 * groups; item += blockDim.x) {
      const int t0 = 32 * ctx.dd.div(item), c = ctx.dd.mod(item);
      uint32_t words[Bits] = {};
      if (t0 + 32 <= ctx.T) {
        pack_value_words<Bits, 32>(book, u + t0 * d + c, d, 32, words);
      } else {
        pack_value_words<Bits, 0>(book, u + t0 * d + c, d, ctx.T - t0, words);
      }
      const int g = (t0 / 32) * (d / 16) + c / 16;
#pragma unroll
      for (int sub = 0; sub < Bits; ++sub) block[16 * (Bits * g + sub) + (c & 15)] = words[sub];
    }
  }

  // The words of one channel's 32 tokens (a column of pitch d from u), the first n of them present (Full = 32:
  // all, without a test per token).
  template <int Bits, int Full>
  __device__ static void pack_value_words(const BoundarySearch<Bits>& book, const float* u, int d, int n,
                                          uint32_t (&words)[Bits]) {
#pragma unroll
    for (int e = 0; e < 32; ++e)
      if (Full == 32 || e < n) lane_codes_put<Bits>(words, e, book.index(u[e * d]));
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

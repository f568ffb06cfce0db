// The append kernel of turbo_rvq:b (src/codec/turbo_rvq.cpp): the turbo_mse stage (turbo_mse_device.cuh) in place
// on the page's tile gives stage 1's index i1 of each rotated coordinate u; stage 2's index is the nearest level of
// the residual codebook to u - c1[i1] (a rounded float difference, as the CPU). Both stages are packed per token as
// bitpack.hpp streams of b-bit indices (whole words where d is a multiple of 32), the norm as fp16. Bit-exact with the CPU encoder under the Hadamard
// rotation; other rotations differ in float order (dense matrix).
#include <memory>

#include "codec/codec_factories.hpp"
#include "codec/lloyd_max.hpp"
#include "codec/turbo_mse.hpp"
#include "codec/turbo_parts.hpp"
#include "cuda/boundary_search.cuh"
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
    const int T = ctx.T, d = ctx.d;
    TokenNorm* norms = reinterpret_cast<TokenNorm*>(scratch);
    stage1.store_norms(ctx, x, norms, block);
    __syncthreads();
    TurboMseStage::normalize(ctx.dd, x, norms, x, T * d);
    __syncthreads();
    stage1.rotate_page(ctx, x, scratch + TurboMseStage::norms_floats(T));
    switch (stage1.book.bits) {
      case 1: pack_streams<1>(ctx, x, block); break;
      case 2: pack_streams<2>(ctx, x, block); break;
      case 3: pack_streams<3>(ctx, x, block); break;
      default: pack_streams<4>(ctx, x, block); break;
    }
  }

  // Both stages' indices of each coordinate once (binary searches, boundary_search.cuh), straight into the token's
  // two streams: a warp per 32 channels of a token, lane e reading channel c0 + e; the segment's Bits words of each
  // stream are ORs of the lanes' fields (a warp reduction per word). A token's stream starts at a word where d is a
  // multiple of 32 (code_bytes = Bits d / 8); other d OR each field into place with shared-memory atomics.
  template <int Bits>
  __device__ void pack_streams(const EncodeContext& ctx, const float* u, uint32_t* block) const {
    const BoundarySearch<Bits> first_book = stage1.book.search<Bits>(), second_book = stage2.search<Bits>();
    const LevelTable<Bits> first_levels(stage1_levels);
    const auto indices = [&](float v, uint32_t& first, uint32_t& second) {
      first = first_book.index(v);
      second = second_book.index(__fsub_rn(v, first_levels.level(first)));
    };
    const int d = ctx.d;
    if (d % 32 != 0) {
      for (int i = threadIdx.x; i < ctx.T * d; i += blockDim.x) {
        const int t = ctx.dd.div(i), c = ctx.dd.mod(i);
        uint32_t first, second;
        indices(u[i], first, second);
        put_stream_bits(block, stream_code_bit(0, code_bytes, t, c, Bits), first, Bits);
        put_stream_bits(block, stream_code_bit(stage2_offset, code_bytes, t, c, Bits), second, Bits);
      }
      return;
    }
    const int lane = threadIdx.x & 31;
    const FastDiv chunks = FastDiv::of(d / 32);
    for (int item = threadIdx.x / 32; item < ctx.T * chunks.n; item += blockDim.x / 32) {  // warp-uniform
      const int t = chunks.div(item), c0 = 32 * chunks.mod(item);
      uint32_t first, second;
      indices(u[t * d + c0 + lane], first, second);
      const uint32_t word1 = stream_code_bit(0, code_bytes, t, c0, Bits) / 32;
      const uint32_t word2 = stream_code_bit(stage2_offset, code_bytes, t, c0, Bits) / 32;
#pragma unroll
      for (int k = 0; k < Bits; ++k) {
        const int at = lane * Bits - 32 * k;  // the lane's field in word k of the segment
        const uint32_t w1 = __reduce_or_sync(0xffffffffu, segment_field(first, at));
        const uint32_t w2 = __reduce_or_sync(0xffffffffu, segment_field(second, at));
        if (lane == 0) {
          block[word1 + k] = w1;
          block[word2 + k] = w2;
        }
      }
    }
  }

  // A field placed at bit `at` of a 32-bit word: shifted up, or (at < 0) its part above the word's bit 0, or none.
  __device__ static uint32_t segment_field(uint32_t v, int at) {
    if (at >= 32 || at <= -32) return 0;
    return at >= 0 ? v << at : v >> -at;
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

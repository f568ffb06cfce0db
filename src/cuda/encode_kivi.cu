// The append kernel of kivi:2 and kivi:4 (src/codec/kivi.cpp): no rotation; keys take one range per channel over
// the page's tokens, values one per token and group of G channels. A range [lo, hi] is stored as m = lo rounded
// down to fp16 and s = the smallest fp16 >= (hi - m) / (2^b - 1), codes round((x - m) / s), each 32-bit lane of
// codes built by one thread. Bit-exact with the CPU encoder.
#include <memory>

#include "codec/kivi.hpp"
#include "cuda/device_half.cuh"
#include "cuda/encode_kernel.cuh"

namespace kvq::cuda::detail {
namespace {

struct KiviEnc {
  static constexpr int kBlocksPerSM = 5;
  int lb = 1, lg = 5, levels = 3;  // log2 of the code bits and of the value group size; 2^b - 1
  bool key = true;
  uint32_t mins_offset = 0, scales_offset = 0;
  int code_words = 0;

  // The ranges' (m, s) as floats: keys d of each, values T x d/G.
  __host__ __device__ size_t scratch_floats(int T, int d) const {
    return 2 * static_cast<size_t>(key ? d : T * (d >> lg));
  }

  // Stores range p (outward fp16 rounding); false where fp16 cannot hold it.
  __device__ bool store_range(uint32_t* block, int p, float lo, float hi, float& m, float& s) const {
    const uint16_t hm = f16_bits_round_down(static_cast<double>(lo));
    m = f16_bits_to_float(hm);
    const uint16_t hs = f16_bits_round_up(__ddiv_rn(__dsub_rn(static_cast<double>(hi), static_cast<double>(m)),
                                                    static_cast<double>(levels)));
    s = f16_bits_to_float(hs);
    put_half(block, mins_offset + 2 * p, hm);
    put_half(block, scales_offset + 2 * p, hs);
    return isfinite(m) && isfinite(s);
  }

  __device__ void encode(const EncodeContext& ctx, float* x, float* scratch, uint32_t* block) const {
    const int T = ctx.T, d = ctx.d, G = 1 << lg, groups = d >> lg;
    const int ranges = key ? d : T * groups;
    float* mins = scratch;
    float* steps = scratch + ranges;
    const FastDiv gd = FastDiv::of(groups);
    for (int r = threadIdx.x; r < ranges; r += blockDim.x) {
      // keys: channel r over the page's tokens; values: token t, group g
      const int t = key ? 0 : gd.div(r), c = key ? r : gd.mod(r) * G;
      const int n = key ? T : G, stride = key ? d : 1;
      const float* v = x + t * d + c;
      // In the CPU's order (the sign of a zero minimum depends on it), values with each lane one step behind the
      // previous: the groups of a warp start in one shared-memory bank, so in step s lane l reads element s - l.
      const int lag = key ? 0 : static_cast<int>(threadIdx.x) & 31;
      float lo = 0, hi = 0;
      for (int step = 0; step < n + lag; ++step) {
        const int i = step - lag;
        if (i < 0) continue;
        const float e = v[i * stride];
        lo = i == 0 ? e : fminf(lo, e);
        hi = i == 0 ? e : fmaxf(hi, e);
      }
      float m = 0, s = 0;
      if (!store_range(block, key ? c : kivi_param(false, d, lg, t, c), lo, hi, m, s)) {
        ctx.report(t, c);
        m = s = 0;
      }
      mins[r] = m;
      steps[r] = s;
    }
    __syncthreads();
    const float top = static_cast<float>(levels);
    auto code = [&](int t, int c, float v) {
      const int r = key ? c : t * groups + (c >> lg);
      const float s = steps[r];
      if (s == 0) return 0u;  // a constant range: every value equals m
      return static_cast<uint32_t>(fminf(fmaxf(rintf(__fdiv_rn(__fsub_rn(v, mins[r]), s)), 0.0f), top));
    };
    pack_lane_tile_words(key, lb, T, d, code_words, x, block, code);
  }
};

int log2_of(int x) { return FastDiv::of(x).shift; }

class KiviEncoder final : public EncoderOf<KiviEnc> {
 public:
  KiviEncoder(const Codec& codec, const layout::Kivi& l) : EncoderOf(codec.spec().str()) {
    enc_.lb = log2_of(static_cast<int>(l.bits));
    enc_.lg = log2_of(static_cast<int>(l.G));
    enc_.levels = (1 << l.bits) - 1;
    enc_.key = l.key;
    enc_.mins_offset = static_cast<uint32_t>(l.mins_offset());
    enc_.scales_offset = static_cast<uint32_t>(l.scales_offset());
    enc_.code_words = static_cast<int>(l.code_tokens() * l.d * l.bits / 32);
  }
};

}  // namespace

std::unique_ptr<DeviceEncoder> make_kivi_encoder(const Codec& codec) {
  const auto l = kivi_layout(codec);
  if (!l) return nullptr;
  return std::make_unique<KiviEncoder>(codec, *l);
}

}  // namespace kvq::cuda::detail

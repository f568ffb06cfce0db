// The append kernel of kivi:2 and kivi:4 (src/codec/kivi.cpp): no rotation; keys take one range per channel over
// the page's tokens, values one per token and group of G channels. A range [lo, hi] is stored as m = lo rounded
// down to fp16 and s = the smallest fp16 >= (hi - m) / (2^b - 1), codes round((x - m) / s). Bit-exact with the CPU
// encoder.
#include <memory>

#include "codec/kivi.hpp"
#include "cuda/device_half.cuh"
#include "cuda/encode_kernel.cuh"

namespace kvq::cuda::detail {
namespace {

struct KiviEnc {
  int bits, G, levels;
  bool key;
  uint32_t mins_offset, scales_offset;

  __host__ __device__ size_t scratch_floats(int, int) const { return 0; }

  // Stores range p; returns false (reported) where fp16 cannot hold it.
  __device__ bool store_range(uint32_t* block, int p, float lo, float hi, float& m, float& s) const {
    const uint16_t hm = f16_bits_round_down(static_cast<double>(lo));
    m = f16_bits_to_float(hm);
    const uint16_t hs = f16_bits_round_up(__ddiv_rn(__dsub_rn(static_cast<double>(hi), static_cast<double>(m)),
                                                    static_cast<double>(levels)));
    s = f16_bits_to_float(hs);
    if (!isfinite(m) || !isfinite(s)) return false;
    put_half(block, mins_offset + 2 * p, hm);
    put_half(block, scales_offset + 2 * p, hs);
    return true;
  }
  __device__ uint32_t code(float v, float m, float s) const {
    if (s == 0) return 0;
    return static_cast<uint32_t>(fminf(fmaxf(rintf(__fdiv_rn(__fsub_rn(v, m), s)), 0.0f), static_cast<float>(levels)));
  }

  __device__ void encode(const EncodeContext& ctx, float* x, float*, uint32_t* block) const {
    const int T = ctx.T, d = ctx.d;
    float m = 0, s = 0;
    if (key) {
      for (int c = threadIdx.x; c < d; c += blockDim.x) {
        float lo = x[c], hi = lo;
        for (int t = 1; t < T; ++t) {
          lo = fminf(lo, x[t * d + c]);
          hi = fmaxf(hi, x[t * d + c]);
        }
        if (!store_range(block, c, lo, hi, m, s)) {
          ctx.report(0, c);
          continue;
        }
        for (int t = 0; t < T; ++t) put_bits(block, lane_tile_place(true, d, bits, t, c), code(x[t * d + c], m, s));
      }
      return;
    }
    const int groups = d / G;
    for (int k = threadIdx.x; k < T * groups; k += blockDim.x) {
      const int t = k / groups, g = k % groups;
      const float* v = x + t * d + g * G;
      float lo = v[0], hi = v[0];
      for (int i = 1; i < G; ++i) {
        lo = fminf(lo, v[i]);
        hi = fmaxf(hi, v[i]);
      }
      if (!store_range(block, kivi_param(false, d, G, t, g * G), lo, hi, m, s)) {
        ctx.report(t, g * G);
        continue;
      }
      for (int i = 0; i < G; ++i) put_bits(block, lane_tile_place(false, d, bits, t, g * G + i), code(v[i], m, s));
    }
  }
};

class KiviEncoder final : public DeviceEncoder {
 public:
  KiviEncoder(const Codec& codec, const layout::Kivi& l)
      : enc_{static_cast<int>(l.bits), static_cast<int>(l.G), (1 << l.bits) - 1, l.key,
             static_cast<uint32_t>(l.mins_offset()), static_cast<uint32_t>(l.scales_offset())},
        name_(codec.spec().str()) {}
  void encode(const EncodeSource& src, const EncodeTarget& dst, size_t n_pages, unsigned long long* error,
              unsigned long long* nonfinite, cudaStream_t stream) const override {
    launch_encode(enc_, name_.c_str(), src, dst, n_pages, error, nonfinite, stream);
  }
  bool bit_exact() const override { return true; }

 private:
  KiviEnc enc_;
  std::string name_;
};

}  // namespace

std::unique_ptr<DeviceEncoder> make_kivi_encoder(const Codec& codec) {
  const auto l = kivi_layout(codec);
  if (!l) return nullptr;
  return std::make_unique<KiviEncoder>(codec, *l);
}

}  // namespace kvq::cuda::detail

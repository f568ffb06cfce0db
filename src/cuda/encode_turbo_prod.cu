// The append kernel of turbo_prod:b (src/codec/turbo_prod.cpp): the turbo_mse stage with b - 1 bits
// (turbo_mse_device.cuh) into layout::TurboProd's LaneCodes and norms, then the residual r = x - x^mse against the
// MSE stage as decode produces it (fp16 norm times float centroid, inverse rotation: unrotate_device.cuh), held as
// doubles, its norm (row_norm.cuh: four lanes per token, lane_norm.hpp's order) as fp16 and the sign bits of S r
// (sketch_device.cuh) in the role's sign tiles, in passes of a few rows (encode_passes.cuh).
// Bit-exact with the CPU encoder under the Hadamard rotation; other rotations differ in float order (dense matrix).
#include <algorithm>
#include <memory>
#include <vector>

#include "codec/codec_factories.hpp"
#include "codec/lloyd_max.hpp"
#include "codec/turbo_mse.hpp"
#include "codec/turbo_parts.hpp"
#include "cuda/encode_kernel.cuh"
#include "cuda/encode_passes.cuh"
#include "cuda/row_norm.cuh"
#include "cuda/sketch_device.cuh"
#include "cuda/turbo_mse_device.cuh"
#include "cuda/unrotate_device.cuh"

namespace kvq::cuda::detail {
namespace {

constexpr int kMaxMseLevels = 8;  // turbo_prod:4: a 3-bit MSE stage

struct TurboProdEnc {
  static constexpr int kBlocksPerSM = 2;  // the sketch rows in double take more registers
  TurboMseStage mse;  // b - 1 bits
  InverseRotationView unrot;
  float centroids[kMaxMseLevels] = {};
  SketchView sketch;
  bool key = true;
  uint32_t signs_offset = 0, residual_norms_offset = 0;

  // A pass's residual rows (doubles), the token norms (TokenNorm), a pass's rows (the unit vectors, then the
  // decoded MSE stage), the dense rotations' spare rows.
  __host__ __device__ size_t scratch_floats(int T, int d) const {
    const int P = encode_pass_rows(T, d);
    const size_t pass = static_cast<size_t>(P) * d;
    return 2 * sketch_buffer_doubles(P, d) + TurboMseStage::norms_floats(T) + pass + (mse.rot.hadamard() ? 0 : pass);
  }

  __device__ void encode(const EncodeContext& ctx, float* x, float* scratch, uint32_t* block) const {
    const int T = ctx.T, d = ctx.d, m = sketch.m, P = encode_pass_rows(T, d), stride = sketch_row_stride(d);
    double* r = reinterpret_cast<double*>(scratch);
    TokenNorm* norms = reinterpret_cast<TokenNorm*>(r + sketch_buffer_doubles(P, d));
    float* u = reinterpret_cast<float*>(norms + T);
    float* spare = u + P * d;
    mse.store_norms(ctx, x, norms, block);
    __syncthreads();
    for (int t0 = 0; t0 < T; t0 += P) {
      const int rows = P < T - t0 ? P : T - t0, n = rows * d;
      const float* xp = x + t0 * d;
      TurboMseStage::normalize(ctx.dd, xp, norms + t0, u, n);
      __syncthreads();
      rotate_rows(mse.rot, u, spare, rows, d, ctx.dd);
      for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const int t = t0 + ctx.dd.div(i);
        const uint32_t idx = mse.book.index(u[i]);
        put_lane_index(block, key, d, mse.book.bits, t, ctx.dd.mod(i), idx);
        u[i] = __fmul_rn(TurboMseStage::stored_norm(norms[t].norm), centroids[idx]);
      }
      __syncthreads();
      unrotate_rows(unrot, u, spare, rows, d, ctx.dd);  // u: x^mse of the pass's rows
      for (int i = threadIdx.x; i < n; i += blockDim.x) {
        const int tl = ctx.dd.div(i);
        r[tl * stride + (i - tl * d)] = __dsub_rn(static_cast<double>(xp[i]), static_cast<double>(u[i]));
      }
      __syncthreads();
      sketch_signs<false>(sketch, r, rows, d, [key = key, base = signs_offset, block, m, t0](int t, int i) {
        const CodePlace at = sign_tiles_place(key, m, t0 + t, i);
        put_bits(block, {base + at.byte, at.shift, at.width}, 1u);
      });
      for_each_row_norm(r, rows, stride, d, [&](int tl, double norm) {
        if (!(norm <= 65504.0)) {
          ctx.report(t0 + tl, 0);
          return;
        }
        put_half(block, residual_norms_offset + 2 * (t0 + tl), to_f16_bits(__double2float_rn(norm)));
      });
      __syncthreads();  // the next pass overwrites u and r
    }
  }
};

/// S column-major (SketchView) from the codec's map: to_space(e_j) = [R e_j, S e_j], S e_j exactly.
std::shared_ptr<float> upload_residual_sketch(const Codec& codec) {
  const size_t d = static_cast<size_t>(codec.dim()), space = static_cast<size_t>(codec.space_dim()), m = space - d;
  std::vector<float> identity(d * d, 0.0f), mapped(d * space), columns(d * m);
  for (size_t j = 0; j < d; ++j) identity[j * d + j] = 1.0f;
  codec.to_space(identity.data(), static_cast<int>(d), mapped.data());
  for (size_t j = 0; j < d; ++j)
    std::copy_n(mapped.begin() + static_cast<std::ptrdiff_t>(j * space + d), m,
                columns.begin() + static_cast<std::ptrdiff_t>(j * m));
  return upload_floats(columns.data(), columns.size());
}

class TurboProdEncoder final : public EncoderOf<TurboProdEnc> {
 public:
  TurboProdEncoder(const Codec& codec, const TurboProdParams& p) : EncoderOf(codec.spec().str()) {
    const auto rotation = rotation_from_spec(codec.spec(), codec.params());  // the codec's own (same seed)
    rotation_ = upload_rotation(*rotation);
    inverse_ = upload_inverse_rotation(*rotation);
    sketch_ = upload_residual_sketch(codec);
    const layout::TurboMse l = p.layout.mse();
    const FloatCodebook book(sphere_lloyd_max(codec.dim(), static_cast<int>(l.bits)));
    enc_.mse = turbo_mse_stage({rotation_.signs.get(), rotation_.columns.get(), rotation_.scale}, book,
                               l.norms_offset());
    const DeviceRotation& b = inverse_.butterflies;
    enc_.unrot = {{b.signs.get(), b.columns.get(), b.scale}, inverse_.signs.get()};
    for (int k = 0; k < book.size(); ++k) enc_.centroids[k] = book[k];
    enc_.sketch = {sketch_.get(), static_cast<int>(p.layout.m)};
    enc_.key = p.layout.key;
    enc_.signs_offset = static_cast<uint32_t>(p.layout.signs_offset());
    enc_.residual_norms_offset = static_cast<uint32_t>(p.layout.residual_norms_offset());
  }

 private:
  DeviceRotation rotation_;
  DeviceInverseRotation inverse_;
  std::shared_ptr<float> sketch_;
};

}  // namespace

std::unique_ptr<DeviceEncoder> make_turbo_prod_encoder(const Codec& codec) {
  const auto p = turbo_prod_params(codec);
  if (!p) return nullptr;
  return std::make_unique<TurboProdEncoder>(codec, *p);
}

}  // namespace kvq::cuda::detail

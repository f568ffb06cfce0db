// The append kernel of qjl:m (src/codec/qjl.cpp): no rotation; per token the norm (row_norm.cuh: four lanes per
// token, lane_norm.hpp's order, as the CPU) as fp16, and the m sign bits of S x (sketch_device.cuh: the CPU's float
// order) in layout::Qjl's sign tiles ("tokens in lanes" for keys and values alike), the tokens widened to double in
// passes of a few rows (encode_passes.cuh). Bit-exact with the CPU encoder.
#include <memory>
#include <vector>

#include "codec/turbo_mse.hpp"
#include "cuda/device_half.cuh"
#include "cuda/encode_kernel.cuh"
#include "cuda/encode_passes.cuh"
#include "cuda/row_norm.cuh"
#include "cuda/sketch_device.cuh"

namespace kvq::cuda::detail {
namespace {

struct QjlEnc {
  static constexpr int kBlocksPerSM = 2;  // the sketch rows in double take more registers
  SketchView sketch;
  uint32_t norms_offset = 0;

  // A pass's rows as doubles.
  __host__ __device__ size_t scratch_floats(int T, int d) const {
    return 2 * sketch_buffer_doubles(encode_pass_rows(T, d), d);
  }

  __device__ void encode(const EncodeContext& ctx, float* x, float* scratch, uint32_t* block) const {
    const int T = ctx.T, d = ctx.d, m = sketch.m, P = encode_pass_rows(T, d), stride = sketch_row_stride(d);
    double* v = reinterpret_cast<double*>(scratch);
    for_each_row_norm(x, T, d, d, [&](int t, double norm) {
      if (!(norm <= 65504.0)) {
        ctx.report(t, 0);
        return;
      }
      put_half(block, norms_offset + 2 * t, to_f16_bits(__double2float_rn(norm)));
    });
    for (int t0 = 0; t0 < T; t0 += P) {
      const int rows = P < T - t0 ? P : T - t0;
      for (int i = threadIdx.x; i < rows * d; i += blockDim.x) {
        const int tl = ctx.dd.div(i);
        v[tl * stride + (i - tl * d)] = static_cast<double>(x[t0 * d + i]);
      }
      __syncthreads();
      sketch_signs<true>(sketch, v, rows, d, [block, m, t0](int t, int i) {
        put_bits(block, sign_tiles_place(true, m, t0 + t, i), 1u);
      });
      __syncthreads();  // the next pass overwrites v
    }
  }
};

/// S column-major (SketchView) from the codec's own map: to_space(e_j) = S e_j, the j-th column, exactly (one
/// product by 1 in double, rounded to the float it came from).
std::shared_ptr<float> upload_sketch_columns(const Codec& codec) {
  const size_t d = static_cast<size_t>(codec.dim()), m = static_cast<size_t>(codec.space_dim());
  std::vector<float> identity(d * d, 0.0f), columns(d * m);
  for (size_t j = 0; j < d; ++j) identity[j * d + j] = 1.0f;
  codec.to_space(identity.data(), static_cast<int>(d), columns.data());
  return upload_floats(columns.data(), columns.size());
}

class QjlEncoder final : public EncoderOf<QjlEnc> {
 public:
  QjlEncoder(const Codec& codec, const QjlParams& p)
      : EncoderOf(codec.spec().str()), columns_(upload_sketch_columns(codec)) {
    enc_.sketch = {columns_.get(), static_cast<int>(p.layout.m)};
    enc_.norms_offset = static_cast<uint32_t>(p.layout.norms_offset());
  }

 private:
  std::shared_ptr<float> columns_;
};

}  // namespace

std::unique_ptr<DeviceEncoder> make_qjl_encoder(const Codec& codec) {
  const auto p = qjl_params(codec);
  if (!p) return nullptr;
  return std::make_unique<QjlEncoder>(codec, *p);
}

}  // namespace kvq::cuda::detail

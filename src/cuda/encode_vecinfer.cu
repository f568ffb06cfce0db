// The append kernel of vecinfer:c/s (src/codec/vecinfer.cpp): per pass of a few rows (encode_passes.cuh) the rows
// smoothed (x / lambda) and rotated, then each sub-vector's nearest centroid as src/codec/nearest_centroid.cpp
// finds it: distances in the CPU's form ||c||^2 - 2 <x, c> with the CPU's float order (||c||^2 summed as
// CentroidTable does, then + (-2 x_i) c_i for i = 0..s-1, each product and sum rounded on its own, as the CPU's
// clones do, built without contraction) and a running argmin in registers, each thread several sub-vectors against
// every centroid it reads, strictly smaller replacing (the lowest index of a tie, as the CPU's lanes and their merge
// give). Nothing of size sub-vectors x centroids is formed: the codebook lies in shared memory where it fits beside
// the page, else it is streamed through shared memory in tiles of kCodebookTile centroids. The codes are packed per
// token as bitpack.hpp streams; with norm=1 the chosen centroids are rotated back (unrotate_device.cuh), times
// lambda, and gamma = |x|^2 / <x, x^> (in double, capped at 2) is stored as fp16. Bit-exact with the CPU encoder under
// the Hadamard rotation (every power-of-two d); srft (other d) and householder differ in float order (dense matrix).
#include <memory>

#include "codec/block_layout.hpp"
#include "codec/codec_factories.hpp"
#include "codec/vecinfer.hpp"
#include "cuda/device_half.cuh"
#include "cuda/encode_kernel.cuh"
#include "cuda/encode_passes.cuh"
#include "cuda/rotate_device.cuh"
#include "cuda/stream_bits.cuh"
#include "cuda/unrotate_device.cuh"

namespace kvq::cuda::detail {
namespace {

constexpr int kCodebookTile = 256;  // centroids per streamed tile (K = 2^c >= 256 is a multiple)
constexpr double kMaxGamma = 2.0;   // as vecinfer.cpp

struct VecInferEnc {
  static constexpr int kBlocksPerSM = 3;  // the running argmins take more registers
  RotationView rot;
  InverseRotationView unrot;
  const float* lambda = nullptr;          ///< d smoothing factors
  const float* codebook = nullptr;  ///< K x s, row-major
  int K = 0, s = 4, bits = 8;
  bool norm = false;
  uint32_t row_bytes = 0, norms_offset = 0, block_bytes = 0;

  // A pass's rows, then the dense rotations' spare rows.
  __host__ __device__ size_t pass_floats(int T, int d) const {
    const size_t pass = static_cast<size_t>(encode_pass_rows(T, d)) * d;
    return pass + (rot.hadamard() ? 0 : pass);
  }
  // Whether the whole codebook (coordinates and norms) fits in shared memory beside the page (launch_encode's sum).
  __host__ __device__ bool codebook_resident(int T, int d) const {
    const size_t scratch = static_cast<size_t>(K) * (s + 1) + pass_floats(T, d);
    return (static_cast<size_t>(T) * d / 4 + (scratch + 3) / 4) * 16 + (block_bytes + 3) / 4 * 4 <=
           kEncodeMaxSharedBytes;
  }
  // The codebook's coordinates and norms (all of it, or a tile), then the pass.
  __host__ __device__ size_t scratch_floats(int T, int d) const {
    const int held = codebook_resident(T, d) ? K : kCodebookTile;
    return static_cast<size_t>(held) * (s + 1) + pass_floats(T, d);
  }

  /// Copies centroids [k0, k0 + n) into shared memory with their ||c||^2, summed as CentroidTable does (in
  /// coordinate order, each square and sum rounded on its own).
  __device__ void load_centroids(int k0, int n, float* coords, float* norms) const {
    for (int i = threadIdx.x; i < n * s; i += blockDim.x) coords[i] = __ldg(codebook + k0 * s + i);
    for (int k = threadIdx.x; k < n; k += blockDim.x) {
      float norm = 0;
      for (int i = 0; i < s; ++i) {
        const float c = __ldg(codebook + (k0 + k) * s + i);
        norm = __fadd_rn(norm, __fmul_rn(c, c));
      }
      norms[k] = norm;
    }
  }

  // The nearest centroid of each of the pass's `items` sub-vectors (u: rows x d, sub-vector `item` at u + item S),
  // its code written for token t0 + item / (d / S); with norm=1 the sub-vector replaced by its centroid. A thread
  // takes V sub-vectors (item, item + blockDim, ...), so that each centroid it reads from shared memory (a broadcast:
  // every lane reads the same one) feeds V distances.
  template <int S, int V>
  __device__ void assign(int t0, int items, int n_sub, float* u, float* coords, float* norms, bool resident,
                         uint32_t* block) const {
    const FastDiv sd = FastDiv::of(n_sub);
    const int held = resident ? K : kCodebookTile;
    for (int base = 0; base < items; base += V * static_cast<int>(blockDim.x)) {
      const int first = base + static_cast<int>(threadIdx.x);
      float minus_2x[V][S];
#pragma unroll
      for (int v = 0; v < V; ++v) {
        const int item = first + v * static_cast<int>(blockDim.x);
#pragma unroll
        for (int i = 0; i < S; ++i)
          minus_2x[v][i] = item < items ? __fadd_rn(0.0f, __fmul_rn(-2.0f, u[item * S + i])) : 0.0f;
      }
      float best[V];
      int arg[V];
#pragma unroll
      for (int v = 0; v < V; ++v) {
        best[v] = __int_as_float(0x7f800000);  // +inf
        arg[v] = 0;
      }
      for (int k0 = 0; k0 < K; k0 += held) {
        if (!resident) {
          __syncthreads();  // every thread is done with the previous tile
          load_centroids(k0, held, coords, norms);
          __syncthreads();
        }
        if (first >= items) continue;  // none of this thread's sub-vectors is in the pass
        // Unrolled so that the independent distance chains of consecutive centroids interleave.
#pragma unroll 4
        for (int k = 0; k < held; ++k) {
          float c[S];
#pragma unroll
          for (int q = 0; q < S / 4; ++q) {  // coords is 16-byte aligned, S a multiple of 4
            const float4 c4 = reinterpret_cast<const float4*>(coords + k * S)[q];
            c[4 * q] = c4.x;
            c[4 * q + 1] = c4.y;
            c[4 * q + 2] = c4.z;
            c[4 * q + 3] = c4.w;
          }
          const float norm_k = norms[k];
#pragma unroll
          for (int v = 0; v < V; ++v) {
            float value = norm_k;
#pragma unroll
            for (int i = 0; i < S; ++i) value = __fadd_rn(value, __fmul_rn(minus_2x[v][i], c[i]));
            if (value < best[v]) {
              best[v] = value;
              arg[v] = k0 + k;
            }
          }
        }
      }
#pragma unroll
      for (int v = 0; v < V; ++v) {
        const int item = first + v * static_cast<int>(blockDim.x);
        if (item >= items) continue;
        put_stream_bits(block, stream_code_bit(0, row_bytes, t0 + sd.div(item), sd.mod(item), bits),
                        static_cast<uint32_t>(arg[v]), static_cast<uint32_t>(bits));
        if (norm) {
#pragma unroll
          for (int i = 0; i < S; ++i) u[item * S + i] = __ldg(codebook + arg[v] * S + i);
        }
      }
    }
  }

  __device__ void encode(const EncodeContext& ctx, float* x, float* scratch, uint32_t* block) const {
    const int T = ctx.T, d = ctx.d, P = encode_pass_rows(T, d), n_sub = d / s;
    const bool resident = codebook_resident(T, d);
    const int held = resident ? K : kCodebookTile;
    float* coords = scratch;
    float* norms = coords + held * s;
    float* u = norms + held;
    float* spare = u + P * d;
    if (resident) load_centroids(0, K, coords, norms);  // read after the first pass's barrier
    for (int t0 = 0; t0 < T; t0 += P) {
      const int rows = P < T - t0 ? P : T - t0, n = rows * d;
      const float* xp = x + t0 * d;
      for (int i = threadIdx.x; i < n; i += blockDim.x) u[i] = __fdiv_rn(xp[i], lambda[ctx.dd.mod(i)]);
      __syncthreads();
      rotate_rows(rot, u, spare, rows, d, ctx.dd);
      if (s == 4)  // a pass holds kPassFloats / s sub-vectors: V of them for each of the block's threads
        assign<4, 4>(t0, rows * n_sub, n_sub, u, coords, norms, resident, block);
      else
        assign<8, 2>(t0, rows * n_sub, n_sub, u, coords, norms, resident, block);
      if (norm) {
        __syncthreads();
        unrotate_rows(unrot, u, spare, rows, d, ctx.dd);
        for (int i = threadIdx.x; i < n; i += blockDim.x) u[i] = __fmul_rn(u[i], lambda[ctx.dd.mod(i)]);
        __syncthreads();
        for (int tl = threadIdx.x; tl < rows; tl += blockDim.x) {
          double norm2 = 0, dot = 0;
          for (int c = 0; c < d; ++c) {
            const double v = xp[tl * d + c];
            norm2 = __dadd_rn(norm2, __dmul_rn(v, v));
            dot = __dadd_rn(dot, __dmul_rn(v, static_cast<double>(u[tl * d + c])));
          }
          const double q = dot > 0 ? __ddiv_rn(norm2, dot) : 0.0;
          const float gamma = dot > 0 ? __double2float_rn(kMaxGamma < q ? kMaxGamma : q) : 0.0f;
          put_half(block, norms_offset + 2 * (t0 + tl), to_f16_bits(gamma));
        }
      }
      __syncthreads();  // the next pass overwrites u
    }
  }
};

class VecInferEncoder final : public EncoderOf<VecInferEnc> {
 public:
  explicit VecInferEncoder(const VecInferCodec& codec) : EncoderOf(codec.spec().str()) {
    const int d = codec.dim(), s = codec.sub_dim(), K = codec.centroids();
    layout::VecInfer l{static_cast<size_t>(d), static_cast<size_t>(codec.block_tokens()), static_cast<size_t>(s),
                       static_cast<size_t>(codec.codeword_bits())};
    l.norm = codec.block_bytes() > l.block_bytes();  // the gammas follow the index rows
    enc_.K = K;
    enc_.s = s;
    enc_.bits = codec.codeword_bits();
    enc_.norm = l.norm;
    enc_.row_bytes = static_cast<uint32_t>(l.row_bytes());
    enc_.norms_offset = static_cast<uint32_t>(l.norms_offset());
    enc_.block_bytes = static_cast<uint32_t>(codec.block_bytes());
    // An untrained layer has no codebook: append_device refuses it before any launch.
    if (!codec.trained()) return;
    const auto rotation = rotation_from_spec(codec.spec(), codec.params());  // the codec's own (same seed)
    rotation_ = upload_rotation(*rotation);
    inverse_ = upload_inverse_rotation(*rotation);
    lambda_ = upload_floats(codec.smoothing().data(), static_cast<size_t>(d));
    codebook_ = upload_floats(codec.codebook().data(), codec.codebook().size());
    enc_.rot = {rotation_.signs.get(), rotation_.columns.get(), rotation_.scale};
    const DeviceRotation& b = inverse_.butterflies;
    enc_.unrot = {{b.signs.get(), b.columns.get(), b.scale}, inverse_.signs.get()};
    enc_.lambda = lambda_.get();
    enc_.codebook = codebook_.get();
  }

 private:
  DeviceRotation rotation_;
  DeviceInverseRotation inverse_;
  std::shared_ptr<float> lambda_, codebook_;
};

}  // namespace

std::unique_ptr<DeviceEncoder> make_vecinfer_encoder(const Codec& codec) {
  const auto* c = dynamic_cast<const VecInferCodec*>(&codec);
  if (c == nullptr) return nullptr;
  return std::make_unique<VecInferEncoder>(*c);
}

}  // namespace kvq::cuda::detail

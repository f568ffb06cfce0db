// The codec pairs with a CUDA decode kernel: one explicit instantiation of split_kernel per pair, each in its own
// translation unit (decode_pair_*.cu) so that they compile in parallel.
#pragma once

#include <string>
#include <vector>

#include "cuda/decode_kernel.cuh"
#include "cuda/qjl_traits.cuh"
#include "cuda/turbo_prod_traits.cuh"
#include "cuda/vecinfer_traits.cuh"
#include "kvq/codec.hpp"

namespace kvq::cuda::detail {

using KernelFor = SplitKernel (*)(int d, const CodecArgs& key, const CodecArgs& value);

struct PairKernel {
  std::string key, value;  // codec ids: "f16", "int4", "kivi:2", "turbo_mse:3", "qjl", "qjl:256", "vecinfer:8/4", ...
  KernelFor kernel;
};

/// Every pair with a kernel.
const std::vector<PairKernel>& pair_kernels();

/// What the kernels read of a codec's blocks beyond the layout fixed at compile time (decode_attention.cu); throws
/// kvq::Error where the codec's groups do not fit the kernel.
CodecArgs host_codec_args(const Codec& c, bool key);

/// The per-channel factor of the codec space that the kernels leave out of their decode (int8/int4's lambda, the
/// sketch factor of qjl), applied to the query map (keys) or the output map (values) instead.
std::vector<float> space_sigma(const Codec& c);

/// The table a codec's kernel keeps in the block's shared memory (CodecArgs::table), empty for most codecs:
/// vecinfer's codebook as fp16 pairs per centroid and 4-channel group, keys with the fp16 remainders after them.
std::vector<uint32_t> codec_table(const Codec& c, bool key);

using F16 = FloatTraits<false>;
using Bf16 = FloatTraits<true>;
using Int4 = IntTraits<4>;
using Int8 = IntTraits<8>;
using Kivi2 = KiviTraits<2>;
using TurboMse3 = TurboMseTraits<3>;
using Qjl = QjlTraits<0>;
using Qjl256 = QjlTraits<256>;
using TurboProd4 = TurboProdTraits<4>;
using VecInfer8x4 = VecInferTraits<8, 4>;
using VecInfer10x4 = VecInferTraits<10, 4>;

#define KVQ_DECODE_PAIR(K, V) \
  template SplitKernel split_kernel<K::Key, V::Value>(int, const CodecArgs&, const CodecArgs&)

extern KVQ_DECODE_PAIR(F16, F16);
extern KVQ_DECODE_PAIR(Bf16, Bf16);
extern KVQ_DECODE_PAIR(Int4, Int4);
extern KVQ_DECODE_PAIR(Int8, Int8);
extern KVQ_DECODE_PAIR(Kivi2, Kivi2);
extern KVQ_DECODE_PAIR(TurboMse3, TurboMse3);
extern KVQ_DECODE_PAIR(Qjl, Qjl);
extern KVQ_DECODE_PAIR(Qjl, Int4);
extern KVQ_DECODE_PAIR(Qjl256, Int4);
extern KVQ_DECODE_PAIR(Qjl256, Qjl256);
extern KVQ_DECODE_PAIR(TurboProd4, Int4);
extern KVQ_DECODE_PAIR(TurboProd4, TurboMse3);
extern KVQ_DECODE_PAIR(TurboProd4, TurboProd4);
extern KVQ_DECODE_PAIR(VecInfer8x4, VecInfer8x4);
extern KVQ_DECODE_PAIR(VecInfer10x4, VecInfer10x4);

}  // namespace kvq::cuda::detail

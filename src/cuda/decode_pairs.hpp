// The codec pairs with a CUDA decode kernel: one explicit instantiation of split_kernel per pair, each in its own
// translation unit (decode_pair_*.cu) so that they compile in parallel.
#pragma once

#include <string>
#include <vector>

#include "cuda/decode_kernel.cuh"
#include "kvq/codec.hpp"

namespace kvq::cuda::detail {

using KernelFor = SplitKernel (*)(int d, const CodecArgs& key, const CodecArgs& value);

struct PairKernel {
  std::string key, value;  // codec ids: "f16", "bf16", "int4", "int8", "kivi:2", "turbo_mse:3"
  KernelFor kernel;
};

/// Every pair with a kernel.
const std::vector<PairKernel>& pair_kernels();

/// What the kernels read of a codec's blocks beyond the layout fixed at compile time (decode_attention.cu); throws
/// kvq::Error where the codec's groups do not fit the kernel.
CodecArgs host_codec_args(const Codec& c, bool key);

using F16 = FloatTraits<false>;
using Bf16 = FloatTraits<true>;
using Int4 = IntTraits<4>;
using Int8 = IntTraits<8>;
using Kivi2 = KiviTraits<2>;
using TurboMse3 = TurboMseTraits<3>;

#define KVQ_DECODE_PAIR(K, V) \
  template SplitKernel split_kernel<K::Key, V::Value>(int, const CodecArgs&, const CodecArgs&)

extern KVQ_DECODE_PAIR(F16, F16);
extern KVQ_DECODE_PAIR(Bf16, Bf16);
extern KVQ_DECODE_PAIR(Int4, Int4);
extern KVQ_DECODE_PAIR(Int8, Int8);
extern KVQ_DECODE_PAIR(Kivi2, Kivi2);
extern KVQ_DECODE_PAIR(TurboMse3, TurboMse3);

}  // namespace kvq::cuda::detail

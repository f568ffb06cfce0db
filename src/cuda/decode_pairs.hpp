// The codec pairs with a CUDA decode kernel: one explicit instantiation of split_kernel per pair, each in its own
// generated translation unit (decode_pairs.cmake) so that they compile in parallel. Which pairs a build has is the
// generated cuda/decode_pair_list.hpp: the default pairs, or every key codec with every value codec
// (KVQ_CUDA_ALL_PAIRS).
#pragma once

#include <string>
#include <vector>

#include "cuda/decode_kernel.cuh"
#include "cuda/decode_pair_list.hpp"
#include "kvq/codec.hpp"

namespace kvq::cuda::detail {

using KernelFor = SplitKernel (*)(int d, const CodecArgs& key, const CodecArgs& value);

struct PairKernel {
  std::string key, value;  // codec ids (kCodecId)
  KernelFor kernel;
};

/// Every pair with a kernel in this build.
const std::vector<PairKernel>& pair_kernels();

/// The codec ids with kernel traits, and whether this build instantiated every pair of them.
std::vector<std::string> kernel_codecs();
constexpr bool kAllPairs = KVQ_DECODE_ALL_PAIRS;

/// What the kernels read of a codec's blocks beyond the layout fixed at compile time (decode_attention.cu); throws
/// kvq::Error where the codec's groups do not fit the kernel.
CodecArgs host_codec_args(const Codec& c, bool key);

using F16 = FloatTraits<false>;
using Bf16 = FloatTraits<true>;
using Int4 = IntTraits<4>;
using Int8 = IntTraits<8>;
using Kivi2 = KiviTraits<2>;
using Kivi4 = KiviTraits<4>;
using TurboMse1 = TurboMseTraits<1>;
using TurboMse2 = TurboMseTraits<2>;
using TurboMse3 = TurboMseTraits<3>;
using TurboMse4 = TurboMseTraits<4>;

/// The codec id (decode_attention.cu's codec_id) that a traits class decodes.
template <class Traits>
inline constexpr const char* kCodecId = nullptr;
template <>
inline constexpr const char* kCodecId<F16> = "f16";
template <>
inline constexpr const char* kCodecId<Bf16> = "bf16";
template <>
inline constexpr const char* kCodecId<Int4> = "int4";
template <>
inline constexpr const char* kCodecId<Int8> = "int8";
template <>
inline constexpr const char* kCodecId<Kivi2> = "kivi:2";
template <>
inline constexpr const char* kCodecId<Kivi4> = "kivi:4";
template <>
inline constexpr const char* kCodecId<TurboMse1> = "turbo_mse:1";
template <>
inline constexpr const char* kCodecId<TurboMse2> = "turbo_mse:2";
template <>
inline constexpr const char* kCodecId<TurboMse3> = "turbo_mse:3";
template <>
inline constexpr const char* kCodecId<TurboMse4> = "turbo_mse:4";

#define KVQ_DECODE_PAIR(K, V) \
  template SplitKernel split_kernel<K::Key, V::Value>(int, const CodecArgs&, const CodecArgs&)

#define KVQ_EXTERN_DECODE_PAIR(K, V) extern KVQ_DECODE_PAIR(K, V);
KVQ_DECODE_PAIRS(KVQ_EXTERN_DECODE_PAIR)
#undef KVQ_EXTERN_DECODE_PAIR

}  // namespace kvq::cuda::detail

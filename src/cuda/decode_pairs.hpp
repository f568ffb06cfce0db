// The codec pairs with a CUDA decode kernel: one explicit instantiation of split_kernel per pair, each in its own
// generated translation unit (decode_pairs.cmake) so that they compile in parallel. Which pairs a build has is the
// generated cuda/decode_pair_list.hpp: the default pairs, or every key codec with every value codec
// (KVQ_CUDA_ALL_PAIRS).
#pragma once

#include <string>
#include <vector>

#include "cuda/decode_kernel.cuh"
#include "cuda/decode_pair_list.hpp"
#include "cuda/qjl_traits.cuh"
#include "cuda/turbo_prod_traits.cuh"
#include "cuda/turbo_rvq_traits.cuh"
#include "cuda/vecinfer_traits.cuh"
#include "kvq/codec.hpp"

namespace kvq::cuda::detail {

/// The pair's split kernel at head dimension d; fast: the int keys' integer path where the keys have one.
using KernelFor = SplitKernel (*)(int d, const CodecArgs& key, const CodecArgs& value, bool fast);

struct PairKernel {
  std::string key, value;  // codec ids (kCodecId): "f16", "int4", "kivi:2", "qjl:256", "vecinfer:8/4", ...
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

/// The per-channel factor of the codec space that the kernels leave out of their decode (int8/int4's lambda, the
/// sketch factor of qjl), applied to the query map (keys) or the output map (values) instead.
std::vector<float> space_sigma(const Codec& c);

/// The table a codec's kernel reads (CodecArgs::table, in the block's shared memory where table_bytes says so),
/// empty for most codecs: vecinfer's codebook as fp16 pairs per centroid and 4-channel group, keys with the fp16
/// remainders after them; turbo_rvq's two stages' level tables (8 words each, CodecArgs::table_hi's layout).
std::vector<uint32_t> codec_table(const Codec& c, bool key);

using F16 = FloatTraits<false>;
using Bf16 = FloatTraits<true>;
using Int4 = IntTraits<4>;
using Int8 = IntTraits<8>;
using Kivi2 = KiviTraits<2>;
using Kivi3 = KiviTraits<3>;
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
inline constexpr const char* kCodecId<Kivi3> = "kivi:3";
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
using Qjl = QjlTraits<0>;
using Qjl256 = QjlTraits<256>;
using TurboProd2 = TurboProdTraits<2>;
using TurboProd3 = TurboProdTraits<3>;
using TurboProd4 = TurboProdTraits<4>;
using TurboRvq1 = TurboRvqTraits<1>;
using TurboRvq2 = TurboRvqTraits<2>;
using TurboRvq3 = TurboRvqTraits<3>;
using TurboRvq4 = TurboRvqTraits<4>;
using VecInfer8x4 = VecInferTraits<8, 4>;
using VecInfer10x4 = VecInferTraits<10, 4>;
using VecInfer12x8 = VecInferTraits<12, 8>;
template <>
inline constexpr const char* kCodecId<Qjl> = "qjl";
template <>
inline constexpr const char* kCodecId<Qjl256> = "qjl:256";
template <>
inline constexpr const char* kCodecId<TurboProd2> = "turbo_prod:2";
template <>
inline constexpr const char* kCodecId<TurboProd3> = "turbo_prod:3";
template <>
inline constexpr const char* kCodecId<TurboProd4> = "turbo_prod:4";
template <>
inline constexpr const char* kCodecId<TurboRvq1> = "turbo_rvq:1";
template <>
inline constexpr const char* kCodecId<TurboRvq2> = "turbo_rvq:2";
template <>
inline constexpr const char* kCodecId<TurboRvq3> = "turbo_rvq:3";
template <>
inline constexpr const char* kCodecId<TurboRvq4> = "turbo_rvq:4";
template <>
inline constexpr const char* kCodecId<VecInfer8x4> = "vecinfer:8/4";
template <>
inline constexpr const char* kCodecId<VecInfer10x4> = "vecinfer:10/4";
template <>
inline constexpr const char* kCodecId<VecInfer12x8> = "vecinfer:12/8";

#define KVQ_DECODE_PAIR(K, V) \
  template SplitKernel split_kernel<K::Key, V::Value>(int, const CodecArgs&, const CodecArgs&, bool)

#define KVQ_EXTERN_DECODE_PAIR(K, V) extern KVQ_DECODE_PAIR(K, V);
KVQ_DECODE_PAIRS(KVQ_EXTERN_DECODE_PAIR)
#undef KVQ_EXTERN_DECODE_PAIR

}  // namespace kvq::cuda::detail

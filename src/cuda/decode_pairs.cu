// The table of codec pairs with a CUDA decode kernel in this build (cuda/decode_pair_list.hpp).
#include "cuda/decode_pairs.hpp"

namespace kvq::cuda::detail {

const std::vector<PairKernel>& pair_kernels() {
#define KVQ_PAIR_ENTRY(K, V) {kCodecId<K>, kCodecId<V>, &split_kernel<K::Key, V::Value>},
  static const std::vector<PairKernel> pairs = {KVQ_DECODE_PAIRS(KVQ_PAIR_ENTRY)};
#undef KVQ_PAIR_ENTRY
  return pairs;
}

std::vector<std::string> kernel_codecs() {
#define KVQ_CODEC_ID(T) kCodecId<T>,
  return {KVQ_DECODE_CODECS(KVQ_CODEC_ID)};
#undef KVQ_CODEC_ID
}

}  // namespace kvq::cuda::detail

// The table of codec pairs with a CUDA decode kernel.
#include "cuda/decode_pairs.hpp"

namespace kvq::cuda::detail {

const std::vector<PairKernel>& pair_kernels() {
  static const std::vector<PairKernel> pairs = {
      {"f16", "f16", &split_kernel<F16::Key, F16::Value>},
      {"bf16", "bf16", &split_kernel<Bf16::Key, Bf16::Value>},
      {"int4", "int4", &split_kernel<Int4::Key, Int4::Value>},
      {"int8", "int8", &split_kernel<Int8::Key, Int8::Value>},
      {"kivi:2", "kivi:2", &split_kernel<Kivi2::Key, Kivi2::Value>},
      {"turbo_mse:3", "turbo_mse:3", &split_kernel<TurboMse3::Key, TurboMse3::Value>},
      {"qjl", "qjl", &split_kernel<Qjl::Key, Qjl::Value>},
      {"qjl", "int4", &split_kernel<Qjl::Key, Int4::Value>},
      {"qjl:256", "int4", &split_kernel<Qjl256::Key, Int4::Value>},
      {"qjl:256", "qjl:256", &split_kernel<Qjl256::Key, Qjl256::Value>},
      {"turbo_prod:4", "int4", &split_kernel<TurboProd4::Key, Int4::Value>},
      {"turbo_prod:4", "turbo_mse:3", &split_kernel<TurboProd4::Key, TurboMse3::Value>},
      {"turbo_prod:4", "turbo_prod:4", &split_kernel<TurboProd4::Key, TurboProd4::Value>},
      {"vecinfer:8/4", "vecinfer:8/4", &split_kernel<VecInfer8x4::Key, VecInfer8x4::Value>},
      {"vecinfer:10/4", "vecinfer:10/4", &split_kernel<VecInfer10x4::Key, VecInfer10x4::Value>},
  };
  return pairs;
}

}  // namespace kvq::cuda::detail

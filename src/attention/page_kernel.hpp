// The one place where the page loop's kernel is chosen for a layer's (key codec, value codec) pair and an
// instruction set: a fused kernel that reads the packed blocks directly, or the generic loop through the codecs'
// Scorer and accumulate.
#pragma once

#include <array>
#include <cstdint>
#include <string>

#include "attention/isa.hpp"
#include "attention/kernel_args.hpp"
#include "attention/precision.hpp"
#include "kvq/codec.hpp"

namespace kvq::detail {

struct PageKernel {
  /// "generic", or "fused_<key>_<value>_<isa>" such as "fused_int4_int4_avx512", with "_fast" after it for a fast
  /// kernel (Precision::fast)
  std::string name = "generic";
  KernelFn fn = nullptr;         ///< null: the generic loop
  const float* key_lambda = nullptr;    ///< int keys: per-channel scale, folded into the queries
  const float* value_lambda = nullptr;  ///< int values: per-channel scale, applied to the outputs after a run
  int key_group = 0, value_group = 0;
  size_t key_scales_offset = 0, value_scales_offset = 0;
  size_t key_mins_offset = 0, value_mins_offset = 0;
  const float* key_levels = nullptr;
  const float* value_levels = nullptr;
  std::array<uint8_t, 16> key_level_bytes{};  ///< turbo_mse keys: KernelArgs::key_level_bytes
  float key_level_unit = 0;
  size_t key_signs_offset = 0, value_signs_offset = 0;
  size_t key_residual_norms_offset = 0, value_residual_norms_offset = 0;
  float key_sketch_scale = 0, value_sketch_scale = 0;
};

/// The kernel for blocks of T tokens of these codecs on `isa`: fused for f16, int8, int4, kivi:2..4,
/// turbo_mse:1..4, turbo_prod:2..4 or qjl keys with f16, int8, int4, kivi, turbo_mse:1..4 or turbo_prod:2..4 values
/// (T a multiple of 16 up to kMaxTokens; turbo keys need d, and turbo and kivi:3 values T, a multiple of 32; qjl
/// keys m a multiple of 32 up to kMaxKeySpace), from the widest instruction set up to `isa` that has one; else
/// generic.
/// Under Precision::fast, an instruction set's fast kernel for the pair comes before its exact one.
PageKernel select_page_kernel(const Codec& key, const Codec& value, int T, Isa isa, Precision precision);

/// The queries a fused kernel takes: n_q x d rows (scaled already) mapped to the key codec's space (n_q x
/// key.space_dim() out) and multiplied by key_lambda.
void prepare_kernel_queries(const PageKernel& kernel, const Codec& key, const float* q, int n_q, float* out);

}  // namespace kvq::detail

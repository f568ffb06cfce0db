#include "attention/page_kernel.hpp"

#include "codec/block_layout.hpp"
#include "codec/int_group.hpp"
#include "codec/kivi.hpp"
#include "codec/signed_byte_levels.hpp"
#include "codec/turbo_mse.hpp"

namespace kvq::detail {
namespace {

struct Format {
  BlockFormat format = BlockFormat::other;
  const float* lambda = nullptr;
  int group = 0;
  size_t scales_offset = 0, mins_offset = 0;
  const float* levels = nullptr;
  size_t signs_offset = 0, residual_norms_offset = 0;  // turbo_prod, qjl
  float sketch_scale = 0;
};

Format format_of(const Codec& codec, int T) {
  if (codec.spec().name == "f16") return {BlockFormat::f16};
  if (const auto p = int_group_params(codec)) {
    const layout::IntGroup l{static_cast<size_t>(codec.dim()), static_cast<size_t>(T), static_cast<size_t>(p->bits),
                             static_cast<size_t>(p->group), codec.role() == Role::key};
    return {p->bits == 8 ? BlockFormat::int8 : BlockFormat::int4, p->lambda, p->group, l.scales_offset()};
  }
  if (const auto l = kivi_layout(codec)) {
    if (l->bits == 3 && !l->key && l->T % 32 != 0) return {};  // values: whole 32-token tiles of the high bits
    constexpr BlockFormat formats[] = {BlockFormat::kivi2, BlockFormat::kivi3, BlockFormat::kivi4};
    // kivi:3's high-bit plane in the signs' offset (KernelArgs)
    return {formats[l->bits - 2], nullptr,  static_cast<int>(l->G), l->scales_offset(), l->mins_offset(),
            nullptr,               l->planes() == 2 ? l->plane_offset(1) : 0};
  }
  if (const auto p = turbo_mse_params(codec)) {
    const auto& l = p->layout;
    if (!(l.key ? l.d % 32 == 0 : l.T % 32 == 0)) return {};  // whole 32-element chunks
    constexpr BlockFormat formats[] = {BlockFormat::turbo1, BlockFormat::turbo2, BlockFormat::turbo3,
                                       BlockFormat::turbo4};
    return {formats[l.bits - 1], nullptr, 0, l.norms_offset(), 0, p->nibble_levels};
  }
  if (const auto p = turbo_prod_params(codec)) {
    // Channel chunk k and sign tile k side by side: m = d, whole 32-element chunks.
    const auto& l = p->layout;
    if (l.m != l.d || !(l.key ? l.d % 32 == 0 : l.T % 32 == 0)) return {};
    constexpr BlockFormat formats[] = {BlockFormat::prod2, BlockFormat::prod3, BlockFormat::prod4};
    return {formats[l.bits - 2], nullptr, 0, l.mse().norms_offset(), 0, p->nibble_levels,
            l.signs_offset(),    l.residual_norms_offset(), p->sketch_scale};
  }
  if (const auto p = qjl_params(codec)) {
    const auto& l = p->layout;
    if (codec.role() != Role::key || l.m % 32 != 0 || l.m > static_cast<size_t>(kMaxKeySpace)) return {};
    return {BlockFormat::qjl, nullptr, 0, l.norms_offset(), 0, nullptr, 0, 0, p->sketch_scale};
  }
  return {};
}

KernelFn fused_kernel(Isa isa, BlockFormat key, BlockFormat value) {
  switch (isa) {
    case Isa::scalar:
      return scalar::fused_kernel(key, value);
    case Isa::avx2:
      return avx2::fused_kernel(key, value);
    case Isa::avx512:
      return avx512::fused_kernel(key, value);
    case Isa::avx512vnni:
      return avx512vnni::fused_kernel(key, value);
    case Isa::avx512bf16:  // fast kernels only: its exact ones are avx512vnni's
      return nullptr;
    case Isa::neon:
      return neon::fused_kernel(key, value);
  }
  return nullptr;
}

// The fast kernel of `isa` for the pair, or null (Precision::fast).
KernelFn fast_kernel(Isa isa, BlockFormat key, BlockFormat value) {
  if (isa == Isa::avx512bf16) return avx512bf16::fast_kernel(key, value);
  if (isa == Isa::avx512vnni) return avx512vnni::fast_kernel(key, value);
  return isa == Isa::avx2 ? avx2::fast_kernel(key, value) : nullptr;
}

}  // namespace

PageKernel select_page_kernel(const Codec& key, const Codec& value, int T, Isa isa, Precision precision) {
  PageKernel kernel;
  const Format k = format_of(key, T), v = format_of(value, T);
  if (k.format == BlockFormat::other || v.format == BlockFormat::other || T % 16 != 0 || T > kMaxTokens ||
      key.role() != Role::key || value.role() != Role::value || key.dim() != value.dim())
    return kernel;
  // The widest instruction set up to `isa` that has a kernel for the pair.
  Isa used = isa;
  bool fast = false;
  const auto find = [&] {
    if (precision == Precision::fast) kernel.fn = fast_kernel(used, k.format, v.format);
    fast = kernel.fn != nullptr;
    if (!fast) kernel.fn = fused_kernel(used, k.format, v.format);
    return kernel.fn != nullptr;
  };
  while (!find() && used != Isa::scalar) used = narrower_isa(used);
  if (!kernel.fn) return kernel;
  kernel.name = "fused_" + key.spec().name + "_" + value.spec().name + "_" + isa_name(used) + (fast ? "_fast" : "");
  kernel.key_lambda = k.lambda;
  kernel.value_lambda = v.lambda;
  kernel.key_group = k.group;
  kernel.value_group = v.group;
  kernel.key_scales_offset = k.scales_offset;
  kernel.value_scales_offset = v.scales_offset;
  kernel.key_mins_offset = k.mins_offset;
  kernel.value_mins_offset = v.mins_offset;
  kernel.key_levels = k.levels;
  kernel.value_levels = v.levels;
  // The fast kernels' level bytes, computed here, not in the kernels: their translation units take wider instructions.
  if (const auto p = turbo_mse_params(key); p && p->layout.bits <= kByteLevelMaxBits) {
    const SignedByteLevels b = signed_byte_levels(p->nibble_levels);
    for (int e = 0; e < 16; ++e) kernel.key_level_bytes[e] = static_cast<uint8_t>(b.l[e] + 128);
    kernel.key_level_unit = b.unit;
  }
  kernel.key_signs_offset = k.signs_offset;
  kernel.value_signs_offset = v.signs_offset;
  kernel.key_residual_norms_offset = k.residual_norms_offset;
  kernel.value_residual_norms_offset = v.residual_norms_offset;
  kernel.key_sketch_scale = k.sketch_scale;
  kernel.value_sketch_scale = v.sketch_scale;
  return kernel;
}

void prepare_kernel_queries(const PageKernel& kernel, const Codec& key, const float* q, int n_q, float* out) {
  key.to_space(q, n_q, out);
  if (!kernel.key_lambda) return;  // only int codecs have one, and their space is d wide
  const size_t d = static_cast<size_t>(key.dim());
  for (size_t i = 0; i < static_cast<size_t>(n_q) * d; ++i) out[i] *= kernel.key_lambda[i % d];
}

}  // namespace kvq::detail

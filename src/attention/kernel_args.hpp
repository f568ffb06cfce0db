// The arguments of a fused page-loop kernel, as plain data. The per-ISA translation units see only this header and
// intrinsics: a class with inline member functions included there would be compiled with wider instructions, and
// the linker may keep that copy for every caller, also on CPUs without those instructions.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kvq::detail {

/// Block formats a fused kernel reads: f16, int8 and int4 (layout::IntGroup), kivi:2, kivi:3 and kivi:4
/// (layout::Kivi; kivi:3 values with T a multiple of 32), turbo_mse:1..4 (layout::TurboMse), turbo_prod:2..4
/// (layout::TurboProd), qjl keys (layout::Qjl).
enum class BlockFormat {
  f16,
  int8,
  int4,
  kivi2,
  kivi3,
  kivi4,
  turbo1,
  turbo2,
  turbo3,
  turbo4,
  prod2,
  prod3,
  prod4,
  qjl,
  other
};

/// One run of pages of one (sequence, kv head) for n_q queries. The kernel folds the run into the n_q partial
/// states (m, l, o), which may already hold tokens (the online softmax rescales them).
struct KernelArgs {
  // Page pages[j]'s key block starts at pool + pages[j] * page_bytes + key_offset, its value block at
  // ... + value_offset; it holds tokens first_token + j T .. first_token + (j + 1) T - 1.
  const uint8_t* pool = nullptr;
  size_t page_bytes = 0, key_offset = 0, value_offset = 0;
  const uint32_t* pages = nullptr;
  size_t n_pages = 0;
  size_t first_token = 0;
  int d = 0;            ///< head dimension, a multiple of 16
  int T = 0;            ///< tokens per page, a multiple of 16, at most kMaxTokens
  int n_q = 0;          ///< queries
  int key_group = 0;    ///< int keys: channels per fp16 scale (a multiple of 8)
  int value_group = 0;  ///< int and kivi values: channels per fp16 scale (a multiple of 16)
  /// int, kivi: scales_offset(); turbo_mse, turbo_prod, qjl: the norms' offset
  size_t key_scales_offset = 0, value_scales_offset = 0;
  size_t key_mins_offset = 0, value_mins_offset = 0;  ///< kivi: the block's mins_offset()
  const float* key_levels = nullptr;    ///< turbo keys: the 16 nibble levels (TurboMseParams::nibble_levels)
  const float* value_levels = nullptr;  ///< turbo values: the same
  /// turbo_mse keys in the fast kernels: the levels as unsigned bytes l_j + 128 and their unit (signed_byte_levels.hpp)
  const uint8_t* key_level_bytes = nullptr;
  float key_level_unit = 0;
  int key_space = 0;    ///< floats per query row: d, d + m (turbo_prod: [R q | S q]) or m (qjl: S q)
  int value_space = 0;  ///< floats per output row: d, or d + m (turbo_prod: [R o | S o])
  /// turbo_prod, qjl: the sign tiles' offset (layout::SignTiles), the residual norms' offset, sqrt(pi/2) / m;
  /// kivi:3: the signs' offset is its high-bit plane's (layout::Kivi::plane_offset(1), tiles of 1-bit codes)
  size_t key_signs_offset = 0, value_signs_offset = 0;
  size_t key_residual_norms_offset = 0, value_residual_norms_offset = 0;
  float key_sketch_scale = 0, value_sketch_scale = 0;
  const float* q = nullptr;  ///< n_q x key_space queries in the key codec's space, softmax scale and key lambda folded
  const size_t* visible = nullptr;  ///< n_q causal limits: query i sees tokens t < visible[i]
  float* m = nullptr;               ///< n_q running maxima (-inf: no token yet)
  float* l = nullptr;               ///< n_q running sums of exp(s - m)
  float* o = nullptr;  ///< n_q x value_space unnormalized outputs in the value codec's space, value lambda left out
  uint8_t* scratch = nullptr;       ///< kernel_scratch_bytes(n_q, d) bytes, 64-byte aligned, for the kernel's own use
};

/// Scratch a kernel may use per run (queries prepared in its own format).
constexpr size_t kernel_scratch_bytes(int n_q, int d) {
  return static_cast<size_t>(n_q) * (4 * static_cast<size_t>(d) + 256);
}

/// The largest page a fused kernel takes (its scratch lives on the stack).
constexpr int kMaxTokens = 128;
/// The largest head dimension a codec takes.
constexpr int kMaxDim = 512;
/// The largest query row a fused kernel takes (key_space: turbo_prod's d + m, qjl's m).
constexpr int kMaxKeySpace = 2 * kMaxDim;

using KernelFn = void (*)(const KernelArgs&);

// What each instruction set's translation unit offers: the fused kernel for a pair of formats, or null.
namespace scalar {
KernelFn fused_kernel(BlockFormat key, BlockFormat value);
}
namespace avx2 {
KernelFn fused_kernel(BlockFormat key, BlockFormat value);
/// The fast kernel (Precision::fast) for the pair, or null.
KernelFn fast_kernel(BlockFormat key, BlockFormat value);
}
namespace avx512 {
KernelFn fused_kernel(BlockFormat key, BlockFormat value);
}
namespace avx512vnni {
KernelFn fused_kernel(BlockFormat key, BlockFormat value);
/// The fast kernel (Precision::fast) for the pair, or null.
KernelFn fast_kernel(BlockFormat key, BlockFormat value);
}
namespace avx512bf16 {
/// The fast kernel (Precision::fast) for the pair, or null; no exact kernels (they are avx512vnni's).
KernelFn fast_kernel(BlockFormat key, BlockFormat value);
}
namespace neon {
KernelFn fused_kernel(BlockFormat key, BlockFormat value);
}

}  // namespace kvq::detail

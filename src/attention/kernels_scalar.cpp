// The fused kernels in plain C++: the reference the SIMD kernels are tested against, and what runs under
// KVQ_ISA=scalar. One query at a time, each token decoded from the layout (kvq/block_layout.hpp) per query.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "attention/kernel_args.hpp"
#include "kvq/block_layout.hpp"
#include "kvq/half.hpp"

namespace kvq::detail::scalar {
namespace {

// The index of token t, channel c in a LaneCodes section.
unsigned lane_code(const layout::LaneCodes& l, const uint8_t* codes, size_t t, size_t c) {
  unsigned idx = 0, low = 0;
  for (size_t p = 0; p < l.parts(); ++p) {
    const auto at = l.place(t, c, p);
    idx |= ((codes[at.byte] >> at.shift) & ((1u << at.width) - 1)) << low;
    low += at.width;
  }
  return idx;
}

// Token t of a block as floats: the codec's space (key_space floats for keys), an int codec's lambda left out.
template <BlockFormat F>
void read_token(const KernelArgs& a, const uint8_t* block, bool key, int t, float* x) {
  const size_t d = static_cast<size_t>(a.d), ut = static_cast<size_t>(t);
  if constexpr (F == BlockFormat::prod3) {  // [||k|| c[idx] | sqrt(pi/2)/m ||r|| sign(S r)]
    const layout::TurboProd l{d, static_cast<size_t>(a.T), 3, static_cast<size_t>(a.key_space) - d, true};
    uint16_t h, hr;
    std::memcpy(&h, block + l.mse().norms_offset() + 2 * ut, 2);
    std::memcpy(&hr, block + l.residual_norms_offset() + 2 * ut, 2);
    for (size_t c = 0; c < d; ++c) x[c] = f16_to_f32(h) * a.key_levels[lane_code(l.mse().codes(), block, ut, c)];
    const float magnitude = a.key_sketch_scale * f16_to_f32(hr);
    for (size_t r = 0; r < l.m; ++r) x[d + r] = (block[l.sign_byte(ut, r)] >> (r % 8)) & 1 ? magnitude : -magnitude;
  } else if constexpr (F == BlockFormat::f16) {
    for (size_t c = 0; c < d; ++c) {
      uint16_t h;
      std::memcpy(&h, block + 2 * (ut * d + c), 2);
      x[c] = f16_to_f32(h);
    }
  } else if constexpr (F == BlockFormat::kivi2 || F == BlockFormat::kivi4) {
    const layout::Kivi l{d, static_cast<size_t>(a.T), F == BlockFormat::kivi2 ? 2u : 4u,
                         static_cast<size_t>(key ? a.key_group : a.value_group), key};
    for (size_t c = 0; c < d; ++c) {
      uint16_t m, s;
      std::memcpy(&m, block + l.mins_offset() + 2 * l.param(ut, c), 2);
      std::memcpy(&s, block + l.scales_offset() + 2 * l.param(ut, c), 2);
      const unsigned code = l.code(block[l.code_byte(ut, c)], l.code_shift(ut, c));
      x[c] = f16_to_f32(m) + f16_to_f32(s) * static_cast<float>(code);
    }
  } else if constexpr (F == BlockFormat::turbo2 || F == BlockFormat::turbo3 || F == BlockFormat::turbo4) {
    const size_t bits = F == BlockFormat::turbo2 ? 2 : F == BlockFormat::turbo3 ? 3 : 4;
    const layout::TurboMse l{d, static_cast<size_t>(a.T), bits, key};
    const float* level = key ? a.key_levels : a.value_levels;  // level[idx] = c[idx] for b >= 2
    uint16_t h;
    std::memcpy(&h, block + l.norms_offset() + 2 * ut, 2);
    for (size_t c = 0; c < d; ++c) x[c] = f16_to_f32(h) * level[lane_code(l.codes(), block, ut, c)];
  } else {
    const size_t G = static_cast<size_t>(key ? a.key_group : a.value_group);
    const layout::IntGroup l{d, static_cast<size_t>(a.T), F == BlockFormat::int8 ? 8u : 4u, G, key};
    for (size_t c = 0; c < d; ++c) {
      uint16_t h;
      std::memcpy(&h, block + l.scale_byte(ut, c / G), 2);
      const int code = l.code(block[l.code_byte(ut, c)], l.code_shift(ut, c));
      x[c] = f16_to_f32(h) * static_cast<float>(code);
    }
  }
}

template <BlockFormat K, BlockFormat V>
void attend(const KernelArgs& a) {
  const size_t d = static_cast<size_t>(a.d), T = static_cast<size_t>(a.T), kd = static_cast<size_t>(a.key_space);
  float x[2 * kMaxDim], s[kMaxTokens];
  for (size_t j = 0; j < a.n_pages; ++j) {
    const uint8_t* page = a.pool + a.page_bytes * a.pages[j];
    const size_t base = a.first_token + j * T;
    for (size_t i = 0; i < static_cast<size_t>(a.n_q); ++i) {
      const size_t seen = a.visible[i] > base ? std::min(a.visible[i] - base, T) : 0;
      if (seen == 0) continue;
      const float* q = a.q + i * kd;
      float* o = a.o + i * d;
      float block_max = -std::numeric_limits<float>::infinity();
      for (size_t t = 0; t < seen; ++t) {
        read_token<K>(a, page + a.key_offset, true, static_cast<int>(t), x);
        float dot = 0;
        for (size_t c = 0; c < kd; ++c) dot += q[c] * x[c];
        s[t] = dot;
        block_max = std::max(block_max, dot);
      }
      const float mx = std::max(a.m[i], block_max);
      if (mx > a.m[i] && a.m[i] != -std::numeric_limits<float>::infinity()) {
        const float alpha = std::exp(a.m[i] - mx);
        for (size_t c = 0; c < d; ++c) o[c] *= alpha;
        a.l[i] *= alpha;
      }
      a.m[i] = mx;
      for (size_t t = 0; t < seen; ++t) {
        const float p = std::exp(s[t] - mx);
        a.l[i] += p;
        read_token<V>(a, page + a.value_offset, false, static_cast<int>(t), x);
        for (size_t c = 0; c < d; ++c) o[c] += p * x[c];
      }
    }
  }
}

}  // namespace

// Every pair of f16, int8, int4, kivi:2, kivi:4 and turbo_mse:2..4; turbo_prod:3 keys with any of these values.
template <BlockFormat K>
KernelFn with_keys(BlockFormat value) {
  using F = BlockFormat;
  return value == F::f16      ? attend<K, F::f16>
         : value == F::int8   ? attend<K, F::int8>
         : value == F::int4   ? attend<K, F::int4>
         : value == F::kivi2  ? attend<K, F::kivi2>
         : value == F::kivi4  ? attend<K, F::kivi4>
         : value == F::turbo2 ? attend<K, F::turbo2>
         : value == F::turbo3 ? attend<K, F::turbo3>
         : value == F::turbo4 ? attend<K, F::turbo4>
                              : nullptr;
}

KernelFn fused_kernel(BlockFormat key, BlockFormat value) {
  using F = BlockFormat;
  return key == F::f16      ? with_keys<F::f16>(value)
         : key == F::int8   ? with_keys<F::int8>(value)
         : key == F::int4   ? with_keys<F::int4>(value)
         : key == F::kivi2  ? with_keys<F::kivi2>(value)
         : key == F::kivi4  ? with_keys<F::kivi4>(value)
         : key == F::turbo2 ? with_keys<F::turbo2>(value)
         : key == F::turbo3 ? with_keys<F::turbo3>(value)
         : key == F::turbo4 ? with_keys<F::turbo4>(value)
         : key == F::prod3  ? with_keys<F::prod3>(value)
                            : nullptr;
}

}  // namespace kvq::detail::scalar

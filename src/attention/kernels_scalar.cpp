// The fused kernels in plain C++: the reference the SIMD kernels are tested against, and what runs under
// KVQ_ISA=scalar. One query at a time, each token decoded from the layout (src/codec/block_layout.hpp) per query.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "attention/kernel_args.hpp"
#include "codec/block_layout.hpp"
#include "core/half.hpp"

namespace kvq::detail::scalar {
namespace {

// The nibble that the index of token t, channel c in a LaneCodes section decodes from: the index (b >= 2), or the
// 1-bit index at bit 2 (b = 1; the nibble levels, TurboMseParams::nibble_levels, read it there).
unsigned lane_nibble(const layout::LaneCodes& l, const uint8_t* codes, size_t t, size_t c) {
  unsigned idx = 0, low = 0;
  for (size_t p = 0; p < l.parts(); ++p) {
    const auto at = l.place(t, c, p);
    idx |= ((codes[at.byte] >> at.shift) & ((1u << at.width) - 1)) << low;
    low += at.width;
  }
  return l.bits == 1 ? idx << 2 : idx;
}

// Sign row r of token t in a SignTiles section at `signs`: +magnitude when set, else -magnitude.
float signed_magnitude(const layout::SignTiles& l, const uint8_t* signs, size_t t, size_t r, float magnitude) {
  return (signs[l.byte(t, r)] >> l.shift(t, r)) & 1 ? magnitude : -magnitude;
}

// Token t of a block as floats: the codec's space (key_space floats for keys, value_space for values), an int
// codec's lambda left out.
template <BlockFormat F>
void read_token(const KernelArgs& a, const uint8_t* block, bool key, int t, float* x) {
  using BF = BlockFormat;
  const size_t d = static_cast<size_t>(a.d), ut = static_cast<size_t>(t);
  if constexpr (F == BF::prod2 || F == BF::prod3 || F == BF::prod4) {  // [||x|| c[idx] | sqrt(pi/2)/m ||r|| sign]
    const size_t bits = F == BF::prod2 ? 2 : F == BF::prod3 ? 3 : 4;
    const size_t m = static_cast<size_t>(key ? a.key_space : a.value_space) - d;
    const layout::TurboProd l{d, static_cast<size_t>(a.T), bits, m, key};
    uint16_t h, hr;
    std::memcpy(&h, block + l.mse().norms_offset() + 2 * ut, 2);
    std::memcpy(&hr, block + l.residual_norms_offset() + 2 * ut, 2);
    const float* level = key ? a.key_levels : a.value_levels;
    for (size_t c = 0; c < d; ++c) x[c] = f16_to_f32(h) * level[lane_nibble(l.mse().codes(), block, ut, c)];
    const float magnitude = (key ? a.key_sketch_scale : a.value_sketch_scale) * f16_to_f32(hr);
    for (size_t r = 0; r < m; ++r) x[d + r] = signed_magnitude(l.signs(), block + l.signs_offset(), ut, r, magnitude);
  } else if constexpr (F == BF::qjl) {  // sqrt(pi/2)/m ||k|| sign(S k)
    const layout::Qjl l{d, static_cast<size_t>(a.T), static_cast<size_t>(a.key_space)};
    uint16_t h;
    std::memcpy(&h, block + l.norms_offset() + 2 * ut, 2);
    const float magnitude = a.key_sketch_scale * f16_to_f32(h);
    for (size_t r = 0; r < l.m; ++r) x[r] = signed_magnitude(l.signs(), block, ut, r, magnitude);
  } else if constexpr (F == BlockFormat::f16) {
    for (size_t c = 0; c < d; ++c) {
      uint16_t h;
      std::memcpy(&h, block + 2 * (ut * d + c), 2);
      x[c] = f16_to_f32(h);
    }
  } else if constexpr (F == BlockFormat::kivi2 || F == BlockFormat::kivi3 || F == BlockFormat::kivi4) {
    const size_t bits = F == BlockFormat::kivi2 ? 2 : F == BlockFormat::kivi3 ? 3 : 4;
    const layout::Kivi l{d, static_cast<size_t>(a.T), bits, static_cast<size_t>(key ? a.key_group : a.value_group),
                         key};
    for (size_t c = 0; c < d; ++c) {
      uint16_t m, s;
      std::memcpy(&m, block + l.mins_offset() + 2 * l.param(ut, c), 2);
      std::memcpy(&s, block + l.scales_offset() + 2 * l.param(ut, c), 2);
      const unsigned code = l.read_code(block, ut, c);
      x[c] = f16_to_f32(m) + f16_to_f32(s) * static_cast<float>(code);
    }
  } else if constexpr (F == BF::turbo1 || F == BF::turbo2 || F == BF::turbo3 || F == BF::turbo4) {
    const size_t bits = F == BF::turbo1 ? 1 : F == BF::turbo2 ? 2 : F == BF::turbo3 ? 3 : 4;
    const layout::TurboMse l{d, static_cast<size_t>(a.T), bits, key};
    const float* level = key ? a.key_levels : a.value_levels;
    uint16_t h;
    std::memcpy(&h, block + l.norms_offset() + 2 * ut, 2);
    for (size_t c = 0; c < d; ++c) x[c] = f16_to_f32(h) * level[lane_nibble(l.codes(), block, ut, c)];
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
  const size_t T = static_cast<size_t>(a.T), kd = static_cast<size_t>(a.key_space);
  const size_t vd = static_cast<size_t>(a.value_space);
  float x[kMaxKeySpace], s[kMaxTokens];
  for (size_t j = 0; j < a.n_pages; ++j) {
    const uint8_t* page = a.pool + a.page_bytes * a.pages[j];
    const size_t base = a.first_token + j * T;
    for (size_t i = 0; i < static_cast<size_t>(a.n_q); ++i) {
      const size_t seen = a.visible[i] > base ? std::min(a.visible[i] - base, T) : 0;
      if (seen == 0) continue;
      const float* q = a.q + i * kd;
      float* o = a.o + i * vd;
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
        for (size_t c = 0; c < vd; ++c) o[c] *= alpha;
        a.l[i] *= alpha;
      }
      a.m[i] = mx;
      for (size_t t = 0; t < seen; ++t) {
        const float p = std::exp(s[t] - mx);
        a.l[i] += p;
        read_token<V>(a, page + a.value_offset, false, static_cast<int>(t), x);
        for (size_t c = 0; c < vd; ++c) o[c] += p * x[c];
      }
    }
  }
}

}  // namespace

// Every pair of f16, int8, int4, kivi:2..4, turbo_mse:1..4 and turbo_prod:2..4; qjl keys with any of these
// values.
template <BlockFormat K>
KernelFn with_keys(BlockFormat value) {
  using F = BlockFormat;
  switch (value) {
    case F::f16:
      return attend<K, F::f16>;
    case F::int8:
      return attend<K, F::int8>;
    case F::int4:
      return attend<K, F::int4>;
    case F::kivi2:
      return attend<K, F::kivi2>;
    case F::kivi3:
      return attend<K, F::kivi3>;
    case F::kivi4:
      return attend<K, F::kivi4>;
    case F::turbo1:
      return attend<K, F::turbo1>;
    case F::turbo2:
      return attend<K, F::turbo2>;
    case F::turbo3:
      return attend<K, F::turbo3>;
    case F::turbo4:
      return attend<K, F::turbo4>;
    case F::prod2:
      return attend<K, F::prod2>;
    case F::prod3:
      return attend<K, F::prod3>;
    case F::prod4:
      return attend<K, F::prod4>;
    case F::qjl:  // keys only
    case F::other:
      break;
  }
  return nullptr;
}

KernelFn fused_kernel(BlockFormat key, BlockFormat value) {
  using F = BlockFormat;
  switch (key) {
    case F::f16:
      return with_keys<F::f16>(value);
    case F::int8:
      return with_keys<F::int8>(value);
    case F::int4:
      return with_keys<F::int4>(value);
    case F::kivi2:
      return with_keys<F::kivi2>(value);
    case F::kivi3:
      return with_keys<F::kivi3>(value);
    case F::kivi4:
      return with_keys<F::kivi4>(value);
    case F::turbo1:
      return with_keys<F::turbo1>(value);
    case F::turbo2:
      return with_keys<F::turbo2>(value);
    case F::turbo3:
      return with_keys<F::turbo3>(value);
    case F::turbo4:
      return with_keys<F::turbo4>(value);
    case F::prod2:
      return with_keys<F::prod2>(value);
    case F::prod3:
      return with_keys<F::prod3>(value);
    case F::prod4:
      return with_keys<F::prod4>(value);
    case F::qjl:
      return with_keys<F::qjl>(value);
    case F::other:
      break;
  }
  return nullptr;
}

}  // namespace kvq::detail::scalar

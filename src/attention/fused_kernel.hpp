// The fused page loop over f16, int8, int4, kivi, turbo_mse, turbo_prod and qjl blocks, written once over an instruction
// set's vector traits V and included only by the per-ISA translation units (kernels_avx2.cpp, kernels_avx512.cpp,
// kernels_avx512_vnni.cpp, kernels_avx512_bf16.cpp), which compile it with their target flags. Everything here has
// internal linkage (kernel_args.hpp says why).
//
// Per page and pass of up to kMaxQ queries (the GQA group, or a slice of a prefill chunk's rows):
//   1. scores of all the pass's queries in one sweep over the keys, every key element decoded once into a register
//      and multiplied into each query's accumulator;
//   2. the causal mask and the online softmax on whole vectors (a polynomial exp);
//   3. the values summed for all queries in one sweep, every value element decoded once.
// While page j is read, page j + 1's blocks are prefetched into L2 at the same pace (T1 hint), one page ahead.
//
// The formats (src/codec/block_layout.hpp):
//   f16 keys: token-major rows; each query's products with one token fill one vector, and W tokens' vectors are
//     summed across lanes at once (transpose_sum).
//   int keys: 64-byte tiles of 16 tokens x E = 32 / bits channels, one 32-bit lane per token: a lane-wise extract gives
//     one channel of W tokens, scored against a broadcast query element; per channel group the dot products are
//     multiplied by the W tokens' scales (one vector) and added to the scores.
//   f16 values: token-major rows, W channels a vector, the weight broadcast.
//   int values: tiles of E tokens x 16 channels, one lane per channel; the weight of token t for channel group g is
//     p_t * s_t,g, formed once per page and group.
//   turbo_mse keys and values (x = ||x|| c[idx]): LaneCodes tiles, each chunk of 32 elements of a lane decoded into
//     four nibble lanes (a shift and a bit select), each element by a shift and a 16-entry table lookup; then as the
//     int formats with the norms as the per-token scales (one group of d channels).
//   turbo_prod:b keys: the turbo_mse:(b-1) part as above, plus ||r_t|| sqrt(pi/2)/m <S q, sign_t> from sign tiles
//     of 16 tokens x 32 rows: the sum of (S q)_r over the set bits P (a masked add per row, off the FMA pipes),
//     then <S q, sign_t> = 2 P - sum_r (S q)_r; the query rows are [R q | S q] (KernelArgs::key_space floats).
//   qjl keys: the sign part alone, with ||k_t||; the query rows are S q.
//   turbo_prod:b values: the turbo_mse:(b-1) part as above into the first d floats of an output row, and
//     sum_t p_t ||r_t|| sqrt(pi/2)/m sign_t,r into the m after them, from sign tiles of 32 tokens x 16 rows (one lane
//     per row): a masked add of the token's weight per token, as the keys' rows.
//   kivi keys and values: the int tiles with unsigned codes q (x = m + s q); kivi:3's codes in two planes of such
//     tiles, the low two bits (kivi:2's) and the high bit (1-bit codes: keys 16 tokens x 32 channels a tile, values
//     32 tokens x 16 channels), joined in registers (for_kivi_codes). Keys: per page the queries times the
//     channel scales s_c and the bias <q, m> (one per query), then the int key loop without token scales (the fast
//     kernels: the scaled queries as two 8-bit digits against the codes by integer dot products, key_scores_kivi_int).
//     Values: the int value loop with the weights p_t s_t,g, plus sum_t p_t m_t,g added to every channel of group g
//     (AVX512-BF16's fast kernels: two tokens per bf16 dot product, values_kivi_bf16).
// f16 elements become floats without vcvtph2ps where the head dimension allows (f16_split below).
// An int code becomes a float in three operations: shift it to the top of its lane, shift it back arithmetically
// (sign extension), convert.
#pragma once

#include <cstring>
#include <limits>
#include <utility>

#include "attention/kernel_args.hpp"
#include "attention/query_digits.hpp"

namespace kvq::detail {
namespace {

// V, the vector traits, provides:
//   W lanes; float vector F, integer vector I; zero(), set1(x), load(p), store(p, x), fma(a, b, c) = a * b + c,
//   fma1(a, const float* b, c) = a * broadcast(*b) + c, mul, sub, max;
//   load_f16(p): W fp16 values; f16_split(p, even, odd): 2W fp16 values as two vectors (even and odd elements),
//   each value times 2^-112; load_i(p): W 32-bit lanes; element<Bits, J>(x): element J (Bits wide) of each lane
//   as a signed float; uelement<Bits, J>(x): the same element as an unsigned float (kivi codes); top3(x): the top
//   three bits of each lane as an unsigned float (kivi:3's codes, joined there by kivi3_code);
//   shr<N>(x), shl<N>(x): 32-bit lanes shifted logically (N = 0: x); select_bits(a, b, mask): a's bits where mask
//   is set, else b's; Table, load_table(16 floats), lookup(table, x): the entry of each lane's low 4 bits (turbo);
//   Mask, test_bit<R>(x): the lanes whose bit R is set, add_masked(acc, mask, const float* b): acc + broadcast(*b)
//   in those lanes (turbo_prod's sign bits);
//   hmax(x), hsum(x), first(x) (lane 0); exp(x) (0 below -87.3, for x <= 88); mask_tail(x, n): lanes >= n set to -inf;
//   transpose_sum(v): lane t = the sum of the W lanes of v[t W .. t W + W - 1]; prefetch(p) into L2;
//   kAccumulators: vectors a loop may keep accumulating in registers; kMaxQ: queries per pass (8 or 4);
//   kVnni: int keys by integer dot products, with dpbusd(acc, u8 lanes, 4 s8 broadcast from memory) (int8 keys),
//   dpbusd2(acc, u0, s0, u1, s1): the two at once (int4 keys: codes below 16), xor_i, and_i, srl4 and sll8 (32-bit
//   lanes shifted), add_i, sub_i (an int32 broadcast from memory) and cvt (int32 -> fp32). AVX512-VNNI has them as
//   instructions; AVX2's fast kernel for int4 keys by vpmaddubsw and vpmaddwd (kernels_avx2.cpp). For turbo_mse keys
//   also kLevelDigitBits (the query digits' width that its dpbusd2 keeps exact against bytes up to 255),
//   load_bytes16(p) (16 bytes in every 128-bit lane) and shuffle_bytes(table, x) (each byte's entry by its low 4 bits;
//   kivi:3's keys and bf16 values move the high bits' bytes with it, zero where an index byte's top bit is set).
//   For kivi keys also abs(x) and kivi_digits(w, inv, order, out): 16 floats' two 8-bit digits of w inv as 32 bytes.
//   Bf16Values (AVX512-BF16 only): tile_pairs<E>(x) (16 tokens in pairs (j, j + E/2) of each tile of E tokens),
//   to_bf16(lo, hi) (32 bf16, rounded to nearest), store_i, bf16_ones(), dpbf16(acc, a, b) and dpbf16_1(acc, a, one
//   pair broadcast from memory): acc + per lane the two products of its bf16 pair; and_xor(x, mask, flip) =
//   (x & mask) ^ flip; bf16_table(16 floats), lookup16(table, x): each 16-bit lane's entry as bf16 (turbo_mse).

constexpr float kMinusInf = -std::numeric_limits<float>::infinity();

// Calls f(std::integral_constant<int, J>) for J = 0..E-1: the element index must be a compile-time shift.
template <int E, class Fn>
inline void for_elements(Fn&& f) {
  [&]<int... J>(std::integer_sequence<int, J...>) { (f(std::integral_constant<int, J>{}), ...); }
  (std::make_integer_sequence<int, E>{});
}

// x shifted left by N bits, or right (logically) by -N.
template <class V, int N>
typename V::I shift_up(typename V::I x) {
  if constexpr (N >= 0) {
    return V::template shl<N>(x);
  } else {
    return V::template shr<-N>(x);
  }
}

constexpr int bits_of(BlockFormat f) {
  return f == BlockFormat::int8 ? 8 : f == BlockFormat::kivi2 ? 2 : f == BlockFormat::kivi3 ? 3 : 4;
}
constexpr bool is_kivi(BlockFormat f) {
  return f == BlockFormat::kivi2 || f == BlockFormat::kivi3 || f == BlockFormat::kivi4;
}
constexpr bool is_int(BlockFormat f) { return f == BlockFormat::int8 || f == BlockFormat::int4; }
constexpr bool is_turbo(BlockFormat f) {
  return f == BlockFormat::turbo1 || f == BlockFormat::turbo2 || f == BlockFormat::turbo3 || f == BlockFormat::turbo4;
}
constexpr bool is_prod(BlockFormat f) {
  return f == BlockFormat::prod2 || f == BlockFormat::prod3 || f == BlockFormat::prod4;
}
// The bits of a turbo_mse block's indices, or of a turbo_prod block's turbo_mse part.
constexpr int turbo_bits(BlockFormat f) {
  using F = BlockFormat;
  return f == F::turbo1 || f == F::prod2 ? 1 : f == F::turbo2 || f == F::prod3 ? 2 : f == F::turbo3 || f == F::prod4 ? 3 : 4;
}

// Prefetches the next page's block at the pace the current one is read, one page ahead: either along(p) beside each
// load of a line p of the current block (the line at the same offset in the next block: the prefetches spread
// evenly through the inner loop, a line per line read), or step(u, n) after unit u of n of the current block.
template <class V>
struct Prefetch {
  const uint8_t* next = nullptr;  // null: nothing to prefetch (the last page)
  size_t bytes = 0, done = 0;
  ptrdiff_t ahead = 0;  // next - the current block; 0 on the last page (along() then touches lines being read)

  Prefetch(const uint8_t* block, const uint8_t* next_block, size_t block_bytes)
      : next(next_block), bytes(block_bytes), ahead(next_block ? next_block - block : 0) {}

  void along(const uint8_t* p) const { V::prefetch(p + ahead); }
  void step(size_t unit, size_t units) {
    if (!next) return;
    for (const size_t target = bytes * (unit + 1) / units; done < target; done += 64) V::prefetch(next + done);
  }
};

size_t key_block_bytes(const KernelArgs& a, BlockFormat f) {
  const size_t d = static_cast<size_t>(a.d), T = static_cast<size_t>(a.T);
  if (f == BlockFormat::f16) return 2 * T * d;
  if (is_kivi(f)) return a.key_scales_offset + 2 * d;
  if (is_turbo(f) || f == BlockFormat::qjl) return a.key_scales_offset + 2 * T;
  if (is_prod(f)) return a.key_residual_norms_offset + 2 * T;
  return a.key_scales_offset + 2 * T * (d / static_cast<size_t>(a.key_group));
}

size_t value_block_bytes(const KernelArgs& a, BlockFormat f) {
  const size_t d = static_cast<size_t>(a.d), T = static_cast<size_t>(a.T);
  if (is_turbo(f)) return a.value_scales_offset + 2 * T;
  if (is_prod(f)) return a.value_residual_norms_offset + 2 * T;
  return f == BlockFormat::f16 ? 2 * T * d : a.value_scales_offset + 2 * T * (d / static_cast<size_t>(a.value_group));
}

// ---- keys: s[i * T + t] = <q_i, k_t> for the pass's NQ queries (q: NQ x d) -------------------------------------

template <class V, int NQ>
void key_scores_f16(const KernelArgs& a, const float* q, const uint8_t* block, Prefetch<V>& pf, float* s) {
  constexpr int W = V::W, TT = NQ <= 4 ? 2 : 1;  // tokens at a time: 2 NQ independent accumulators
  const int d = a.d, T = a.T, nv = d / W;
  alignas(64) float part[NQ][W * W];  // per query, W tokens' unreduced products
  for (int t0 = 0; t0 < T; t0 += W) {
    for (int tt = 0; tt < W; tt += TT) {
      typename V::F acc[TT][NQ];
      for (int u = 0; u < TT; ++u)
        for (int i = 0; i < NQ; ++i) acc[u][i] = V::zero();
      for (int c = 0; c < nv; ++c)
        for (int u = 0; u < TT; ++u) {
          const uint8_t* line = block + 2 * (static_cast<size_t>(t0 + tt + u) * d + c * W);
          const auto k = V::load_f16(line);
          for (int i = 0; i < NQ; ++i) acc[u][i] = V::fma(k, V::load(q + i * d + c * W), acc[u][i]);
          if ((c * W) % 32 == 0) pf.along(line);
        }
      for (int u = 0; u < TT; ++u)
        for (int i = 0; i < NQ; ++i) V::store(part[i] + (tt + u) * W, acc[u][i]);
    }
    for (int i = 0; i < NQ; ++i) V::store(s + i * T + t0, V::transpose_sum(part[i]));
  }
}

// f16 by integer operations: on Zen 4 vcvtph2ps takes a slot of the FMA pipes, which the FMAs need. A 64-bit lane
// pair of halves becomes two floats by moving each half's sign, exponent and mantissa to their fp32 places (two
// shifts and a mask): the value times 2^-112, exactly, zero and subnormal halves included (the f16 codec stores no
// Inf or NaN). The 2^112 is folded into the queries (keys; they must stay below 2^14 in magnitude) or the weights
// (values), and the even and odd elements of each block of 2W land in separate vectors: the queries, and the value
// accumulators, are kept in that permuted order (permute_blocks).
constexpr float kTwo112 = 5.192296858534828e33f;  // 2^112
constexpr float kSplitQueryMax = 16384.0f;          // 2^14: |q| 2^112 stays finite

// rows x d floats in place: within each block of 2W, natural order <-> even elements then odd elements.
template <int W>
void permute_blocks(float* x, int rows, int d, bool to_split) {
  float tmp[2 * W];
  for (int r = 0; r < rows; ++r)
    for (int b = 0; b < d; b += 2 * W) {
      float* blk = x + static_cast<size_t>(r) * d + b;
      for (int l = 0; l < W; ++l) {
        if (to_split) {
          tmp[l] = blk[2 * l], tmp[W + l] = blk[2 * l + 1];
        } else {
          tmp[2 * l] = blk[l], tmp[2 * l + 1] = blk[W + l];
        }
      }
      std::memcpy(blk, tmp, sizeof(tmp));
    }
}

// qs: the queries permuted and times 2^112.
template <class V, int NQ>
void key_scores_f16_split(const KernelArgs& a, const float* qs, const uint8_t* block, Prefetch<V>& pf, float* s) {
  constexpr int W = V::W, TT = NQ <= 4 ? 2 : 1;
  const int d = a.d, T = a.T;
  alignas(64) float part[NQ][W * W];
  for (int t0 = 0; t0 < T; t0 += W) {
    for (int tt = 0; tt < W; tt += TT) {
      typename V::F acc[TT][NQ];
      for (int u = 0; u < TT; ++u)
        for (int i = 0; i < NQ; ++i) acc[u][i] = V::zero();
      for (int c = 0; c < d; c += 2 * W)
        for (int u = 0; u < TT; ++u) {
          typename V::F even, odd;
          const uint8_t* line = block + 2 * (static_cast<size_t>(t0 + tt + u) * d + c);
          V::f16_split(line, even, odd);
          for (int i = 0; i < NQ; ++i)
            acc[u][i] = V::fma(odd, V::load(qs + i * d + c + W), V::fma(even, V::load(qs + i * d + c), acc[u][i]));
          if (c % 32 == 0) pf.along(line);
        }
      for (int u = 0; u < TT; ++u)
        for (int i = 0; i < NQ; ++i) V::store(part[i] + (tt + u) * W, acc[u][i]);
    }
    for (int i = 0; i < NQ; ++i) V::store(s + i * T + t0, V::transpose_sum(part[i]));
  }
}

// One token vector (W tokens) at a time; even and odd channels accumulate apart (2 NQ independent chains), so that
// every query element is used once and its broadcast rides in the FMA's memory operand.
template <class V, int NQ, int Bits>
void key_scores_int(const KernelArgs& a, const float* q, const uint8_t* block, Prefetch<V>& pf, float* s) {
  constexpr int W = V::W, E = 32 / Bits;
  const int d = a.d, T = a.T, G = a.key_group, groups = d / G, tiles = d / E, n_vec = T / W;
  const uint8_t* scales = block + a.key_scales_offset;
  for (int vec = 0; vec < n_vec; ++vec) {
    const int tok = vec * W;
    const uint8_t* lanes = block + static_cast<size_t>(tok / 16) * tiles * 64 + 4 * (tok % 16);
    for (int g = 0; g < groups; ++g) {
      typename V::F dot[2][NQ];
      for (int h = 0; h < 2; ++h)
        for (int i = 0; i < NQ; ++i) dot[h][i] = V::zero();
      for (int k = g * G / E; k < (g + 1) * G / E; ++k) {
        const auto x = V::load_i(lanes + 64 * k);
        for_elements<E>([&](auto j) {
          const auto f = V::template element<Bits, j>(x);
          for (int i = 0; i < NQ; ++i) dot[j % 2][i] = V::fma1(f, q + i * d + E * k + j, dot[j % 2][i]);
        });
      }
      const auto scale = V::load_f16(scales + 2 * ((static_cast<size_t>(tok / 16) * groups + g) * 16 + tok % 16));
      for (int i = 0; i < NQ; ++i) {
        float* si = s + i * T + tok;
        const auto dg = V::add(dot[0][i], dot[1][i]);
        V::store(si, g == 0 ? V::mul(scale, dg) : V::fma(scale, dg, V::load(si)));
      }
    }
    pf.step(static_cast<size_t>(vec), static_cast<size_t>(n_vec));
  }
}

// kivi codes: the b-bit plane (b = 2, 4), or kivi:3's 2-bit plane and its 1-bit plane of the high bits, in tiles
// along the lane's elements `stride` bytes apart (keys: 64, the channel tiles of 16 tokens; values: d / 16 x 64, the
// token tiles of 16 channels; both of kivi:3's planes alike). A chunk: the elements of one tile (E = 32 / b), or of
// kivi:3's 32 (low tiles 2k and 2k + 1, high tile k).
constexpr int kivi_chunk(int bits) { return bits == 3 ? 32 : 32 / bits; }

// A kivi:3 code as an unsigned float: element J of lo (a lane of the 2-bit plane) below bit H of hi (a lane of the
// 1-bit plane), joined at the top of the lane (lo's bits to 30..29, hi's to 31; two shifts and a bit select), then
// shifted back logically and converted (top3).
template <class V, int J, int H>
typename V::F kivi3_code(typename V::I lo, typename V::I hi) {
  return V::top3(V::select_bits(V::template shl<31 - H>(hi), shift_up<V, 29 - 2 * J>(lo), 0x80000000u));
}

// Calls f(code, j) for the elements j of chunk k (j an integral_constant, the codes as unsigned floats); `lanes`
// and `high`: the lanes of the 2-bit (b-bit) and the 1-bit planes.
template <class V, int Bits, class Fn>
void for_kivi_codes(const uint8_t* lanes, const uint8_t* high, size_t stride, int k, Fn&& f) {
  if constexpr (Bits == 3) {
    const auto lo0 = V::load_i(lanes + 2 * k * stride), lo1 = V::load_i(lanes + (2 * k + 1) * stride);
    const auto hi = V::load_i(high + k * stride);
    for_elements<16>([&](auto j) { f(kivi3_code<V, j, j>(lo0, hi), j); });
    for_elements<16>([&](auto j) { f(kivi3_code<V, j, 16 + j>(lo1, hi), std::integral_constant<int, 16 + j>{}); });
  } else {
    const auto x = V::load_i(lanes + k * stride);
    for_elements<32 / Bits>([&](auto j) { f(V::template uelement<Bits, j>(x), j); });
  }
}

// kivi keys: <q, m + s q_t> = <q, m> + sum_c (q_c s_c) q_t,c, the scaled queries and the bias formed per page.
template <class V, int NQ, int Bits>
void key_scores_kivi(const KernelArgs& a, const float* q, const uint8_t* block, Prefetch<V>& pf, float* s) {
  constexpr int W = V::W, C = kivi_chunk(Bits), LE = Bits == 3 ? 16 : 32 / Bits;  // LE: channels a low tile
  const int d = a.d, T = a.T, n_vec = T / W;
  const uint8_t* mins = block + a.key_mins_offset;
  const uint8_t* scales = block + a.key_scales_offset;
  alignas(64) float qs[NQ * kMaxDim];
  float bias[NQ];
  for (int i = 0; i < NQ; ++i) {
    auto b = V::zero();
    for (int c = 0; c < d; c += W) {
      const auto qc = V::load(q + i * d + c);
      b = V::fma(qc, V::load_f16(mins + 2 * c), b);
      V::store(qs + i * d + c, V::mul(qc, V::load_f16(scales + 2 * c)));
    }
    bias[i] = V::hsum(b);
  }
  for (int vec = 0; vec < n_vec; ++vec) {
    const int tok = vec * W;
    const size_t lane = 4 * static_cast<size_t>(tok % 16);
    const uint8_t* lanes = block + static_cast<size_t>(tok / 16) * (d / LE) * 64 + lane;
    const uint8_t* high = block + a.key_signs_offset + static_cast<size_t>(tok / 16) * (d / 32) * 64 + lane;
    typename V::F dot[2][NQ];
    for (int h = 0; h < 2; ++h)
      for (int i = 0; i < NQ; ++i) dot[h][i] = V::zero();
    for (int k = 0; k < d / C; ++k)
      for_kivi_codes<V, Bits>(lanes, high, 64, k, [&](auto f, auto j) {
        for (int i = 0; i < NQ; ++i) dot[j % 2][i] = V::fma1(f, qs + i * d + C * k + j, dot[j % 2][i]);
      });
    for (int i = 0; i < NQ; ++i)
      V::store(s + i * T + tok, V::add(V::set1(bias[i]), V::add(dot[0][i], dot[1][i])));
    pf.step(static_cast<size_t>(vec), static_cast<size_t>(n_vec));
  }
}

// The four nibble lanes of a LaneCodes chunk (b lanes at p, p + 64, ...; layout::LaneCodes): element 8v + j at
// bits 4j..4j+3 of n[v]; the bits above an element's index are other elements' bits, which the table ignores.
template <class V, int Bits>
void nibble_lanes(const uint8_t* p, typename V::I n[4]) {
  if constexpr (Bits == 4) {
    for (int v = 0; v < 4; ++v) n[v] = V::load_i(p + 64 * v);
  } else if constexpr (Bits == 1) {  // the bit of element 8v + j at 4j + (v + 2) % 4 goes to 4j + 2
    const auto bits = V::load_i(p);
    n[0] = bits, n[1] = V::template shr<1>(bits), n[2] = V::template shl<2>(bits), n[3] = V::template shl<1>(bits);
  } else {
    const auto low0 = V::load_i(p), low1 = V::load_i(p + 64);
    if constexpr (Bits == 2) {
      n[0] = low0, n[1] = V::template shr<2>(low0), n[2] = low1, n[3] = V::template shr<2>(low1);
    } else {
      const auto high = V::load_i(p + 128);
      constexpr uint32_t kLow = 0x33333333u;  // the low 2 bits of each nibble; the high bit goes to bit 2
      n[0] = V::select_bits(low0, high, kLow);
      n[1] = V::select_bits(V::template shr<2>(low0), V::template shr<1>(high), kLow);
      n[2] = V::select_bits(low1, V::template shl<2>(high), kLow);
      n[3] = V::select_bits(V::template shr<2>(low1), V::template shl<1>(high), kLow);
    }
  }
}

// turbo_mse keys: s = ||k_t|| sum_c q_c c[idx_t,c]; one token vector at a time, every chunk of 32 channels decoded
// once for the pass's queries.
template <class V, int NQ, int Bits>
void key_scores_turbo(const KernelArgs& a, const float* q, const uint8_t* block, Prefetch<V>& pf, float* s) {
  constexpr int W = V::W;
  const int d = a.d, T = a.T, chunks = d / 32, n_vec = T / W;
  const auto table = V::load_table(a.key_levels);
  const uint8_t* norms = block + a.key_scales_offset;
  for (int vec = 0; vec < n_vec; ++vec) {
    const int tok = vec * W;
    const uint8_t* lanes = block + static_cast<size_t>(tok / 16) * chunks * Bits * 64 + 4 * (tok % 16);
    typename V::F dot[2][NQ];
    for (int h = 0; h < 2; ++h)
      for (int i = 0; i < NQ; ++i) dot[h][i] = V::zero();
    for (int k = 0; k < chunks; ++k) {
      typename V::I n[4];
      nibble_lanes<V, Bits>(lanes + 64 * Bits * k, n);
      for_elements<4>([&](auto v) {
        for_elements<8>([&](auto j) {
          const auto f = V::lookup(table, V::template shr<4 * j>(n[v]));
          const float* qc = q + 32 * k + 8 * v + j;
          for (int i = 0; i < NQ; ++i) dot[j % 2][i] = V::fma1(f, qc + i * d, dot[j % 2][i]);
        });
      });
    }
    const auto norm = V::load_f16(norms + 2 * tok);
    for (int i = 0; i < NQ; ++i) V::store(s + i * T + tok, V::mul(norm, V::add(dot[0][i], dot[1][i])));
    pf.step(static_cast<size_t>(vec), static_cast<size_t>(n_vec));
  }
}

// turbo_prod keys: s = ||k_t|| <R q, c[idx_t]> + sqrt(pi/2)/m ||r_t|| <S q, sign_t>; q rows [R q | S q]; Bits: of
// the turbo_mse part.
template <class V, int NQ, int Bits>
void key_scores_turbo_prod(const KernelArgs& a, const float* q, const uint8_t* block, Prefetch<V>& pf, float* s) {
  constexpr int W = V::W;
  const int d = a.d, T = a.T, qs = a.key_space, m = qs - d, chunks = d / 32, n_vec = T / W;
  const auto table = V::load_table(a.key_levels);
  const uint8_t* norms = block + a.key_scales_offset;
  const uint8_t* residual_norms = block + a.key_residual_norms_offset;
  float sketch_sum[NQ];  // sum_r (S q)_r
  for (int i = 0; i < NQ; ++i) {
    auto sum = V::zero();
    for (int r = 0; r < m; r += W) sum = V::add(sum, V::load(q + i * qs + d + r));
    sketch_sum[i] = V::hsum(sum);
  }
  for (int vec = 0; vec < n_vec; ++vec) {
    const int tok = vec * W;
    const uint8_t* lanes = block + static_cast<size_t>(tok / 16) * chunks * Bits * 64 + 4 * (tok % 16);
    const uint8_t* signs =
        block + a.key_signs_offset + static_cast<size_t>(tok / 16) * chunks * 64 + 4 * (tok % 16);
    typename V::F dot[2][NQ], set[2][NQ];
    for (int h = 0; h < 2; ++h)
      for (int i = 0; i < NQ; ++i) dot[h][i] = V::zero(), set[h][i] = V::zero();
    // Channel chunk k and sign tile k (m = d) side by side, so that the masked adds issue beside the FMAs.
    for (int k = 0; k < chunks; ++k) {
      typename V::I n[4];
      nibble_lanes<V, Bits>(lanes + 64 * Bits * k, n);
      const auto x = V::load_i(signs + 64 * k);
      for_elements<4>([&](auto v) {
        for_elements<8>([&](auto j) {
          const auto f = V::lookup(table, V::template shr<4 * j>(n[v]));
          const auto bit = V::template test_bit<8 * v + j>(x);
          const float* qc = q + 32 * k + 8 * v + j;
          for (int i = 0; i < NQ; ++i) {
            dot[j % 2][i] = V::fma1(f, qc + i * qs, dot[j % 2][i]);
            set[j % 2][i] = V::add_masked(set[j % 2][i], bit, qc + i * qs + d);
          }
        });
      });
    }
    const auto norm = V::load_f16(norms + 2 * tok);
    const auto magnitude = V::mul(V::load_f16(residual_norms + 2 * tok), V::set1(a.key_sketch_scale));
    for (int i = 0; i < NQ; ++i) {
      const auto signed_sum = V::sub(V::mul(V::set1(2.0f), V::add(set[0][i], set[1][i])), V::set1(sketch_sum[i]));
      V::store(s + i * T + tok, V::fma(norm, V::add(dot[0][i], dot[1][i]), V::mul(magnitude, signed_sum)));
    }
    pf.step(static_cast<size_t>(vec), static_cast<size_t>(n_vec));
  }
}

// qjl keys: s = sqrt(pi/2)/m ||k_t|| <S q, sign_t> = sqrt(pi/2)/m ||k_t|| (2 P - sum_r (S q)_r), P the sum of
// (S q)_r over the set bits; q rows S q (key_space = m floats, m a multiple of 32). Nothing else keeps the FMA pipes
// busy here, so every fourth row's bit is summed by masked adds (the add pipes) and the other rows' by an FMA with
// the bit as a float 0 or 1 (two shifts and a conversion, shared by the pass's queries).
template <class V, int NQ>
void key_scores_qjl(const KernelArgs& a, const float* q, const uint8_t* block, Prefetch<V>& pf, float* s) {
  constexpr int W = V::W;
  const int T = a.T, m = a.key_space, tiles = m / 32, n_vec = T / W;
  const uint8_t* norms = block + a.key_scales_offset;
  float sketch_sum[NQ];  // sum_r (S q)_r
  for (int i = 0; i < NQ; ++i) {
    auto sum = V::zero();
    for (int r = 0; r < m; r += W) sum = V::add(sum, V::load(q + i * m + r));
    sketch_sum[i] = V::hsum(sum);
  }
  for (int vec = 0; vec < n_vec; ++vec) {
    const int tok = vec * W;
    const uint8_t* signs = block + static_cast<size_t>(tok / 16) * tiles * 64 + 4 * (tok % 16);
    typename V::F set[NQ], dot[2][NQ];
    for (int i = 0; i < NQ; ++i) set[i] = V::zero(), dot[0][i] = V::zero(), dot[1][i] = V::zero();
    for (int k = 0; k < tiles; ++k) {
      const auto x = V::load_i(signs + 64 * k);
      for_elements<32>([&](auto r) {
        const float* qr = q + 32 * k + r;
        if constexpr (r % 4 == 0) {
          const auto bit = V::template test_bit<r>(x);
          for (int i = 0; i < NQ; ++i) set[i] = V::add_masked(set[i], bit, qr + i * m);
        } else {
          const auto bit = V::template uelement<1, r>(x);
          for (int i = 0; i < NQ; ++i) dot[r % 2][i] = V::fma1(bit, qr + i * m, dot[r % 2][i]);
        }
      });
    }
    const auto magnitude = V::mul(V::load_f16(norms + 2 * tok), V::set1(a.key_sketch_scale));
    for (int i = 0; i < NQ; ++i) {
      const auto p = V::add(set[i], V::add(dot[0][i], dot[1][i]));
      const auto signed_sum = V::sub(V::mul(V::set1(2.0f), p), V::set1(sketch_sum[i]));
      V::store(s + i * T + tok, V::mul(magnitude, signed_sum));
    }
    pf.step(static_cast<size_t>(vec), static_cast<size_t>(n_vec));
  }
}

// ---- int keys by integer dot products (V::kVnni) ----------------------------------------------------------------
// Each query in fixed point of Digits signed 8-bit digits, q_c ~ S sum_k D_k 256^(Digits-1-k): a dot product of 64
// u8 x s8 products per digit takes the place of four fp32 FMAs of 16. The codes enter as code + offset (offset 8
// for int4, 128 for int8: unsigned bytes; an int4 lane splits into even and odd channels). Per group, the digit sums
// of the top two digits are joined in int32 (256 P0 + P1; |P| <= 255 * 128 * 64), less the offset's share (offset
// times the same sum of the query's digits); with a third digit, 256 x that + P2 - offset sum D2 in fp32, one
// rounding each.
//   Digits = 3 (the exact kernels): q rounded to 2^-24 of its largest element, an fp32 dot product's rounding.
//   Digits = 1 or 2 (the fast kernels, docs/METHODS.md): q rounded to 2^-8 or 2^-16 of its largest element; the
//   integer sums stay exact, so the score's only extra error is that rounding.
//
// Prepared queries in the kernel's scratch: digits [d/E chunks of E channels][n_q][Digits][E channels] int8 (int4
// and turbo_mse: the 8 channels as the 4 even, then the 4 odd; a pass's digits for one chunk sit at fixed offsets
// from one pointer); then the offset corrections [n_q][groups][2] int32; then the scales S [n_q] float.
struct VnniQueries {
  const int8_t* digits;
  const int32_t* corrections;
  const float* scales;
};

// Bits: the keys' (4 for turbo_mse's level bytes, which take int4's channel order); DigitBits: each digit's
// (query_digits.hpp); G channels per correction, offset: what the key bytes add to the signed value (int4: 8, int8
// and turbo_mse: 128); unit: a factor of every scale (turbo_mse: the level bytes' unit).
template <int Bits, int Digits, int DigitBits = 8>
VnniQueries prepare_vnni_queries(const KernelArgs& a, int G, int offset, float unit = 1.0f) {
  static_assert(Digits < 3 || DigitBits == 8, "three digits join in fp32 as 256 x P01 + P2");
  constexpr int E = 32 / Bits;
  const int d = a.d, groups = d / G, n_q = a.n_q;
  auto* digits = reinterpret_cast<int8_t*>(a.scratch);
  auto* corrections = reinterpret_cast<int32_t*>(a.scratch + static_cast<size_t>(n_q) * Digits * d);
  auto* scales = reinterpret_cast<float*>(corrections + static_cast<size_t>(n_q) * groups * 2);
  for (int i = 0; i < n_q; ++i) {
    const float* q = a.q + static_cast<size_t>(i) * d;
    float amax = 0;
    for (int c = 0; c < d; ++c) amax = amax > q[c] ? (amax > -q[c] ? amax : -q[c]) : q[c];
    const float scale = digit_scale<Digits, DigitBits>(amax);  // 1 for a query too small to scale: zero digits
    scales[i] = scale * unit;
    int32_t* corr = corrections + static_cast<size_t>(i) * groups * 2;
    for (int k = 0; k < groups * 2; ++k) corr[k] = 0;
    for (int c = 0; c < d; ++c) {
      int32_t digit[Digits];
      query_digits<Digits, DigitBits>(q[c], scale, digit);
      const int slot = Bits == 4 ? (c % 2) * 4 + (c % 8) / 2 : c % 4;  // int4: even channels, then odd
      for (int k = 0; k < Digits; ++k)
        digits[(static_cast<size_t>(c / E) * n_q + i) * Digits * E + k * E + slot] = static_cast<int8_t>(digit[k]);
      if constexpr (Digits == 1) {
        corr[(c / G) * 2] += offset * digit[0];
      } else {
        corr[(c / G) * 2] += offset * ((1 << DigitBits) * digit[0] + digit[1]);
      }
      if constexpr (Digits == 3) corr[(c / G) * 2 + 1] += offset * digit[2];
    }
  }
  return {digits, corrections, scales};
}

template <class V, int NQ, int Bits, int Digits>
void key_scores_int_vnni(const KernelArgs& a, const VnniQueries& vq, int i0, const uint8_t* block, Prefetch<V>& pf,
                         float* s) {
  constexpr int W = V::W, E = 32 / Bits;
  const int d = a.d, T = a.T, G = a.key_group, groups = d / G, tiles = d / E, n_vec = T / W;
  const uint8_t* scales = block + a.key_scales_offset;
  const int8_t* digits = vq.digits + static_cast<size_t>(i0) * Digits * E;
  const size_t chunk_stride = static_cast<size_t>(a.n_q) * Digits * E;
  const int32_t* corrections = vq.corrections + static_cast<size_t>(i0) * groups * 2;
  for (int vec = 0; vec < n_vec; ++vec) {
    const int tok = vec * W;
    const uint8_t* lanes = block + static_cast<size_t>(tok / 16) * tiles * 64 + 4 * (tok % 16);
    typename V::F sc[NQ];
    for (int i = 0; i < NQ; ++i) sc[i] = V::zero();
    for (int g = 0; g < groups; ++g) {
      typename V::I acc[NQ][Digits];
      for (int i = 0; i < NQ; ++i)
        for (int k = 0; k < Digits; ++k) acc[i][k] = V::zero_i();
      for (int chunk = g * G / E; chunk < (g + 1) * G / E; ++chunk) {
        const int8_t* qd = digits + chunk * chunk_stride;
        if constexpr (Bits == 4) {
          const auto u = V::xor_i(V::load_i(lanes + 64 * chunk), 0x88888888u);  // two's complement -> code + 8
          const auto even = V::and_i(u, 0x0F0F0F0Fu), odd = V::and_i(V::srl4(u), 0x0F0F0F0Fu);
          for (int i = 0; i < NQ; ++i)
            for (int k = 0; k < Digits; ++k) {
              const int8_t* dk = qd + (i * Digits + k) * 8;
              acc[i][k] = V::dpbusd2(acc[i][k], even, dk, odd, dk + 4);
            }
        } else {
          const auto u = V::xor_i(V::load_i(lanes + 64 * chunk), 0x80808080u);  // two's complement -> code + 128
          for (int i = 0; i < NQ; ++i)
            for (int k = 0; k < Digits; ++k) acc[i][k] = V::dpbusd(acc[i][k], u, qd + (i * Digits + k) * 4);
        }
      }
      const auto scale = V::load_f16(scales + 2 * ((static_cast<size_t>(tok / 16) * groups + g) * 16 + tok % 16));
      for (int i = 0; i < NQ; ++i) {
        const int32_t* corr = corrections + (static_cast<size_t>(i) * groups + g) * 2;
        typename V::F dot;
        if constexpr (Digits == 1) {
          dot = V::cvt(V::sub_i(acc[i][0], corr));
        } else {
          const auto p01 = V::sub_i(V::add_i(V::sll8(acc[i][0]), acc[i][1]), corr);
          if constexpr (Digits == 2) {
            dot = V::cvt(p01);
          } else {
            dot = V::fma(V::cvt(p01), V::set1(256.0f), V::cvt(V::sub_i(acc[i][2], corr + 1)));
          }
        }
        sc[i] = V::fma(scale, dot, sc[i]);
      }
    }
    for (int i = 0; i < NQ; ++i) V::store(s + i * T + tok, V::mul(sc[i], V::set1(vq.scales[i0 + i])));
    pf.step(static_cast<size_t>(vec), static_cast<size_t>(n_vec));
  }
}

// turbo_mse keys by integer dot products (the fast kernels; docs/METHODS.md): the levels as unsigned bytes l_j + 128
// (KernelArgs::key_level_bytes, looked up by each code's nibble in a byte shuffle; level_j ~ unit l_j), the query as
// two digits of V::kLevelDigitBits bits (base B: 256 on AVX512-VNNI, 64 on AVX2, whose int16 sums bound the digits),
// per token s = norm unit S (B P0 + P1 - 128 sum_c (B D0_c + D1_c)), P_k = sum_c (l_c + 128) D_k,c. Exact in int32:
// |sum_c l_c (B D0_c + D1_c)| <= 127 x 32512 x 512 < 2^31 (d up to kMaxDim), so the wraps of the offset form
// cancel. The digits take int4's channel order: a nibble lane's even nibbles (channels 8v + 0, 2, 4, 6 of a chunk)
// are its low nibbles.
template <class V, BlockFormat K, int KeyDigits>
constexpr bool turbo_int_scores() {
  return V::kVnni && is_turbo(K) && KeyDigits == 2;
}

template <class V, int NQ, int Bits>
void key_scores_turbo_int(const KernelArgs& a, const VnniQueries& vq, int i0, const uint8_t* block, Prefetch<V>& pf,
                          float* s) {
  constexpr int W = V::W;
  const int d = a.d, T = a.T, chunks = d / 32, n_vec = T / W;
  const auto table = V::load_bytes16(a.key_level_bytes);
  const uint8_t* norms = block + a.key_scales_offset;
  const int8_t* digits = vq.digits + static_cast<size_t>(i0) * 2 * 8;
  const size_t eight_stride = static_cast<size_t>(a.n_q) * 2 * 8;  // digits of the next 8 channels
  const int32_t* corrections = vq.corrections + static_cast<size_t>(i0) * 2;
  for (int vec = 0; vec < n_vec; ++vec) {
    const int tok = vec * W;
    const uint8_t* lanes = block + static_cast<size_t>(tok / 16) * chunks * Bits * 64 + 4 * (tok % 16);
    typename V::I acc[NQ][2];
    for (int i = 0; i < NQ; ++i) acc[i][0] = V::zero_i(), acc[i][1] = V::zero_i();
    for (int k = 0; k < chunks; ++k) {
      typename V::I n[4];
      nibble_lanes<V, Bits>(lanes + 64 * Bits * k, n);
      for (int v = 0; v < 4; ++v) {
        const auto even = V::shuffle_bytes(table, V::and_i(n[v], 0x0F0F0F0Fu));
        const auto odd = V::shuffle_bytes(table, V::and_i(V::srl4(n[v]), 0x0F0F0F0Fu));
        const int8_t* qd = digits + static_cast<size_t>(4 * k + v) * eight_stride;
        for (int i = 0; i < NQ; ++i)
          for (int h = 0; h < 2; ++h) {
            const int8_t* dh = qd + (2 * i + h) * 8;
            acc[i][h] = V::dpbusd2(acc[i][h], even, dh, odd, dh + 4);
          }
      }
    }
    const auto norm = V::load_f16(norms + 2 * tok);
    for (int i = 0; i < NQ; ++i) {
      const auto p = V::sub_i(V::add_i(V::template shl<V::kLevelDigitBits>(acc[i][0]), acc[i][1]), corrections + 2 * i);
      V::store(s + i * T + tok, V::mul(norm, V::mul(V::cvt(p), V::set1(vq.scales[i0 + i]))));
    }
    pf.step(static_cast<size_t>(vec), static_cast<size_t>(n_vec));
  }
}

// kivi keys by integer dot products (the fast kernels; docs/METHODS.md): <q, m + s code_t> = <q, m> + <w, code_t>
// with w = q s (the page's channel scales), per page and query as two signed 8-bit digits, w_c ~ S (256 D0_c + D1_c),
// S = max_c |w_c| / 32512 (digit_scale). The unsigned codes enter vpdpbusd as they are (u8 x s8, no offset): per
// token s = <q, m> + S (256 P0 + P1), P_k = sum_c code_c D_k,c, exact in int32 (|256 P0 + P1| <= 32512 (2^b - 1) d
// < 2^31 for d up to kMaxDim). A lane of E = 32 / b codes is read as 8 / b slices (lane >> b m) & mask, m < 8 / b,
// whose byte j holds channel (8 / b) j + m; the digits of a lane's E channels lie in that order (slice m's 4 at byte
// 4 m), placed by one byte shuffle per 16 channels (kivi_slice_order).
template <class V, BlockFormat K, int KeyDigits>
constexpr bool kivi_int_scores() {
  return V::kVnni && is_kivi(K) && KeyDigits == 2;
}

// The shuffle from 16 channels in order to the slices' order: byte p takes channel at[p].
struct KiviSliceOrder {
  alignas(16) uint8_t at[16];
};

template <int Bits>
constexpr KiviSliceOrder kivi_slice_order() {
  constexpr int E = 32 / Bits, S = 8 / Bits;
  KiviSliceOrder order{};
  for (int c = 0; c < 16; ++c) order.at[c / E * E + 4 * (c % E % S) + c % E / S] = static_cast<uint8_t>(c);
  return order;
}

// kivi:3 keys (lanes of 16 channels' low two bits, kivi:2's, and of 32 channels' high bits): the codes 0..7 as
// bytes, formed per lane before the dot products (fewer operations than a second dot product per query and digit):
// the slices of the low bits as kivi:2's (u[m], byte j the code of channel 4 j + m), and the high bit of channel
// 4 j + m as bit 2 of that byte. The high bits of half h (channels 16 h .. 16 h + 15, bits 16 h .. 16 h + 15 of hi)
// are first spread a nibble a byte (byte j: channels 4 j .. 4 j + 3; a byte shuffle that doubles bytes 2 h and
// 2 h + 1, and a shift of the odd bytes), then bit m of each nibble goes to bit 2 by one shift and a bit select.
template <class V>
void kivi3_high_bits(typename V::I hi, int h, typename V::I u[4]) {
  alignas(16) static constexpr uint8_t kDouble[2][16] = {{0, 0, 1, 1, 4, 4, 5, 5, 8, 8, 9, 9, 12, 12, 13, 13},
                                                         {2, 2, 3, 3, 6, 6, 7, 7, 10, 10, 11, 11, 14, 14, 15, 15}};
  const auto doubled = V::shuffle_bytes(hi, V::load_bytes16(kDouble[h]));
  const auto nibbles = V::select_bits(V::template shr<4>(doubled), doubled, 0xFF00FF00u);
  for_elements<4>([&](auto m) { u[m] = V::select_bits(shift_up<V, 2 - m>(nibbles), u[m], 0x04040404u); });
}

template <class V, int NQ, int Bits>
void key_scores_kivi_int(const KernelArgs& a, const float* q, const uint8_t* block, Prefetch<V>& pf, float* s) {
  constexpr int W = V::W, LB = Bits == 3 ? 2 : Bits;  // LB: the bits of the (low) plane's codes
  constexpr int E = 32 / LB, S = 8 / LB;
  constexpr uint32_t kMask = 0x01010101u * ((1u << LB) - 1);  // each byte's low bits
  static constexpr KiviSliceOrder kOrder = kivi_slice_order<LB>();
  const int d = a.d, T = a.T, tiles = d / E, n_vec = T / W;
  const uint8_t* mins = block + a.key_mins_offset;
  const uint8_t* scales = block + a.key_scales_offset;
  alignas(64) float w[NQ * kMaxDim];
  alignas(64) int8_t digits[kMaxDim / 16][NQ][32];  // per 16 channels and query: the 16 top digits, the 16 low
  float bias[NQ], unit[NQ];
  typename V::F b[NQ], amax[NQ];
  for (int i = 0; i < NQ; ++i) b[i] = V::zero(), amax[i] = V::zero();
  for (int c = 0; c < d; c += W) {  // each scale and min converted once for the pass's queries
    const auto sc = V::load_f16(scales + 2 * c), mc = V::load_f16(mins + 2 * c);
    for (int i = 0; i < NQ; ++i) {
      const auto qc = V::load(q + i * d + c), wc = V::mul(qc, sc);
      b[i] = V::fma(qc, mc, b[i]);
      amax[i] = V::max(amax[i], V::abs(wc));
      V::store(w + i * d + c, wc);
    }
  }
  for (int i = 0; i < NQ; ++i) {
    bias[i] = V::hsum(b[i]);
    unit[i] = digit_scale<2>(V::hmax(amax[i]));  // 1 for a w too small to scale: zero digits, the score <q, m>
    const float inv = 1.0f / unit[i];
    for (int c = 0; c < d; c += 16) V::kivi_digits(w + i * d + c, inv, kOrder.at, digits[c / 16][i]);
  }
  for (int vec = 0; vec < n_vec; ++vec) {
    const int tok = vec * W;
    const size_t lane = 4 * static_cast<size_t>(tok % 16);
    const uint8_t* lanes = block + static_cast<size_t>(tok / 16) * tiles * 64 + lane;
    const uint8_t* high = block + a.key_signs_offset + static_cast<size_t>(tok / 16) * (d / 32) * 64 + lane;
    typename V::I acc[NQ][2];
    for (int i = 0; i < NQ; ++i) acc[i][0] = V::zero_i(), acc[i][1] = V::zero_i();
    for (int k = 0; k < tiles; ++k) {
      const auto x = V::load_i(lanes + 64 * k);
      typename V::I u[S];
      for_elements<S>([&](auto m) { u[m] = V::and_i(V::template shr<LB * m>(x), kMask); });
      if constexpr (Bits == 3) kivi3_high_bits<V>(V::load_i(high + 64 * (k / 2)), k % 2, u);
      for (int i = 0; i < NQ; ++i)
        for (int h = 0; h < 2; ++h) {
          const int8_t* dh = digits[k * E / 16][i] + 16 * h + k * E % 16;
          for (int m = 0; m < S; m += 2) acc[i][h] = V::dpbusd2(acc[i][h], u[m], dh + 4 * m, u[m + 1], dh + 4 * m + 4);
        }
    }
    for (int i = 0; i < NQ; ++i) {
      const auto p = V::add_i(V::sll8(acc[i][0]), acc[i][1]);
      V::store(s + i * T + tok, V::fma(V::cvt(p), V::set1(unit[i]), V::set1(bias[i])));
    }
    pf.step(static_cast<size_t>(vec), static_cast<size_t>(n_vec));
  }
}

// ---- values: o_i += sum_t p[i * T + t] v_t (o: NQ x d) ---------------------------------------------------------

// Vectors of W channels summed in registers at a time, for NQ queries.
template <class V, int NQ>
constexpr int value_vectors() {
  return V::kAccumulators / NQ > 0 ? V::kAccumulators / NQ : 1;
}

template <class V, int NQ, int VS>
void values_f16_sweep(const KernelArgs& a, const float* p, const uint8_t* block, int vec0, Prefetch<V>& pf, float* o) {
  constexpr int W = V::W;
  const int d = a.d, T = a.T, os = a.value_space;
  typename V::F acc[VS][NQ];
  for (int u = 0; u < VS; ++u)
    for (int i = 0; i < NQ; ++i) acc[u][i] = V::load(o + i * os + (vec0 + u) * W);
  for (int t = 0; t < T; ++t)
    for (int u = 0; u < VS; ++u) {
      const uint8_t* line = block + 2 * (static_cast<size_t>(t) * d + (vec0 + u) * W);
      const auto v = V::load_f16(line);
      for (int i = 0; i < NQ; ++i) acc[u][i] = V::fma1(v, p + i * T + t, acc[u][i]);
      if ((vec0 + u) * W % 32 == 0) pf.along(line);
    }
  for (int u = 0; u < VS; ++u)
    for (int i = 0; i < NQ; ++i) V::store(o + i * os + (vec0 + u) * W, acc[u][i]);
}

template <class V, int NQ>
void values_f16(const KernelArgs& a, const float* p, const uint8_t* block, Prefetch<V>& pf, float* o) {
  constexpr int VS = value_vectors<V, NQ>();
  const int nv = a.d / V::W;
  int vec = 0;
  for (; vec + VS <= nv; vec += VS) values_f16_sweep<V, NQ, VS>(a, p, block, vec, pf, o);
  for (; vec < nv; ++vec) values_f16_sweep<V, NQ, 1>(a, p, block, vec, pf, o);
}

// pp: the weights times 2^112; o in permuted order; VS even.
template <class V, int NQ, int VS>
void values_f16_split_sweep(const KernelArgs& a, const float* pp, const uint8_t* block, int ch0, Prefetch<V>& pf,
                            float* o) {
  constexpr int W = V::W;
  const int d = a.d, T = a.T, os = a.value_space;
  typename V::F acc[VS][NQ];
  for (int u = 0; u < VS; ++u)
    for (int i = 0; i < NQ; ++i) acc[u][i] = V::load(o + i * os + ch0 + u * W);
  for (int t = 0; t < T; ++t)
    for (int b = 0; b < VS / 2; ++b) {
      typename V::F even, odd;
      const uint8_t* line = block + 2 * (static_cast<size_t>(t) * d + ch0 + 2 * W * b);
      V::f16_split(line, even, odd);
      if ((ch0 + 2 * W * b) % 32 == 0) pf.along(line);
      for (int i = 0; i < NQ; ++i) {
        acc[2 * b][i] = V::fma1(even, pp + i * T + t, acc[2 * b][i]);
        acc[2 * b + 1][i] = V::fma1(odd, pp + i * T + t, acc[2 * b + 1][i]);
      }
    }
  for (int u = 0; u < VS; ++u)
    for (int i = 0; i < NQ; ++i) V::store(o + i * os + ch0 + u * W, acc[u][i]);
}

template <class V, int NQ>
void values_f16_split(const KernelArgs& a, const float* p, const uint8_t* block, Prefetch<V>& pf, float* o) {
  constexpr int W = V::W, VS = value_vectors<V, NQ>() < 2 ? 2 : value_vectors<V, NQ>() / 2 * 2;  // even
  const int d = a.d, T = a.T;
  alignas(64) float pp[NQ * kMaxTokens];
  for (int i = 0; i < NQ; ++i)
    for (int t = 0; t < T; t += W) V::store(pp + i * T + t, V::mul(V::load(p + i * T + t), V::set1(kTwo112)));
  int ch = 0;
  for (; ch + VS * W <= d; ch += VS * W) values_f16_split_sweep<V, NQ, VS>(a, pp, block, ch, pf, o);
  for (; ch < d; ch += 2 * W) values_f16_split_sweep<V, NQ, 2>(a, pp, block, ch, pf, o);
}

// One vector of W channels over the page's tokens; even and odd tokens accumulate apart (2 NQ chains), every
// weight used once.
template <class V, int NQ, int Bits>
void values_int_vector(const KernelArgs& a, const float* ws, const uint8_t* block, int vec, float* o) {
  constexpr int W = V::W, E = 32 / Bits;
  const int T = a.T, os = a.value_space, tiles = a.d / 16, ch = vec * W;
  const uint8_t* lanes = block + 64 * (ch / 16) + 4 * (ch % 16);
  typename V::F acc[2][NQ];
  for (int i = 0; i < NQ; ++i) acc[0][i] = V::load(o + i * os + ch), acc[1][i] = V::zero();
  for (int tile = 0; tile < T / E; ++tile) {
    const auto x = V::load_i(lanes + static_cast<size_t>(tile) * tiles * 64);
    for_elements<E>([&](auto j) {
      const auto f = V::template element<Bits, j>(x);
      for (int i = 0; i < NQ; ++i) acc[j % 2][i] = V::fma1(f, ws + i * kMaxTokens + E * tile + j, acc[j % 2][i]);
    });
  }
  for (int i = 0; i < NQ; ++i) V::store(o + i * os + ch, V::add(acc[0][i], acc[1][i]));
}

template <class V, int NQ, int Bits>
void values_int(const KernelArgs& a, const float* p, const uint8_t* block, Prefetch<V>& pf, float* o) {
  constexpr int W = V::W;
  const int d = a.d, T = a.T, G = a.value_group, groups = d / G;
  const uint8_t* scales = block + a.value_scales_offset;
  alignas(64) float ws[NQ][kMaxTokens];  // p_t s_t,g of the current group
  for (int g = 0; g < groups; ++g) {
    for (int tok = 0; tok < T; tok += W) {
      const auto scale = V::load_f16(scales + 2 * ((static_cast<size_t>(tok / 16) * groups + g) * 16 + tok % 16));
      for (int i = 0; i < NQ; ++i) V::store(ws[i] + tok, V::mul(scale, V::load(p + i * T + tok)));
    }
    for (int vec = g * G / W; vec < (g + 1) * G / W; ++vec) values_int_vector<V, NQ, Bits>(a, ws[0], block, vec, o);
    pf.step(static_cast<size_t>(g), static_cast<size_t>(groups));
  }
}

// One vector of W channels over the page's tokens, as values_int_vector with kivi's unsigned codes (for_kivi_codes);
// bias (NQ floats): added to every channel.
template <class V, int NQ, int Bits>
void values_kivi_vector(const KernelArgs& a, const float* ws, const uint8_t* block, int vec, float* o,
                        const float* bias) {
  constexpr int W = V::W, C = kivi_chunk(Bits);
  const int T = a.T, os = a.value_space, ch = vec * W;
  const size_t at = 64 * static_cast<size_t>(ch / 16) + 4 * (ch % 16), stride = static_cast<size_t>(a.d / 16) * 64;
  const uint8_t* lanes = block + at;
  const uint8_t* high = block + a.value_signs_offset + at;
  typename V::F acc[2][NQ];
  for (int i = 0; i < NQ; ++i) acc[0][i] = V::load(o + i * os + ch), acc[1][i] = V::set1(bias[i]);
  for (int k = 0; k < T / C; ++k)
    for_kivi_codes<V, Bits>(lanes, high, stride, k, [&](auto f, auto j) {
      for (int i = 0; i < NQ; ++i) acc[j % 2][i] = V::fma1(f, ws + i * kMaxTokens + C * k + j, acc[j % 2][i]);
    });
  for (int i = 0; i < NQ; ++i) V::store(o + i * os + ch, V::add(acc[0][i], acc[1][i]));
}

// kivi values: o_c += sum_t (p_t s_t,g) q_t,c + sum_t p_t m_t,g (g the group of channel c).
template <class V, int NQ, int Bits>
void values_kivi(const KernelArgs& a, const float* p, const uint8_t* block, Prefetch<V>& pf, float* o) {
  constexpr int W = V::W;
  const int d = a.d, T = a.T, G = a.value_group, groups = d / G;
  const uint8_t* mins = block + a.value_mins_offset;
  const uint8_t* scales = block + a.value_scales_offset;
  alignas(64) float ws[NQ][kMaxTokens];  // p_t s_t,g of the current group
  for (int g = 0; g < groups; ++g) {
    typename V::F pm[NQ];
    for (int i = 0; i < NQ; ++i) pm[i] = V::zero();
    for (int tok = 0; tok < T; tok += W) {
      const size_t at = 2 * ((static_cast<size_t>(tok / 16) * groups + g) * 16 + tok % 16);
      const auto scale = V::load_f16(scales + at), min = V::load_f16(mins + at);
      for (int i = 0; i < NQ; ++i) {
        const auto pi = V::load(p + i * T + tok);
        V::store(ws[i] + tok, V::mul(scale, pi));
        pm[i] = V::fma(min, pi, pm[i]);
      }
    }
    float bias[NQ];
    for (int i = 0; i < NQ; ++i) bias[i] = V::hsum(pm[i]);
    for (int vec = g * G / W; vec < (g + 1) * G / W; ++vec)
      values_kivi_vector<V, NQ, Bits>(a, ws[0], block, vec, o, bias);
    pf.step(static_cast<size_t>(g), static_cast<size_t>(groups));
  }
}

// ---- int4 values by bf16 dot products (the fast kernels of AVX512-BF16, Bf16Values) -----------------------------
// One vdpbf16ps adds to each fp32 lane (a channel) the products of two tokens' codes with their two weights, where an
// FMA takes one token: half the FMA-pipe operations of values_int. Both operands are bf16:
//   the code c (-8..7) as the exact bf16 24 + c: its nibble under the top 4 mantissa bits of 16.0 (0x4180) with the
//     nibble's sign bit flipped (c + 8); one xor with 0x41C0 sets the exponent and flips that bit;
//   the weight w_t = p_t s_t,g rounded to bf16 (to nearest; 8 significant bits: relative error <= 2^-8).
// Per group the 24 is taken back out with the same rounded weights (24 sum_t w_t, summed by a dot product of the
// weights with ones), so that the one error beyond fp32 rounding is the weights': per channel at most
// 2^-8 sum_t p_t |v_t,c| (the sums of 24 + c stay below 32 sum_t w_t, so fp32 adds little).
// Tokens pair within a tile of 8 as (j, j + 4), j < 4: their nibbles lie 16 bits apart in a lane, so one shift puts
// both under their bf16 exponents; the weights are laid out in that order (V::tile_pairs).

// The codes of tokens j and j + 4 of each lane's tile as bf16 pairs, 24 + c each.
template <class V, int J>
typename V::I bf16_code_pairs(typename V::I x) {
  const auto at3 = [&] {  // nibbles j and j + 4 at bits 3..6 and 19..22
    if constexpr (J == 0) {
      return V::template shl<3>(x);
    } else {
      return V::template shr<4 * J - 3>(x);
    }
  }();
  return V::and_xor(at3, 0x00780078u, 0x41C041C0u);
}

// One vector of W channels over the page's tokens; the pairs of even and odd j accumulate apart (2 NQ chains).
// wb: per query kMaxTokens / 2 weight pairs; bias: per query -24 sum_t w_t, added to every channel.
template <class V, int NQ>
void values_int4_bf16_vector(const KernelArgs& a, const uint32_t* wb, const uint8_t* block, int vec, float* o,
                             const float* bias) {
  constexpr int W = V::W;
  static_assert(W == 16, "a vector is one tile's 16 channels");
  const int T = a.T, os = a.value_space, tiles = a.d / 16, ch = vec * W;
  const uint8_t* lanes = block + 64 * vec;
  typename V::F acc[2][NQ];
  for (int i = 0; i < NQ; ++i) acc[0][i] = V::load(o + i * os + ch), acc[1][i] = V::set1(bias[i]);
  for (int tile = 0; tile < T / 8; ++tile) {
    const auto x = V::load_i(lanes + static_cast<size_t>(tile) * tiles * 64);
    for_elements<4>([&](auto j) {
      const auto codes = bf16_code_pairs<V, j>(x);
      for (int i = 0; i < NQ; ++i)
        acc[j % 2][i] = V::dpbf16_1(acc[j % 2][i], codes, wb + i * (kMaxTokens / 2) + 4 * tile + j);
    });
  }
  for (int i = 0; i < NQ; ++i) V::store(o + i * os + ch, V::add(acc[0][i], acc[1][i]));
}

template <class V, int NQ>
void values_int4_bf16(const KernelArgs& a, const float* p, const uint8_t* block, Prefetch<V>& pf, float* o) {
  constexpr int W = V::W;
  const int d = a.d, T = a.T, G = a.value_group, groups = d / G;
  const uint8_t* scales = block + a.value_scales_offset;
  alignas(64) float pp[NQ][kMaxTokens];        // p in pair order
  alignas(64) uint32_t wb[NQ][kMaxTokens / 2];  // the current group's weights in pair order, two bf16 a pair
  for (int i = 0; i < NQ; ++i)
    for (int t = 0; t < T; t += W) V::store(pp[i] + t, V::template tile_pairs<8>(V::load(p + i * T + t)));
  const auto ones = V::bf16_ones();
  for (int g = 0; g < groups; ++g) {
    // 32 tokens at a time: W scales and weights in pair order, then 2 W bf16 weights (zero past T).
    const auto pair_scales = [&](int tok) {
      return V::template tile_pairs<8>(V::load_f16(scales + 2 * ((static_cast<size_t>(tok / 16) * groups + g) * 16)));
    };
    typename V::F sum[NQ];
    for (int i = 0; i < NQ; ++i) sum[i] = V::zero();
    for (int t = 0; t < T; t += 2 * W) {
      const bool both = t + W < T;
      const auto s0 = pair_scales(t), s1 = both ? pair_scales(t + W) : V::zero();
      for (int i = 0; i < NQ; ++i) {
        const auto w1 = both ? V::mul(s1, V::load(pp[i] + t + W)) : V::zero();
        const auto w = V::to_bf16(V::mul(s0, V::load(pp[i] + t)), w1);
        V::store_i(wb[i] + t / 2, w);
        sum[i] = V::dpbf16(sum[i], w, ones);
      }
    }
    float bias[NQ];
    for (int i = 0; i < NQ; ++i) bias[i] = -24.0f * V::hsum(sum[i]);
    for (int vec = g * G / W; vec < (g + 1) * G / W; ++vec)
      values_int4_bf16_vector<V, NQ>(a, wb[0], block, vec, o, bias);
    pf.step(static_cast<size_t>(g), static_cast<size_t>(groups));
  }
}

// kivi values by bf16 dot products (the fast kernels of AVX512-BF16), as int4 values above: the code c (0..2^b - 1)
// as the exact bf16 2^b + c (its b bits under the top b mantissa bits of 2^b: a shift, an and and an xor per 16
// channels and 2 tokens), the weight w_t = p_t s_t,g rounded to bf16; per group and query the bias
// sum_t p_t m_t,g - 2^b sum_t w_t (the mins' part in fp32, as values_kivi; the 2^b with the rounded weights), added
// to every channel. Tokens pair within a tile of E = 32 / b as (j, j + E / 2), j < E / 2, 16 bits apart in a lane.
// The one error beyond fp32 rounding is the weights': per channel at most 2^-8 sum_t p_t s_t,g q_t,c.
template <class V, int Bits, int J>
typename V::I bf16_kivi_code_pairs(typename V::I x) {
  constexpr int shift = (7 - Bits) - Bits * J;  // code j from bit b j to bit 7 - b (the top b mantissa bits)
  const auto at = [&] {
    if constexpr (shift >= 0) {
      return V::template shl<shift>(x);
    } else {
      return V::template shr<-shift>(x);
    }
  }();
  constexpr uint32_t field = ((1u << Bits) - 1) << (7 - Bits), exponent = (127u + Bits) << 7;  // bf16 2^b: 0x4080
  return V::and_xor(at, field * 0x10001u, exponent * 0x10001u);
}

// kivi:3: the code pairs of tokens j and j + 8 of each low tile (their 2-bit codes 16 bits apart, as kivi:2's), h
// the tile's high bits, token j at bit j and token j + 8 at bit 16 + j (kivi3_high_pairs): the low bits under bits
// 5..4, the high bit under bit 6, then as bf16_kivi_code_pairs (the exact bf16 8 + c).
template <class V, int J>
typename V::I bf16_kivi3_code_pairs(typename V::I lo, typename V::I h) {
  const auto code = V::select_bits(shift_up<V, 6 - J>(h), shift_up<V, 4 - 2 * J>(lo), 0x00400040u);
  return V::and_xor(code, 0x00700070u, 0x41004100u);
}

// The high bits of tokens 16 t .. 16 t + 15 of a 32-token high tile (bits 16 t .. 16 t + 15 of each lane) for
// bf16_kivi3_code_pairs: the bytes 2 t and 2 t + 1 of each lane to bytes 0 and 2, zero between (one byte shuffle).
template <class V>
typename V::I kivi3_high_pairs(typename V::I hi, int t) {
  constexpr uint8_t Z = 0x80;  // a zero byte
  alignas(16) static constexpr uint8_t kSpread[2][16] = {{0, Z, 1, Z, 4, Z, 5, Z, 8, Z, 9, Z, 12, Z, 13, Z},
                                                         {2, Z, 3, Z, 6, Z, 7, Z, 10, Z, 11, Z, 14, Z, 15, Z}};
  return V::shuffle_bytes(hi, V::load_bytes16(kSpread[t]));
}

// Calls f(codes, j) for the token pairs j of chunk k of a kivi value lane (kivi_chunk(b) tokens, C / 2 pairs; j an
// integral_constant), each as two bf16 2^b + c: kivi:2 and kivi:4 the pairs (j, j + E / 2) of a tile; kivi:3 those
// of low tiles 2k (pairs 0..7) and 2k + 1 (8..15), pairs (j, j + 8) in each.
template <class V, int Bits, class Fn>
void for_kivi_bf16_pairs(const uint8_t* lanes, const uint8_t* high, size_t stride, int k, Fn&& f) {
  if constexpr (Bits == 3) {
    const auto hi = V::load_i(high + k * stride);
    for_elements<2>([&](auto t) {
      const auto lo = V::load_i(lanes + (2 * k + t) * stride), h = kivi3_high_pairs<V>(hi, t);
      for_elements<8>([&](auto j) { f(bf16_kivi3_code_pairs<V, j>(lo, h), std::integral_constant<int, 8 * t + j>{}); });
    });
  } else {
    const auto x = V::load_i(lanes + k * stride);
    for_elements<16 / Bits>([&](auto j) { f(bf16_kivi_code_pairs<V, Bits, j>(x), j); });
  }
}

// One vector of W channels over the page's tokens; wb: per query kMaxTokens / 2 weight pairs; bias: per query.
template <class V, int NQ, int Bits>
void values_kivi_bf16_vector(const KernelArgs& a, const uint32_t* wb, const uint8_t* block, int vec, float* o,
                             const float* bias) {
  constexpr int W = V::W, C = kivi_chunk(Bits);
  static_assert(W == 16, "a vector is one tile's 16 channels");
  const int T = a.T, os = a.value_space, ch = vec * W;
  const size_t stride = static_cast<size_t>(a.d / 16) * 64;
  const uint8_t* lanes = block + 64 * vec;
  const uint8_t* high = block + a.value_signs_offset + 64 * vec;
  typename V::F acc[2][NQ];
  for (int i = 0; i < NQ; ++i) acc[0][i] = V::load(o + i * os + ch), acc[1][i] = V::set1(bias[i]);
  for (int k = 0; k < T / C; ++k)
    for_kivi_bf16_pairs<V, Bits>(lanes, high, stride, k, [&](auto codes, auto j) {
      for (int i = 0; i < NQ; ++i)
        acc[j % 2][i] = V::dpbf16_1(acc[j % 2][i], codes, wb + i * (kMaxTokens / 2) + C / 2 * k + j);
    });
  for (int i = 0; i < NQ; ++i) V::store(o + i * os + ch, V::add(acc[0][i], acc[1][i]));
}

template <class V, int NQ, int Bits>
void values_kivi_bf16(const KernelArgs& a, const float* p, const uint8_t* block, Prefetch<V>& pf, float* o) {
  constexpr int W = V::W, E = Bits == 3 ? 16 : 32 / Bits;  // tokens a (low) tile: pairs (j, j + E / 2)
  const int d = a.d, T = a.T, G = a.value_group, groups = d / G;
  const uint8_t* mins = block + a.value_mins_offset;
  const uint8_t* scales = block + a.value_scales_offset;
  alignas(64) float pp[NQ][kMaxTokens];        // p in pair order
  alignas(64) uint32_t wb[NQ][kMaxTokens / 2];  // the current group's weights in pair order, two bf16 a pair
  for (int i = 0; i < NQ; ++i)
    for (int t = 0; t < T; t += W) V::store(pp[i] + t, V::template tile_pairs<E>(V::load(p + i * T + t)));
  const auto ones = V::bf16_ones();
  for (int g = 0; g < groups; ++g) {
    const auto at = [&](int tok) { return 2 * ((static_cast<size_t>(tok / 16) * groups + g) * 16); };
    typename V::F sum[NQ], pm[NQ];
    for (int i = 0; i < NQ; ++i) sum[i] = V::zero(), pm[i] = V::zero();
    for (int t = 0; t < T; t += 2 * W) {
      const bool both = t + W < T;
      const auto s0 = V::template tile_pairs<E>(V::load_f16(scales + at(t)));
      const auto s1 = both ? V::template tile_pairs<E>(V::load_f16(scales + at(t + W))) : V::zero();
      const auto m0 = V::load_f16(mins + at(t)), m1 = both ? V::load_f16(mins + at(t + W)) : V::zero();
      for (int i = 0; i < NQ; ++i) {
        const auto w1 = both ? V::mul(s1, V::load(pp[i] + t + W)) : V::zero();
        const auto w = V::to_bf16(V::mul(s0, V::load(pp[i] + t)), w1);
        V::store_i(wb[i] + t / 2, w);
        sum[i] = V::dpbf16(sum[i], w, ones);
        pm[i] = V::fma(m0, V::load(p + i * T + t), pm[i]);
        if (both) pm[i] = V::fma(m1, V::load(p + i * T + t + W), pm[i]);
      }
    }
    float bias[NQ];
    for (int i = 0; i < NQ; ++i) bias[i] = V::hsum(V::fma(V::set1(-static_cast<float>(1 << Bits)), sum[i], pm[i]));
    for (int vec = g * G / W; vec < (g + 1) * G / W; ++vec)
      values_kivi_bf16_vector<V, NQ, Bits>(a, wb[0], block, vec, o, bias);
    pf.step(static_cast<size_t>(g), static_cast<size_t>(groups));
  }
}

// The value side of a turbo_mse block, one vector of W channels at a time over the page's chunks of 32 tokens: each
// chunk's nibble lanes (nibble_lanes) to add(n, c, acc), two accumulator chains per query (the first seeded with o),
// summed into o.
template <class V, int NQ, int Bits, class Add>
void for_turbo_value_chunks(const KernelArgs& a, const uint8_t* block, Prefetch<V>& pf, float* o, const Add& add) {
  constexpr int W = V::W;
  const int d = a.d, T = a.T, os = a.value_space, nv = d / W;
  const size_t chunk_stride = static_cast<size_t>(d / 16) * Bits * 64;  // 32 tokens further
  for (int vec = 0; vec < nv; ++vec) {
    const int ch = vec * W;
    const uint8_t* lanes = block + 64 * Bits * (ch / 16) + 4 * (ch % 16);
    typename V::F acc[2][NQ];
    for (int i = 0; i < NQ; ++i) acc[0][i] = V::load(o + i * os + ch), acc[1][i] = V::zero();
    for (int c = 0; c < T / 32; ++c) {
      typename V::I n[4];
      nibble_lanes<V, Bits>(lanes + c * chunk_stride, n);
      add(n, c, acc);
    }
    for (int i = 0; i < NQ; ++i) V::store(o + i * os + ch, V::add(acc[0][i], acc[1][i]));
    pf.step(static_cast<size_t>(vec), static_cast<size_t>(nv));
  }
}

// turbo_mse values: o_c += sum_t (p_t ||v_t||) c[idx_t,c].
template <class V, int NQ, int Bits>
void values_turbo(const KernelArgs& a, const float* p, const uint8_t* block, Prefetch<V>& pf, float* o) {
  constexpr int W = V::W;
  const int T = a.T;
  const auto table = V::load_table(a.value_levels);
  const uint8_t* norms = block + a.value_scales_offset;
  alignas(64) float ws[NQ][kMaxTokens];  // p_t ||v_t||
  for (int tok = 0; tok < T; tok += W) {
    const auto norm = V::load_f16(norms + 2 * tok);
    for (int i = 0; i < NQ; ++i) V::store(ws[i] + tok, V::mul(norm, V::load(p + i * T + tok)));
  }
  for_turbo_value_chunks<V, NQ, Bits>(a, block, pf, o, [&](const typename V::I (&n)[4], int c, auto& acc) {
    for_elements<4>([&](auto v) {
      for_elements<8>([&](auto j) {
        const auto f = V::lookup(table, V::template shr<4 * j>(n[v]));
        const float* w = ws[0] + 32 * c + 8 * v + j;
        for (int i = 0; i < NQ; ++i) acc[j % 2][i] = V::fma1(f, w + i * kMaxTokens, acc[j % 2][i]);
      });
    });
  });
}

// turbo_mse values by bf16 dot products (the fast kernels of AVX512-BF16), as int4 values above: one vdpbf16ps adds
// two tokens' levels times their weights. Both operands are rounded to bf16 (to nearest; 8 significant bits):
//   the level c[idx] by a lookup of the index in a table of the 16 levels as bf16 (vpermw on 16-bit lanes);
//   the weight w_t = p_t ||v_t||.
// The one error beyond fp32 rounding is those roundings': per channel at most about 2^-8 sum_t w_t |c[idx_t,c]|.
// Tokens pair within each 8 of a nibble lane as (j, j + 4): their nibbles lie 16 bits apart, so one shift and one and
// put both under 16-bit lanes; the weights are laid out in that order (V::tile_pairs<8>).
template <class V, int NQ, int Bits>
void values_turbo_bf16(const KernelArgs& a, const float* p, const uint8_t* block, Prefetch<V>& pf, float* o) {
  constexpr int W = V::W;
  static_assert(W == 16, "a vector is one tile's 16 channels");
  const int T = a.T;
  const auto table = V::bf16_table(a.value_levels);
  const uint8_t* norms = block + a.value_scales_offset;
  alignas(64) uint32_t wb[NQ][kMaxTokens / 2];  // p_t ||v_t|| in pair order, two bf16 a pair
  for (int t = 0; t < T; t += 2 * W) {
    const bool both = t + W < T;
    const auto n0 = V::load_f16(norms + 2 * t), n1 = both ? V::load_f16(norms + 2 * (t + W)) : V::zero();
    for (int i = 0; i < NQ; ++i) {
      const auto w1 = both ? V::template tile_pairs<8>(V::mul(n1, V::load(p + i * T + t + W))) : V::zero();
      V::store_i(wb[i] + t / 2, V::to_bf16(V::template tile_pairs<8>(V::mul(n0, V::load(p + i * T + t))), w1));
    }
  }
  for_turbo_value_chunks<V, NQ, Bits>(a, block, pf, o, [&](const typename V::I (&n)[4], int c, auto& acc) {
    for_elements<4>([&](auto v) {
      for_elements<4>([&](auto j) {  // tokens 8 v + j and 8 v + j + 4
        const auto levels = V::lookup16(table, V::and_i(V::template shr<4 * j>(n[v]), 0x000F000Fu));
        const uint32_t* w = wb[0] + 16 * c + 4 * v + j;
        for (int i = 0; i < NQ; ++i) acc[j % 2][i] = V::dpbf16_1(acc[j % 2][i], levels, w + i * (kMaxTokens / 2));
      });
    });
  });
}

// turbo_prod values: per query row [o_mse (d) | o_sketch (m = d)], o_mse,c += sum_t (p_t ||v_t||) c[idx_t,c] as
// turbo_mse values, and o_sketch,r += sum_t w_t sign_t,r = 2 sum_{t: bit set} w_t - sum_t w_t with w_t = p_t
// sqrt(pi/2)/m ||r_t||. Channel vector k and sign rows k (16 per tile) side by side, so that the masked adds issue
// beside the FMAs. Bits: of the turbo_mse part.
template <class V, int NQ, int Bits>
void values_turbo_prod(const KernelArgs& a, const float* p, const uint8_t* block, Prefetch<V>& pf, float* o) {
  constexpr int W = V::W, SC = NQ <= 4 ? 2 : 1;  // sign accumulator chains per query (registers)
  const int d = a.d, T = a.T, os = a.value_space, nv = d / W;
  const auto table = V::load_table(a.value_levels);
  const uint8_t* norms = block + a.value_scales_offset;
  const uint8_t* residual_norms = block + a.value_residual_norms_offset;
  alignas(64) float ws[NQ][kMaxTokens], wr[NQ][kMaxTokens];  // p_t ||v_t||, w_t
  typename V::F wr_sum[NQ];
  for (int i = 0; i < NQ; ++i) wr_sum[i] = V::zero();
  const auto sketch_scale = V::set1(a.value_sketch_scale);
  for (int tok = 0; tok < T; tok += W) {
    const auto norm = V::load_f16(norms + 2 * tok);
    const auto magnitude = V::mul(V::load_f16(residual_norms + 2 * tok), sketch_scale);
    for (int i = 0; i < NQ; ++i) {
      const auto pi = V::load(p + i * T + tok), w = V::mul(magnitude, pi);
      V::store(ws[i] + tok, V::mul(norm, pi));
      V::store(wr[i] + tok, w);
      wr_sum[i] = V::add(wr_sum[i], w);
    }
  }
  float all[NQ];
  for (int i = 0; i < NQ; ++i) all[i] = V::hsum(wr_sum[i]);
  const size_t chunk_stride = static_cast<size_t>(d / 16) * Bits * 64;  // codes: 32 tokens further
  const size_t sign_stride = static_cast<size_t>(d / 16) * 64;          // signs: 32 tokens further (m = d)
  const uint8_t* signs = block + a.value_signs_offset;
  for (int vec = 0; vec < nv; ++vec) {
    const int ch = vec * W;
    const uint8_t* lanes = block + 64 * Bits * (ch / 16) + 4 * (ch % 16);
    const uint8_t* sign_lanes = signs + 64 * (ch / 16) + 4 * (ch % 16);
    typename V::F acc[2][NQ], set[SC][NQ];
    for (int i = 0; i < NQ; ++i) acc[0][i] = V::load(o + i * os + ch), acc[1][i] = V::zero();
    for (int h = 0; h < SC; ++h)
      for (int i = 0; i < NQ; ++i) set[h][i] = V::zero();
    for (int c = 0; c < T / 32; ++c) {
      typename V::I n[4];
      nibble_lanes<V, Bits>(lanes + c * chunk_stride, n);
      const auto x = V::load_i(sign_lanes + c * sign_stride);
      for_elements<4>([&](auto v) {
        for_elements<8>([&](auto j) {
          const auto f = V::lookup(table, V::template shr<4 * j>(n[v]));
          const auto bit = V::template test_bit<8 * v + j>(x);
          const int t = 32 * c + 8 * v + j;
          for (int i = 0; i < NQ; ++i) {
            acc[j % 2][i] = V::fma1(f, ws[i] + t, acc[j % 2][i]);
            set[j % SC][i] = V::add_masked(set[j % SC][i], bit, wr[i] + t);
          }
        });
      });
    }
    for (int i = 0; i < NQ; ++i) {
      float* oi = o + i * os;
      V::store(oi + ch, V::add(acc[0][i], acc[1][i]));
      const auto sum = SC == 2 ? V::add(set[0][i], set[SC - 1][i]) : set[0][i];
      V::store(oi + d + ch, V::add(V::load(oi + d + ch), V::sub(V::mul(V::set1(2.0f), sum), V::set1(all[i]))));
    }
    pf.step(static_cast<size_t>(vec), static_cast<size_t>(nv));
  }
}

// ---- the page loop ---------------------------------------------------------------------------------------------

// The online softmax of one query over a page's scores s (T floats, overwritten with the weights exp(s - m)).
// seen: tokens the query sees (none: the weights are zero and the state stays as it was).
template <class V>
void softmax_row(const KernelArgs& a, int seen, float* s, float& m, float& l, float* o) {
  constexpr int W = V::W;
  const int T = a.T;
  auto block_max = V::set1(kMinusInf);
  for (int t = 0; t < T; t += W) {
    auto x = V::load(s + t);
    if (seen < t + W) {
      x = V::mask_tail(x, seen - t);
      V::store(s + t, x);
    }
    block_max = V::max(block_max, x);
  }
  const float bm = V::hmax(block_max);
  if (bm == kMinusInf) {
    for (int t = 0; t < T; t += W) V::store(s + t, V::zero());
    return;
  }
  const float mx = m > bm ? m : bm;
  if (mx > m && m != kMinusInf) {
    const auto alpha = V::exp(V::set1(m - mx));
    for (int c = 0; c < a.value_space; c += W) V::store(o + c, V::mul(alpha, V::load(o + c)));
    l *= V::first(alpha);
  }
  m = mx;
  auto sum = V::zero();
  const auto vmx = V::set1(mx);
  for (int t = 0; t < T; t += W) {
    const auto e = V::exp(V::sub(V::load(s + t), vmx));
    V::store(s + t, e);
    sum = V::add(sum, e);
  }
  l += V::hsum(sum);
}

// What a run prepares once: VNNI query digits (int keys, turbo_mse keys in the fast kernels), or the split f16
// path's queries (f16 keys) and whether the value accumulators are in split order (f16 values).
struct RunPrep {
  VnniQueries vq{};
  const float* split_queries = nullptr;
  bool split_values = false;
};

// The scores of a pass over a page's K block. Out of line, as is the value phase: each is compiled once per format
// and pass size, not once per pair of formats.
template <class V, BlockFormat K, int NQ, int KeyDigits>
[[gnu::noinline]] void key_phase(const KernelArgs& a, const RunPrep& prep, int i0, const uint8_t* page,
                                 const uint8_t* next_page, float* s) {
  const int d = a.d;
  const uint8_t* block = page + a.key_offset;
  const float* q = a.q + static_cast<size_t>(i0) * a.key_space;
  Prefetch<V> pf(block, next_page ? next_page + a.key_offset : nullptr, key_block_bytes(a, K));
  if constexpr (kivi_int_scores<V, K, KeyDigits>()) {
    key_scores_kivi_int<V, NQ, bits_of(K)>(a, q, block, pf, s);
  } else if constexpr (is_kivi(K)) {
    key_scores_kivi<V, NQ, bits_of(K)>(a, q, block, pf, s);
  } else if constexpr (turbo_int_scores<V, K, KeyDigits>()) {
    key_scores_turbo_int<V, NQ, turbo_bits(K)>(a, prep.vq, i0, block, pf, s);
  } else if constexpr (is_turbo(K)) {
    key_scores_turbo<V, NQ, turbo_bits(K)>(a, q, block, pf, s);
  } else if constexpr (is_prod(K)) {
    key_scores_turbo_prod<V, NQ, turbo_bits(K)>(a, q, block, pf, s);
  } else if constexpr (K == BlockFormat::qjl) {
    key_scores_qjl<V, NQ>(a, q, block, pf, s);
  } else if constexpr (K == BlockFormat::f16) {
    if (prep.split_queries) {
      key_scores_f16_split<V, NQ>(a, prep.split_queries + static_cast<size_t>(i0) * d, block, pf, s);
    } else {
      key_scores_f16<V, NQ>(a, q, block, pf, s);
    }
  } else if constexpr (V::kVnni) {
    key_scores_int_vnni<V, NQ, bits_of(K), KeyDigits>(a, prep.vq, i0, block, pf, s);
  } else {
    key_scores_int<V, NQ, bits_of(K)>(a, q, block, pf, s);
  }
}

// The weights s of a pass summed over a page's VF block into o (NQ rows of value_space floats). Bf16Values: int4,
// kivi and turbo_mse values by bf16 dot products (the fast kernels of AVX512-BF16).
template <class V, BlockFormat VF, int NQ, bool Bf16Values>
[[gnu::noinline]] void value_phase(const KernelArgs& a, const RunPrep& prep, const float* s, const uint8_t* page,
                                   const uint8_t* next_page, float* o) {
  const uint8_t* block = page + a.value_offset;
  Prefetch<V> pf(block, next_page ? next_page + a.value_offset : nullptr, value_block_bytes(a, VF));
  if constexpr (VF == BlockFormat::f16) {
    if (prep.split_values) {
      values_f16_split<V, NQ>(a, s, block, pf, o);
    } else {
      values_f16<V, NQ>(a, s, block, pf, o);
    }
  } else if constexpr (Bf16Values && is_kivi(VF)) {
    values_kivi_bf16<V, NQ, bits_of(VF)>(a, s, block, pf, o);
  } else if constexpr (is_kivi(VF)) {
    values_kivi<V, NQ, bits_of(VF)>(a, s, block, pf, o);
  } else if constexpr (Bf16Values && is_turbo(VF)) {
    values_turbo_bf16<V, NQ, turbo_bits(VF)>(a, s, block, pf, o);
  } else if constexpr (is_turbo(VF)) {
    values_turbo<V, NQ, turbo_bits(VF)>(a, s, block, pf, o);
  } else if constexpr (is_prod(VF)) {
    values_turbo_prod<V, NQ, turbo_bits(VF)>(a, s, block, pf, o);
  } else if constexpr (Bf16Values) {
    static_assert(VF == BlockFormat::int4, "bf16 dot products take int4, kivi and turbo_mse values");
    values_int4_bf16<V, NQ>(a, s, block, pf, o);
  } else {
    values_int<V, NQ, bits_of(VF)>(a, s, block, pf, o);
  }
}

template <class V, BlockFormat K, BlockFormat VF, int NQ, int KeyDigits, bool Bf16Values>
void page_pass(const KernelArgs& a, const RunPrep& prep, int i0, size_t base, const uint8_t* page,
               const uint8_t* next_page) {
  const int T = a.T;
  int seen[NQ];
  bool any = false;
  for (int i = 0; i < NQ; ++i) {
    const size_t vis = a.visible[i0 + i];
    seen[i] = vis > base ? static_cast<int>(vis - base < static_cast<size_t>(T) ? vis - base : T) : 0;
    any = any || seen[i] > 0;
  }
  if (!any) return;
  alignas(64) float s[NQ * kMaxTokens];
  float* o = a.o + static_cast<size_t>(i0) * a.value_space;
  key_phase<V, K, NQ, KeyDigits>(a, prep, i0, page, next_page, s);
  for (int i = 0; i < NQ; ++i)
    softmax_row<V>(a, seen[i], s + i * T, a.m[i0 + i], a.l[i0 + i], o + static_cast<size_t>(i) * a.value_space);
  value_phase<V, VF, NQ, Bf16Values>(a, prep, s, page, next_page, o);
}

// KeyDigits: the 8-bit digits of each query for int keys by integer dot products (V::kVnni): 3 in the exact
// kernels, fewer in the fast ones (above). Bf16Values: int4 values by bf16 dot products (fast kernels only).
template <class V, BlockFormat K, BlockFormat VF, int KeyDigits = 3, bool Bf16Values = false>
void attend(const KernelArgs& a) {
  const size_t T = static_cast<size_t>(a.T);
  const bool splits = a.d % (2 * V::W) == 0;
  RunPrep prep;
  if constexpr (V::kVnni && is_int(K))
    prep.vq = prepare_vnni_queries<bits_of(K), KeyDigits>(a, a.key_group, 1 << (bits_of(K) - 1));
  if constexpr (turbo_int_scores<V, K, KeyDigits>())
    prep.vq = prepare_vnni_queries<4, KeyDigits, V::kLevelDigitBits>(a, a.d, 128, a.key_level_unit);
  if constexpr (K == BlockFormat::f16) {
    const size_t n = static_cast<size_t>(a.n_q) * a.d;
    float qmax = 0;
    for (size_t c = 0; c < n; ++c) qmax = a.q[c] > qmax ? a.q[c] : -a.q[c] > qmax ? -a.q[c] : qmax;
    if (splits && qmax < kSplitQueryMax) {
      auto* qs = reinterpret_cast<float*>(a.scratch);
      for (size_t c = 0; c < n; ++c) qs[c] = a.q[c] * kTwo112;
      permute_blocks<V::W>(qs, a.n_q, a.d, true);
      prep.split_queries = qs;
    }
  }
  if constexpr (VF == BlockFormat::f16) {
    prep.split_values = splits;
    if (splits) permute_blocks<V::W>(a.o, a.n_q, a.d, true);
  }
  for (size_t j = 0; j < a.n_pages; ++j) {
    const uint8_t* page = a.pool + a.page_bytes * a.pages[j];
    const uint8_t* next = j + 1 < a.n_pages ? a.pool + a.page_bytes * a.pages[j + 1] : nullptr;
    const size_t base = a.first_token + j * T;
    // Passes of kMaxQ, 4, 3, 2, 1 queries; the first prefetches the next page, the others find this one cached.
    // A pass of 3 serves a GQA group of 3 (SmolLM2) in one sweep: each code is decoded once, not in passes of 2 and 1.
    int i0 = 0;
    for (; i0 + V::kMaxQ <= a.n_q; i0 += V::kMaxQ, next = nullptr)
      page_pass<V, K, VF, V::kMaxQ, KeyDigits, Bf16Values>(a, prep, i0, base, page, next);
    if (V::kMaxQ > 4 && i0 + 4 <= a.n_q)
      page_pass<V, K, VF, 4, KeyDigits, Bf16Values>(a, prep, i0, base, page, next), i0 += 4, next = nullptr;
    if (i0 + 3 <= a.n_q)
      page_pass<V, K, VF, 3, KeyDigits, Bf16Values>(a, prep, i0, base, page, next), i0 += 3, next = nullptr;
    if (i0 + 2 <= a.n_q)
      page_pass<V, K, VF, 2, KeyDigits, Bf16Values>(a, prep, i0, base, page, next), i0 += 2, next = nullptr;
    if (i0 < a.n_q) page_pass<V, K, VF, 1, KeyDigits, Bf16Values>(a, prep, i0, base, page, next);
  }
  if (prep.split_values) permute_blocks<V::W>(a.o, a.n_q, a.d, false);
}

template <class V, BlockFormat K, int KeyDigits = 3>
KernelFn fused_kernel_with_keys(BlockFormat value) {
  using F = BlockFormat;
  switch (value) {
    case F::f16:
      return attend<V, K, F::f16, KeyDigits>;
    case F::int8:
      return attend<V, K, F::int8, KeyDigits>;
    case F::int4:
      return attend<V, K, F::int4, KeyDigits>;
    case F::kivi2:
      return attend<V, K, F::kivi2, KeyDigits>;
    case F::kivi3:
      return attend<V, K, F::kivi3, KeyDigits>;
    case F::kivi4:
      return attend<V, K, F::kivi4, KeyDigits>;
    case F::turbo1:
      return attend<V, K, F::turbo1, KeyDigits>;
    case F::turbo2:
      return attend<V, K, F::turbo2, KeyDigits>;
    case F::turbo3:
      return attend<V, K, F::turbo3, KeyDigits>;
    case F::turbo4:
      return attend<V, K, F::turbo4, KeyDigits>;
    case F::prod2:
      return attend<V, K, F::prod2, KeyDigits>;
    case F::prod3:
      return attend<V, K, F::prod3, KeyDigits>;
    case F::prod4:
      return attend<V, K, F::prod4, KeyDigits>;
    case F::qjl:  // keys only
    case F::other:
      break;
  }
  return nullptr;
}

// The kernel for every pair of f16, int8, int4, kivi:2..4, turbo_mse:1..4 and turbo_prod:2..4 blocks; qjl keys
// with any of these values.
template <class V>
KernelFn fused_kernel_for(BlockFormat key, BlockFormat value) {
  using F = BlockFormat;
  switch (key) {
    case F::f16:
      return fused_kernel_with_keys<V, F::f16>(value);
    case F::int8:
      return fused_kernel_with_keys<V, F::int8>(value);
    case F::int4:
      return fused_kernel_with_keys<V, F::int4>(value);
    case F::kivi2:
      return fused_kernel_with_keys<V, F::kivi2>(value);
    case F::kivi3:
      return fused_kernel_with_keys<V, F::kivi3>(value);
    case F::kivi4:
      return fused_kernel_with_keys<V, F::kivi4>(value);
    case F::turbo1:
      return fused_kernel_with_keys<V, F::turbo1>(value);
    case F::turbo2:
      return fused_kernel_with_keys<V, F::turbo2>(value);
    case F::turbo3:
      return fused_kernel_with_keys<V, F::turbo3>(value);
    case F::turbo4:
      return fused_kernel_with_keys<V, F::turbo4>(value);
    case F::prod2:
      return fused_kernel_with_keys<V, F::prod2>(value);
    case F::prod3:
      return fused_kernel_with_keys<V, F::prod3>(value);
    case F::prod4:
      return fused_kernel_with_keys<V, F::prod4>(value);
    case F::qjl:
      return fused_kernel_with_keys<V, F::qjl>(value);
    case F::other:
      break;
  }
  return nullptr;
}

}  // namespace
}  // namespace kvq::detail

// The decode kernel's fragment maps (src/cuda/codec_traits.cuh), run on the host without a GPU: for real blocks
// encoded by the CPU codecs, each lane's 16-byte pieces and the chunk's parameter ranges are gathered as the kernel
// streams them, the lanes' A and B fragments go through an emulated mma.m16n8k16 (the PTX fragment layout, in
// double), and the scores and value sums of every chunk must equal those of the codec's own decode: a wrong piece
// offset, k-to-channel map, token pairing or scale group shows up as a wrong score or output channel.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "codec/block_layout.hpp"
#include "codec/int_group.hpp"
#include "codec/kivi.hpp"
#include "codec/turbo_mse.hpp"
#include "codec/turbo_parts.hpp"
#include "core/half.hpp"
#include "cuda/codec_traits.cuh"
#include "cuda/decode_kernel.cuh"
#include "cuda/decode_pairs.hpp"
#include "kvq/codec.hpp"
#include "kvq/detail/synthetic.hpp"
#include "kvq/error.hpp"
#include "test_seed.hpp"

namespace kvq {
namespace {

using namespace cuda::detail;

// The 16 x 16 (A) or 16 x 8 (B) operand of one mma from the lanes' fragments.
template <bool kBf16>
double operand(uint32_t w, int half) {
  const uint16_t h = static_cast<uint16_t>(half ? w >> 16 : w & 0xffff);
  return kBf16 ? bf16_to_f32(h) : f16_to_f32(h);
}

// C[lane] += A B for one mma, the fragments given per lane.
template <bool kBf16>
void emulate_mma(const uint4 (&a)[32], const uint32_t (&b0)[32], const uint32_t (&b1)[32], double (&c)[32][4]) {
  double A[16][16], B[16][8];
  for (int lane = 0; lane < 32; ++lane) {
    const int n = lane >> 2, i = lane & 3;
    const uint32_t aw[4] = {a[lane].x, a[lane].y, a[lane].z, a[lane].w};
    for (int h = 0; h < 2; ++h) {
      A[n][2 * i + h] = operand<kBf16>(aw[0], h);
      A[n + 8][2 * i + h] = operand<kBf16>(aw[1], h);
      A[n][2 * i + 8 + h] = operand<kBf16>(aw[2], h);
      A[n + 8][2 * i + 8 + h] = operand<kBf16>(aw[3], h);
      B[2 * i + h][n] = operand<kBf16>(b0[lane], h);
      B[2 * i + 8 + h][n] = operand<kBf16>(b1[lane], h);
    }
  }
  for (int lane = 0; lane < 32; ++lane) {
    const int n = lane >> 2, i = lane & 3;
    for (int x = 0; x < 4; ++x) {
      const int row = n + 8 * (x >> 1), col = 2 * i + (x & 1);
      double sum = 0;
      for (int k = 0; k < 16; ++k) sum += A[row][k] * B[k][col];
      c[lane][x] += sum;
    }
  }
}

// C[lane] += A B for one integer mma.m16n8k32 (signed bytes, exact), the fragments given per lane.
void emulate_imma(const uint4 (&a)[32], const uint32_t (&b0)[32], const uint32_t (&b1)[32], int64_t (&c)[32][4]) {
  int A[16][32], B[32][8];
  const auto byte = [](uint32_t w, int j) { return static_cast<int>(static_cast<int8_t>(w >> (8 * j))); };
  for (int lane = 0; lane < 32; ++lane) {
    const int n = lane >> 2, i = lane & 3;
    for (int j = 0; j < 4; ++j) {
      A[n][4 * i + j] = byte(a[lane].x, j);
      A[n + 8][4 * i + j] = byte(a[lane].y, j);
      A[n][4 * i + 16 + j] = byte(a[lane].z, j);
      A[n + 8][4 * i + 16 + j] = byte(a[lane].w, j);
      B[4 * i + j][n] = byte(b0[lane], j);
      B[4 * i + 16 + j][n] = byte(b1[lane], j);
    }
  }
  for (int lane = 0; lane < 32; ++lane) {
    const int n = lane >> 2, i = lane & 3;
    for (int x = 0; x < 4; ++x) {
      const int row = n + 8 * (x >> 1), col = 2 * i + (x & 1);
      int64_t sum = 0;
      for (int k = 0; k < 32; ++k) sum += A[row][k] * B[k][col];
      c[lane][x] += sum;
    }
  }
}

struct Block {
  std::unique_ptr<Codec> codec;
  std::vector<uint8_t> bytes;
  std::vector<float> y;  // T x space in the kernel's space (the codec space over sigma)
  CodecArgs args;
  std::vector<uint32_t> table;  // the codec's shared-memory table (vecinfer's codebook)
};

// A block of T tokens: key-like data (outlier channels) for keys or where `key_like`, else Gaussian.
Block encode(const std::string& spec, int d, int T, bool key, uint64_t seed, bool key_like = false) {
  Block b;
  b.codec = make_codec(spec, CodecParams{d, T, seed, key ? Role::key : Role::value});
  const size_t n = static_cast<size_t>(T);
  const auto x = key || key_like ? sample_profile(key_like_profile(d, seed), n, seed + 1)
                                 : gaussian_vectors(n, d, seed + 2);
  if (b.codec->needs_training() || int_group_params(*b.codec)) {
    const auto train =
        key ? sample_profile(key_like_profile(d, seed), 1024, seed + 3) : gaussian_vectors(1024, d, seed + 4);
    b.codec->train(train.data(), 1024);
  }
  b.bytes.assign(b.codec->block_bytes() + 64, 0);
  b.codec->encode(x.data(), T, b.bytes.data());
  const size_t m = static_cast<size_t>(b.codec->space_dim());
  b.y.resize(n * m);
  b.codec->decode_space(b.bytes.data(), T, b.y.data());
  const std::vector<float> sigma = space_sigma(*b.codec);
  for (size_t t = 0; t < n; ++t)
    for (size_t c = 0; c < m; ++c) b.y[t * m + c] /= sigma[c];
  b.args = host_codec_args(*b.codec, key);
  b.table = codec_table(*b.codec, key);
  // The kernel copies table_bytes of it into shared memory, or (0) its traits read it from global memory.
  EXPECT_TRUE(b.args.table_bytes == 0 || b.args.table_bytes == b.table.size() * sizeof(uint32_t));
  b.args.table = b.table.data();
  return b;
}

// The lanes' pieces (lane l's piece k at lane_slot(k, l): [32 k + l] unless the codec shares pieces between lanes)
// and the parameter ranges of chunk cc, as the kernel copies them.
struct Stage {
  std::vector<uint4> codes;
  alignas(16) uint8_t params[16384];
  const uint8_t* prm[kTableSlot + 1] = {params, params, params, params};
};

// A chunk of f16/bf16 rows (C x D, token-major) in FloatStage's units, as the kernel's bulk copies place them.
template <int D, int C>
std::vector<uint4> float_stage(const uint8_t* chunk) {
  using F = FloatStage<D, C>;
  std::vector<uint4> codes(F::kBytes / 16, uint4{});
  for (int u = 0; u < F::kUnits; ++u)
    std::memcpy(reinterpret_cast<uint8_t*>(codes.data()) + F::unit_offset(u), chunk + u * F::kUnitBytes, F::kUnitBytes);
  return codes;
}

// Bulk-copied codecs (f16/bf16): chunk cc's rows as the kernel copies them.
template <int D, int C>
void bulk_stage(const Block& b, int cc, Stage& st) {
  st.codes = float_stage<D, C>(b.bytes.data() + static_cast<size_t>(cc) * 2 * C * D);
}

template <class K, int D, int C>
void key_stage(const Block& b, int cc, Stage& st) {
  if constexpr (K::kBulk) return bulk_stage<D, C>(b, cc, st);
  st.prm[kTableSlot] = reinterpret_cast<const uint8_t*>(b.table.data());
  constexpr int P = K::template pieces<D, C>();
  st.codes.assign(code_slots<K, D, C>(), uint4{});
  for (int lane = 0; lane < 32; ++lane)
    for (int k = 0; k < P; ++k) {
      if (!lane_copies<K, D, C>(lane)) continue;
      const int piece = K::template piece<D, C>(b.args, lane, k);
      ASSERT_LT(lane_slot<K>(k, lane), static_cast<int>(st.codes.size()));
      std::memcpy(&st.codes[lane_slot<K>(k, lane)], b.bytes.data() + cc * K::template chunk_bytes<D, C>() + piece, 16);
    }
  uint32_t at = 0;
  for (int r = 0; r < K::kRanges; ++r) {
    uint32_t off, bytes;
    K::template range<D, C>(b.args, cc, r, off, bytes);
    ASSERT_LE(at + bytes, sizeof(st.params));
    ASSERT_EQ(off % 16, 0u);
    std::memcpy(st.params + at, b.bytes.data() + off, bytes);
    st.prm[r] = st.params + at;
    at += bytes;
  }
}

template <class V, int D, int DP, int C>
void value_stage(const Block& b, int cc, int pc, Stage& st) {
  if constexpr (V::kBulk) return bulk_stage<D, C>(b, cc, st);
  st.prm[kTableSlot] = reinterpret_cast<const uint8_t*>(b.table.data());
  constexpr int P = V::template pieces<D, DP, C>();
  st.codes.assign(code_slots<V, D, DP, C>(), uint4{});
  for (int lane = 0; lane < 32; ++lane)
    for (int k = 0; k < P; ++k) {
      if (!lane_copies<V, D, DP, C>(lane)) continue;
      const int piece = V::template piece<D, DP, C>(b.args, lane, k, pc);
      ASSERT_LT(lane_slot<V>(k, lane), static_cast<int>(st.codes.size()));
      std::memcpy(&st.codes[lane_slot<V>(k, lane)], b.bytes.data() + cc * V::template chunk_bytes<D, C>() + piece, 16);
    }
  uint32_t at = 0;
  for (int r = 0; r < V::kRanges; ++r) {
    uint32_t off, bytes;
    V::template range<D, DP, C>(b.args, cc, r, off, bytes);
    ASSERT_LE(at + bytes, sizeof(st.params));
    ASSERT_EQ(off % 16, 0u);
    std::memcpy(st.params + at, b.bytes.data() + off, bytes);
    st.prm[r] = st.params + at;
    at += bytes;
  }
}

// Scores of every chunk of the block for 8 query rows, as the kernel computes them, against sum_c q_c y_tc.
template <class K, int D, int C>
void check_keys(const Block& b, int T, uint64_t seed) {
  constexpr int KD = key_space<K, D>(), NT = C / 8, KS = KD / 16;
  const std::vector<float> q = gaussian_vectors(8, KD, seed + 7);
  uint4 qtab[KS][32];
  float4 qf[KS][32];
  for (int ks = 0; ks < KS; ++ks)
    for (int lane = 0; lane < 32; ++lane) {
      const int g = lane >> 2, i = lane & 3;
      float x[4];
      for (int v = 0; v < 4; ++v) x[v] = q[static_cast<size_t>(g) * KD + K::template channel<D>(ks, frag_k(i, v))];
      qtab[ks][lane] = split_fragment<K::kBf16>(x[0], x[1], x[2], x[3]);
      qf[ks][lane] = make_float4(x[0], x[1], x[2], x[3]);
    }
  // Every channel appears once in the map.
  std::vector<int> hits(KD, 0);
  for (int ks = 0; ks < KS; ++ks)
    for (int k = 0; k < 16; ++k) ++hits[static_cast<size_t>(K::template channel<D>(ks, k))];
  for (int c = 0; c < KD; ++c) ASSERT_EQ(hits[static_cast<size_t>(c)], 1) << "channel " << c;

  int gshift = log2_of(D / 16);
  if constexpr (K::kGroups) gshift = b.args.group_shift;
  const int gmask = (1 << gshift) - 1;
  for (int cc = 0; cc < T / C; ++cc) {
    SCOPED_TRACE("chunk " + std::to_string(cc));
    Stage st;
    key_stage<K, D, C>(b, cc, st);
    uint4 atab[KS][32];
    float cst[32] = {};
    for (int lane = 0; lane < 32; ++lane) {
      if constexpr (K::kChunkA) {
        uint4 tab[KS * 32];
        cst[lane] = K::template prepare<D>(st.prm, b.args, lane, &qf[0][0], tab);
        for (int ks = 0; ks < KS; ++ks) atab[ks][lane] = tab[32 * ks + lane];
      } else {
        for (int ks = 0; ks < KS; ++ks) atab[ks][lane] = qtab[ks][lane];
      }
    }
    for (int lane = 0; lane < 32; lane += 4) {  // the kernel's quad reduction
      const float sum = cst[lane] + cst[lane + 1] + cst[lane + 2] + cst[lane + 3];
      for (int x = 0; x < 4; ++x) cst[lane + x] = sum;
    }
    double acc[NT][32][4] = {};
    float sc[32][NT][2] = {};
    for (int ks = 0; ks < KS; ++ks) {
      uint32_t bf[32][NT][2];
      for (int lane = 0; lane < 32; ++lane) key_bfrags<K, D, C>(st.codes.data(), st.prm, ks, b.args, lane, bf[lane]);
      for (int pass = 0; pass < (K::kSplitB ? 2 : 1); ++pass) {
        if constexpr (K::kSplitB) {
          if (pass == 1)
            for (int lane = 0; lane < 32; ++lane)
              key_bfrags_lo<K, D, C>(st.codes.data(), st.prm, ks, b.args, lane, bf[lane]);
        }
        for (int jj = 0; jj < NT; ++jj) {
          uint32_t b0[32], b1[32];
          for (int lane = 0; lane < 32; ++lane) {
            b0[lane] = bf[lane][jj][0];
            b1[lane] = bf[lane][jj][1];
          }
          emulate_mma<K::kBf16>(atab[ks], b0, b1, acc[jj]);
        }
      }
      if (((ks + 1) & gmask) == 0) {
        for (int lane = 0; lane < 32; ++lane) {
          float lane_acc[NT][4];
          for (int jj = 0; jj < NT; ++jj)
            for (int x = 0; x < 4; ++x) lane_acc[jj][x] = static_cast<float>(acc[jj][lane][x]);
          K::template scale_group<D, C>(st.prm, b.args, lane, ks >> gshift, lane_acc, sc[lane]);
        }
        for (auto& tile : acc)
          for (auto& l : tile) l[0] = l[1] = l[2] = l[3] = 0;
      }
    }
    double worst = 0;
    for (int lane = 0; lane < 32; ++lane) {
      const int g = lane >> 2, i = lane & 3;
      for (int jj = 0; jj < NT; ++jj)
        for (int x = 0; x < 2; ++x) {
          const int t = C * cc + C / 4 * i + jj + x * NT;
          double want = 0, size = 0;
          for (int c = 0; c < KD; ++c) {
            const double term =
                static_cast<double>(q[static_cast<size_t>(g) * KD + c]) * b.y[static_cast<size_t>(t) * KD + c];
            want += term;
            size += std::fabs(term);
          }
          const double got = static_cast<double>(sc[lane][jj][x]) + cst[lane];
          worst = std::max(worst, std::fabs(got - want) / (1e-5 * size + 1e-6));
        }
    }
    EXPECT_LE(worst, 1.0);
  }
}

// The int keys' integer path (KVQ_ATTENTION=fast): the digit table, the signed-byte B fragments through an emulated
// mma.m16n8k32, the groups joined and scaled as the kernel does, times the row's factor; against sum_c x_c y_tc
// within the query's rounding (|x_c - S (256 D0 + D1)| <= S / 2), the levels' rounding where the codes enter as
// signed-byte levels (turbo_mse: |y - y'| <= level_rel |y|) and fp32 rounding. Rows of very different sizes, and one
// too small for a normal S (its scores zero). An int32 overflow or a wrong channel, group or token shows.
template <class K, int D>
void check_int_keys(const Block& b, int T, uint64_t seed, double level_rel = 0) {
  constexpr int C = 32, NT = C / 8, KD = D, KS32 = KD / 32;
  const int gshift = b.args.group_shift, kSub = gshift == 0 ? 2 : 1;
  const int group_steps = gshift == 0 ? 1 : 1 << (gshift - 1);  // k32 steps per group
  const float scale_log2 = 0.125f * 1.4426950f;
  std::vector<float> q = gaussian_vectors(8, KD, seed + 7);
  for (int c = 0; c < KD; ++c) {
    q[static_cast<size_t>(KD) + c] *= 300.0f;  // large, and an outlier channel
    q[static_cast<size_t>(2 * KD) + c] *= 1e-3f;
    q[static_cast<size_t>(7 * KD) + c] *= 1e-40f;  // too small for a normal S: zero digits
  }
  q[static_cast<size_t>(3 * KD) + 5] = 50.0f;
  float qscale[8];
  for (int n = 0; n < 8; ++n) {
    float amax = 0;
    for (int c = 0; c < KD; ++c) amax = std::max(amax, std::fabs(q[static_cast<size_t>(n) * KD + c] * scale_log2));
    qscale[n] = kvq::detail::digit_scale<2>(amax);
  }
  EXPECT_EQ(qscale[7], 1.0f);
  std::vector<uint4> itab(static_cast<size_t>(KS32 * kSub * 32));
  for (int idx = 0; idx < static_cast<int>(itab.size()); ++idx)
    itab[static_cast<size_t>(idx)] = kSub == 2 ? int_query_fragment<K, D, 2>(q.data(), scale_log2, qscale, 8, idx)
                                               : int_query_fragment<K, D, 1>(q.data(), scale_log2, qscale, 8, idx);
  // Every channel appears once in the k32 map.
  std::vector<int> hits(KD, 0);
  for (int ks = 0; ks < KS32; ++ks)
    for (int k = 0; k < 32; ++k) ++hits[static_cast<size_t>(K::template channel32<D>(ks, k))];
  for (int c = 0; c < KD; ++c) ASSERT_EQ(hits[static_cast<size_t>(c)], 1) << "channel " << c;

  for (int cc = 0; cc < T / C; ++cc) {
    SCOPED_TRACE("chunk " + std::to_string(cc));
    Stage st;
    key_stage<K, D, C>(b, cc, st);
    float sc[32][NT][2] = {};
    int64_t acc[NT][32][4] = {};
    for (int ks = 0; ks < KS32; ++ks) {
      uint32_t bf[32][NT][2];
      for (int lane = 0; lane < 32; ++lane)
        key_int_bfrags<K, D, C>(st.codes.data(), st.prm, ks, b.args, lane, bf[lane]);
      for (int h = 0; h < kSub; ++h) {
        if (kSub == 2 || ks % group_steps == 0)
          for (auto& tile : acc)
            for (auto& l : tile) l[0] = l[1] = l[2] = l[3] = 0;
        uint4 a[32];
        for (int lane = 0; lane < 32; ++lane) a[lane] = itab[static_cast<size_t>(32 * (kSub * ks + h) + lane)];
        for (int jj = 0; jj < NT; ++jj) {
          uint32_t b0[32], b1[32];
          for (int lane = 0; lane < 32; ++lane) {
            b0[lane] = bf[lane][jj][0];
            b1[lane] = bf[lane][jj][1];
          }
          emulate_imma(a, b0, b1, acc[jj]);
        }
        const bool last = kSub == 2 || ks % group_steps == group_steps - 1;
        if (!last) continue;
        for (int lane = 0; lane < 32; ++lane) {
          int lane_acc[NT][4];
          for (int jj = 0; jj < NT; ++jj)
            for (int x = 0; x < 4; ++x) {
              ASSERT_LE(std::llabs(acc[jj][lane][x]), int64_t{1} << 23) << "a digit sum beyond the kernel's bound";
              lane_acc[jj][x] = static_cast<int>(acc[jj][lane][x]);
            }
          K::template scale_int_group<D, C>(st.prm, b.args, lane, kSub == 2 ? 2 * ks + h : ks / group_steps, lane_acc,
                                            sc[lane]);
        }
      }
    }
    double worst = 0;
    for (int lane = 0; lane < 32; ++lane) {
      const int g = lane >> 2, i = lane & 3;
      const double factor = static_cast<double>(qscale[g]) / (1 << K::kIntFactorLog2);
      for (int jj = 0; jj < NT; ++jj)
        for (int x = 0; x < 2; ++x) {
          const int t = C * cc + C / 4 * i + jj + x * NT;
          double want = 0, size = 0, rounding = 0;
          for (int c = 0; c < KD; ++c) {
            const double y = b.y[static_cast<size_t>(t) * KD + c];
            const double term = static_cast<double>(q[static_cast<size_t>(g) * KD + c] * scale_log2) * y;
            want += term;
            size += std::fabs(term);
            rounding += std::fabs(y);
          }
          const double got = static_cast<double>(sc[lane][jj][x]) * factor;
          // S / 2 per channel (plus the fp32 rounding of q / S: 2^-9 S), and fp32 rounding
          const double bound = (g == 7 ? std::fabs(want) : (0.5 + 0x1p-9) * qscale[g] * rounding) +
                               (level_rel + 1e-5) * size + 1e-30;
          worst = std::max(worst, std::fabs(got - want) / bound);
          if (g == 7) EXPECT_EQ(sc[lane][jj][x], 0.0f) << "a query too small to scale scores zero";
        }
    }
    EXPECT_LE(worst, 1.0);
  }
}

// The largest relative rounding of a turbo_mse codec's levels as signed bytes (CodecArgs::levels_i8), 0 otherwise.
double signed_byte_level_rounding(const Block& b) {
  const auto tm = turbo_mse_params(*b.codec);
  if (!tm) return 0;
  double worst = 0;
  for (int e = 0; e < 16; ++e) {
    const double level = tm->nibble_levels[e];
    const auto l = static_cast<int8_t>(b.args.levels_i8[e / 4] >> (8 * (e % 4)));
    if (level != 0) worst = std::max(worst, std::fabs(level - b.args.level_unit * l) / std::fabs(level));
    else EXPECT_EQ(l, 0);
  }
  return worst;
}

template <class K>
void check_every_dim_int_keys(const std::string& spec, uint64_t seed) {
  const auto at = [&]<int D>(uint64_t s) {
    for (int T : {64, 128}) {
      SCOPED_TRACE(spec + " integer keys d=" + std::to_string(D) + " T=" + std::to_string(T));
      const Block b = encode(spec, D, T, true, s + static_cast<uint64_t>(T));
      check_int_keys<K, D>(b, T, s + 11, signed_byte_level_rounding(b));
    }
  };
  at.template operator()<64>(seed);
  at.template operator()<128>(seed + 100);
  at.template operator()<256>(seed + 200);
}

// kivi keys' integer path (KVQ_ATTENTION=fast): per block the scales' maximum over the warp (scale_max), each lane's
// digit table (int_prepare's parts, from the rows' x' of int_query_values) and the quads' <x', m>, the same bits when
// lanes 16..31 form rows 0..3's second parts (split_block_digits); per chunk the byte B fragments through an emulated
// mma.m16n8k32, joined as the kernel does (s_max P + <x', m>, times the row's S). Against sum_c x_c y_tc within the
// digits' rounding: |x'_c s_c - s_max v_c| <= s_max (1/2 + 2^-8) per channel (v_c = x'_c (s_c / s_max) rounded to
// nearest, |x'_c| <= 32512, the fp32 quotient 2^-23 relative), times the code u_c = (y_tc - m_c) / s_c, plus fp32
// rounding of the terms. Rows of very different sizes and one too small for a normal S (its scores zero); a wrong
// channel or token shows.
template <class K, int D, int C>
void check_kivi_int_keys(const Block& b, int T, uint64_t seed) {
  constexpr int NT = C / 8, KD = D, KS32 = KD / 32;
  const float scale_log2 = 0.125f * 1.4426950f;
  std::vector<float> q = gaussian_vectors(8, KD, seed + 7);
  for (int c = 0; c < KD; ++c) {
    q[static_cast<size_t>(KD) + c] *= 300.0f;
    q[static_cast<size_t>(2 * KD) + c] *= 1e-3f;
    q[static_cast<size_t>(7 * KD) + c] *= 1e-40f;  // too small for a normal S: zero digits
  }
  q[static_cast<size_t>(3 * KD) + 5] = 50.0f;  // an outlier channel
  float qscale[8];
  for (int n = 0; n < 8; ++n) {
    float amax = 0;
    for (int c = 0; c < KD; ++c) amax = std::max(amax, std::fabs(q[static_cast<size_t>(n) * KD + c] * scale_log2));
    qscale[n] = kvq::detail::digit_scale<2>(amax);
  }
  std::vector<float4> xt(static_cast<size_t>(KS32 * 2 * 32));
  for (int idx = 0; idx < static_cast<int>(xt.size()); ++idx) {
    xt[static_cast<size_t>(idx)] = int_query_values<K, D>(q.data(), scale_log2, qscale, 8, idx);
    const float4 v = xt[static_cast<size_t>(idx)];
    for (const float e : {v.x, v.y, v.z, v.w}) ASSERT_LE(std::fabs(e), 32512.0f * (1 + 0x1p-22f));
  }
  std::vector<int> hits(KD, 0);  // every channel once in the k32 map
  for (int ks = 0; ks < KS32; ++ks)
    for (int k = 0; k < 32; ++k) ++hits[static_cast<size_t>(K::template channel32<D>(ks, k))];
  for (int c = 0; c < KD; ++c) ASSERT_EQ(hits[static_cast<size_t>(c)], 1) << "channel " << c;

  // The block's step (block_digits): every chunk stage holds the block's minima and scales.
  Stage st0;
  key_stage<K, D, C>(b, 0, st0);
  uint32_t sm = 0;
  for (int lane = 0; lane < 32; ++lane) sm = h2_abs_max(sm, K::template scale_max<D>(st0.prm, b.args, lane));
  const float smax = std::max(half_to_float(sm, false), half_to_float(sm, true));
  const uint8_t* mins = st0.prm[0];
  const uint8_t* scales = st0.prm[0] + (b.args.sec1 - b.args.sec0);
  const auto half = [](const uint8_t* p, int c) {
    uint16_t h;
    std::memcpy(&h, p + 2 * c, 2);
    return static_cast<double>(f16_to_f32(h));
  };
  double smax_want = 0;
  for (int c = 0; c < KD; ++c) smax_want = std::max(smax_want, std::fabs(half(scales, c)));
  ASSERT_EQ(static_cast<double>(smax), smax_want);
  const float sigma = smax > 0 ? 1.0f / smax : 0.0f;
  constexpr int kParts = K::template int_parts<D>();
  std::vector<uint4> atab(static_cast<size_t>(KS32 * 32));
  float bias[32];
  for (int lane = 0; lane < 32; ++lane) {
    bias[lane] = K::template int_prepare<D>(st0.prm, b.args, lane, 0, xt.data(), sigma, atab.data());
    if constexpr (kParts == 2)
      bias[lane] += K::template int_prepare<D>(st0.prm, b.args, lane, 1, xt.data(), sigma, atab.data());
  }
  if constexpr (kParts == 2) {  // split: lane l < 16 forms row-lane l's part 0, lane l + 16 its part 1
    std::vector<uint4> split(static_cast<size_t>(KS32 * 32), make_uint4(0u, 0u, 0u, 0u));
    float part[32];
    for (int lane = 0; lane < 32; ++lane)
      part[lane] = K::template int_prepare<D>(st0.prm, b.args, lane & 15, lane >> 4, xt.data(), sigma, split.data());
    for (int rl = 0; rl < 16; ++rl) {
      EXPECT_EQ(float_bits(part[rl] + part[rl + 16]), float_bits(bias[rl])) << "row-lane " << rl;
      EXPECT_EQ(float_bits(part[rl + 16] + part[rl]), float_bits(bias[rl])) << "row-lane " << rl;
      for (int ks = 0; ks < KS32; ++ks)
        EXPECT_EQ(std::memcmp(&split[static_cast<size_t>(32 * ks + rl)], &atab[static_cast<size_t>(32 * ks + rl)],
                              sizeof(uint4)),
                  0)
            << "row-lane " << rl << " k32 step " << ks;
    }
    for (int ks = 0; ks < KS32; ++ks)
      for (int rl = 16; rl < 32; ++rl) {
        const uint4 a = split[static_cast<size_t>(32 * ks + rl)];
        EXPECT_EQ(a.x | a.y | a.z | a.w, 0u) << "rows 4..7 are not written split";
      }
  }
  for (int lane = 0; lane < 32; lane += 4) {  // the kernel's quad reduction
    const float sum = (bias[lane] + bias[lane + 1]) + (bias[lane + 2] + bias[lane + 3]);
    for (int x = 0; x < 4; ++x) bias[lane + x] = sum;
  }
  // Row 7's digits (and every row's beyond G in the kernel) are zero.
  for (int ks = 0; ks < KS32; ++ks)
    for (int i = 0; i < 4; ++i) {
      const uint4 a = atab[static_cast<size_t>(32 * ks + 28 + i)];
      EXPECT_EQ(a.x | a.y | a.z | a.w, 0u);
    }

  for (int cc = 0; cc < T / C; ++cc) {
    SCOPED_TRACE("chunk " + std::to_string(cc));
    Stage st;
    key_stage<K, D, C>(b, cc, st);
    float sc[32][NT][2] = {};
    int64_t acc[NT][32][4] = {};
    for (int ks = 0; ks < KS32; ++ks) {
      uint32_t bf[32][NT][2];
      for (int lane = 0; lane < 32; ++lane)
        key_int_bfrags<K, D, C>(st.codes.data(), st.prm, ks, b.args, lane, bf[lane]);
      uint4 a[32];
      for (int lane = 0; lane < 32; ++lane) a[lane] = atab[static_cast<size_t>(32 * ks + lane)];
      for (int jj = 0; jj < NT; ++jj) {
        uint32_t b0[32], b1[32];
        for (int lane = 0; lane < 32; ++lane) {
          b0[lane] = bf[lane][jj][0];
          b1[lane] = bf[lane][jj][1];
        }
        emulate_imma(a, b0, b1, acc[jj]);
      }
    }
    for (int lane = 0; lane < 32; ++lane) {
      int lane_acc[NT][4];
      for (int jj = 0; jj < NT; ++jj)
        for (int x = 0; x < 4; ++x) {
          ASSERT_LE(std::llabs(acc[jj][lane][x]), int64_t{128 * 15 * 256}) << "a digit sum beyond the kernel's bound";
          lane_acc[jj][x] = static_cast<int>(acc[jj][lane][x]);
        }
      K::template scale_int_group<D, C>(st.prm, b.args, lane, 0, lane_acc, sc[lane]);
      for (int jj = 0; jj < NT; ++jj)
        for (int x = 0; x < 2; ++x) sc[lane][jj][x] = std::fma(sc[lane][jj][x], smax, bias[lane]);
    }
    double worst = 0;
    for (int lane = 0; lane < 32; ++lane) {
      const int g = lane >> 2, i = lane & 3;
      for (int jj = 0; jj < NT; ++jj)
        for (int x = 0; x < 2; ++x) {
          const int t = C * cc + C / 4 * i + jj + x * NT;
          double want = 0, size = 0, codes = 0;
          for (int c = 0; c < KD; ++c) {
            const double y = b.y[static_cast<size_t>(t) * KD + c], m = half(mins, c), s = half(scales, c);
            const double xc = static_cast<double>(q[static_cast<size_t>(g) * KD + c] * scale_log2);
            const double u = s > 0 ? std::nearbyint((y - m) / s) : 0;
            want += xc * y;
            size += std::fabs(xc) * (std::fabs(y) + std::fabs(m) + s * u);
            codes += u;
          }
          const double got = static_cast<double>(sc[lane][jj][x]) * qscale[g];
          const double bound = g == 7 ? std::fabs(want) + 1e-30
                                      : (0.5 + 0x1p-8) * qscale[g] * smax * codes + 1e-5 * size + 1e-30;
          worst = std::max(worst, std::fabs(got - want) / bound);
          if (g == 7) EXPECT_LE(std::fabs(got), 1e-30) << "a query too small to scale scores near zero";
        }
    }
    EXPECT_LE(worst, 1.0);
  }
}

template <class K>
void check_every_dim_kivi_int_keys(const std::string& spec, uint64_t seed) {
  const auto at = [&]<int D, int C>(uint64_t s) {
    for (int T : {64, 128}) {
      SCOPED_TRACE(spec + " integer keys d=" + std::to_string(D) + " C=" + std::to_string(C) +
                   " T=" + std::to_string(T));
      const Block b = encode(spec, D, T, true, s + static_cast<uint64_t>(T));
      check_kivi_int_keys<K, D, C>(b, T, s + 11);
    }
  };
  at.template operator()<64, 32>(seed);
  at.template operator()<128, 32>(seed + 100);
  at.template operator()<128, 64>(seed + 150);
  at.template operator()<256, 64>(seed + 200);
}

// O += P V of every chunk (and each d > 128 part) for 8 rows of random weights, against sum_t p_t y_tc.
template <class V, int D, int C>
void check_values(const Block& b, int T, uint64_t seed) {
  constexpr int VD = value_space<V, D>(), DP = value_part<V, D>(), kParts = VD / DP, VS = C / 16, NJ = DP / 8;
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::uniform_real_distribution<float> unit(0.0f, 4096.0f);  // weights times 2^12, as the kernel has them
  std::vector<int> hits(DP, 0);
  for (int j = 0; j < NJ; ++j)
    for (int col = 0; col < 8; ++col) ++hits[static_cast<size_t>(V::channel(j, col))];
  for (int c = 0; c < DP; ++c) ASSERT_EQ(hits[static_cast<size_t>(c)], 1) << "channel " << c;
  for (int cc = 0; cc < T / C; ++cc)
    for (int part = 0; part < kParts; ++part) {
      SCOPED_TRACE("chunk " + std::to_string(cc) + " part " + std::to_string(part));
      const int pc = part * DP;
      Stage st;
      value_stage<V, D, DP, C>(b, cc, pc, st);
      float p[8][C];
      for (auto& row : p)
        for (float& x : row) x = unit(rng);
      double o[NJ][32][4] = {};
      uint4 a[VS][32];
      for (int lane = 0; lane < 32; ++lane) {
        const int g = lane >> 2, i = lane & 3;
        float w[C / 4];
        value_weights<V, D, C>(st.prm, lane, pc, w);
        for (int vs = 0; vs < VS; ++vs) {
          float x[4];
          for (int v = 0; v < 4; ++v) {
            const int t = value_token<V, C>(vs, v);
            x[v] = p[g][C / 4 * i + t] * w[t];
          }
          a[vs][lane] = split_fragment<V::kBf16>(x[0], x[1], x[2], x[3]);
        }
      }
      for (int j = 0; j < NJ; ++j) {
        uint32_t bf[32][VS][2];
        for (int lane = 0; lane < 32; ++lane)
          V::template bfrags<D, DP, C>(st.codes.data(), st.prm, b.args, lane, j, pc, bf[lane]);
        for (int vs = 0; vs < VS; ++vs) {
          uint32_t b0[32], b1[32];
          for (int lane = 0; lane < 32; ++lane) {
            b0[lane] = bf[lane][vs][0];
            b1[lane] = bf[lane][vs][1];
          }
          emulate_mma<V::kBf16>(a[vs], b0, b1, o[j]);
        }
      }
      double worst = 0;
      for (int lane = 0; lane < 32; ++lane) {
        const int g = lane >> 2, i = lane & 3;
        for (int j = 0; j < NJ; ++j)
          for (int x = 0; x < 2; ++x) {
            const int c = pc + V::channel(j, 2 * i + x);
            double want = 0, size = 0;
            for (int t = 0; t < C; ++t) {
              const double term = p[g][t] * static_cast<double>(b.y[static_cast<size_t>(C * cc + t) * VD + c]);
              want += term;
              size += std::fabs(term);
            }
            worst = std::max(worst, std::fabs(o[j][lane][x] + o[j][lane][x + 2] - want) / (1e-3 * size + 1e-6));
          }
      }
      EXPECT_LE(worst, 1.0);
    }
}

// kivi values' fp16 minimum and scale of token t and group g (the codec's [T/16][groups][16] sections).
double kivi_value_param(const Block& b, uint32_t section, int t, int g) {
  const size_t at = section + 2 * ((static_cast<size_t>(t >> 4) * b.args.groups + g) * 16 + (t & 15));
  return f16_to_f32(static_cast<uint16_t>(b.bytes[at] | b.bytes[at + 1] << 8));
}

// The fast value path's rounding bound for one output element of kivi values (v = m + s u; fast_offset_tiles), from
// its arithmetic: ph = fp16(p), |ph - p| <= 2^-11 p + 2^-25 (below fp16's normals), multiplies m + s u as a whole
// (the minima's mma and the block products start from the same ph); pw = fp16(ph s) adds |pw - ph s| <= 2^-11 ph s
// + 2^-25 times u; the codec's fp32 decode of y differs from m + s u by at most 2^-23 (|m| + s u).
double kivi_fast_value_bound(const Block& b, const float* p, int cc, int C, int c) {
  const int VD = b.codec->space_dim(), g = c >> b.args.group_log2;
  double bound = 0;
  for (int t = 0; t < C; ++t) {
    const int tok = C * cc + t;
    const double y = b.y[static_cast<size_t>(tok) * VD + c], pt = p[t];
    const double m = kivi_value_param(b, b.args.sec0, tok, g), sc = kivi_value_param(b, b.args.sec1, tok, g);
    const double su = std::fabs(y - m), u = sc > 0 ? std::round(su / sc) : 0;
    const double ph = pt * (1 + 0x1p-11) + 0x1p-25;
    bound += (0x1p-11 * pt + 0x1p-25) * std::fabs(y) + (0x1p-11 * ph * sc + 0x1p-25) * u +
             0x1p-23 * pt * (std::fabs(m) + su);
  }
  return bound;
}

// The fast value path (accumulate_values_fast) for every chunk and part, 8 rows of random weights p (times
// 2^kFastWeightLog2, as the kernel has them; a quarter of them tiny): A from two tiles' unscaled codes, B the weights
// times the per-token factors and block scales as fp16, plus for values with offsets (kivi's minima) the offsets'
// mma of V::offset_afrags and the weights, added per group as V::offset_row says, against sum_t p_t y_tc. Bound:
// each weight rounded at most twice to fp16 (p w, then p w s: 2^-10 relative, or 2^-25 absolute below fp16's normal
// range, times the largest A element); kivi: kivi_fast_value_bound.
template <class V, int D, int C>
void check_fast_values(const Block& b, int T, uint64_t seed) {
  constexpr int VD = value_space<V, D>(), DP = value_part<V, D>(), kParts = VD / DP, VS = C / 16;
  ASSERT_TRUE(V::fast_values(b.args));
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::uniform_real_distribution<float> unit(0.0f, 1.0f);
  const float top = static_cast<float>(1 << V::kFastWeightLog2);
  for (int cc = 0; cc < T / C; ++cc)
    for (int part = 0; part < kParts; ++part) {
      SCOPED_TRACE("fast values, chunk " + std::to_string(cc) + " part " + std::to_string(part));
      const int pc = part * DP;
      Stage st;
      value_stage<V, D, DP, C>(b, cc, pc, st);
      float p[8][C];
      for (auto& row : p)
        for (float& x : row) x = top * unit(rng) * (unit(rng) < 0.25f ? 1e-6f : 1.0f);  // some below fp16's normals
      double o[DP / 16][32][4] = {}, offsets[32][4] = {}, amax = 0;
      uint32_t ph[32][VS][2];
      for (int lane = 0; lane < 32; ++lane) {
        const int g = lane >> 2, i = lane & 3;
        float w[C / 4];
        value_weights<V, D, C>(st.prm, lane, pc, w);
        for (int vs = 0; vs < VS; ++vs)
          for (int h = 0; h < 2; ++h) {
            const int t0 = value_token<V, C>(vs, 2 * h), t1 = value_token<V, C>(vs, 2 * h + 1);
            ph[lane][vs][h] = float2_to_h2(p[g][C / 4 * i + t0] * w[t0], p[g][C / 4 * i + t1] * w[t1]);
          }
      }
      if constexpr (fast_offset_tiles<V>() > 0) {
        uint32_t am[32][VS][2];
        for (int lane = 0; lane < 32; ++lane) V::template offset_afrags<C>(st.prm, b.args, lane, pc, am[lane]);
        for (int vs = 0; vs < VS; ++vs) {
          uint4 a[32];
          uint32_t b0[32], b1[32];
          for (int lane = 0; lane < 32; ++lane) {
            a[lane] = make_uint4(am[lane][vs][0], 0u, am[lane][vs][1], 0u);
            b0[lane] = ph[lane][vs][0];
            b1[lane] = ph[lane][vs][1];
          }
          emulate_mma<false>(a, b0, b1, offsets);
        }
      }
      for (int r = 0; r < DP / 32; ++r) {
        uint32_t pw[32][VS][2];
        for (int lane = 0; lane < 32; ++lane) {
          if constexpr (V::kFastBlockScales) {
            V::template fast_weights<C>(st.prm, b.args, lane, pc, r, ph[lane], pw[lane]);
          } else {
            for (int vs = 0; vs < VS; ++vs) pw[lane][vs][0] = ph[lane][vs][0], pw[lane][vs][1] = ph[lane][vs][1];
          }
        }
        for (int m = 2 * r; m < 2 * r + 2; ++m) {
          uint32_t c0[32][VS][2], c1[32][VS][2];
          for (int lane = 0; lane < 32; ++lane) {
            value_code_bfrags<V, D, C>(st.codes.data(), st.prm, b.args, lane, 2 * m, pc, c0[lane]);
            value_code_bfrags<V, D, C>(st.codes.data(), st.prm, b.args, lane, 2 * m + 1, pc, c1[lane]);
          }
          for (int vs = 0; vs < VS; ++vs) {
            uint4 a[32];
            uint32_t b0[32], b1[32];
            for (int lane = 0; lane < 32; ++lane) {
              a[lane] = make_uint4(c0[lane][vs][0], c1[lane][vs][0], c0[lane][vs][1], c1[lane][vs][1]);
              for (int h = 0; h < 2; ++h)
                for (const uint32_t word : {c0[lane][vs][0], c0[lane][vs][1], c1[lane][vs][0], c1[lane][vs][1]})
                  amax = std::max(amax, std::fabs(operand<false>(word, h)));
              b0[lane] = pw[lane][vs][0];
              b1[lane] = pw[lane][vs][1];
            }
            emulate_mma<false>(a, b0, b1, o[m]);
          }
        }
      }
      double worst = 0;
      for (int lane = 0; lane < 32; ++lane) {
        const int n = lane >> 2, i = lane & 3;
        for (int m = 0; m < DP / 16; ++m)
          for (int x = 0; x < 4; ++x) {
            const int row = 2 * i + (x & 1), c = pc + V::channel(2 * m + (x >> 1), n);
            double got = o[m][lane][x];
            if constexpr (fast_offset_tiles<V>() > 0)  // group g of the part: row g of the offsets, lane 4 g + i
              got += offsets[4 * V::offset_row(b.args, pc, c - pc) + i][x & 1];
            double want = 0, size = 0;
            for (int t = 0; t < C; ++t) {
              const double term = p[row][t] * static_cast<double>(b.y[static_cast<size_t>(C * cc + t) * VD + c]);
              want += term;
              size += std::fabs(term);
            }
            double bound = (0x1p-10 + 1e-6) * size + C * 0x1p-25 * amax + 1e-30;
            if constexpr (fast_offset_tiles<V>() > 0) bound = kivi_fast_value_bound(b, p[row], cc, C, c) + 1e-30;
            worst = std::max(worst, std::fabs(got - want) / bound);
          }
      }
      EXPECT_LE(worst, 1.0);
    }
}

// Every element of every key B fragment (hi + lo for the kSplitB traits) against the codec's decode: element *
// factor(t) must be y[t][channel(ks, k)] of the lane's token to `rel` of itself (plus `abs`).
template <class K, int D, int C, class Factor>
void check_key_elements(const Block& b, int T, Factor factor, double rel, double abs) {
  constexpr int KD = key_space<K, D>(), NT = C / 8, KS = KD / 16;
  size_t bad = 0;
  for (int cc = 0; cc < T / C; ++cc) {
    Stage st;
    key_stage<K, D, C>(b, cc, st);
    for (int ks = 0; ks < KS; ++ks)
      for (int lane = 0; lane < 32; ++lane) {
        const int n = lane >> 2, i = lane & 3;
        uint32_t hi[NT][2], lo[NT][2] = {};
        key_bfrags<K, D, C>(st.codes.data(), st.prm, ks, b.args, lane, hi);
        if constexpr (K::kSplitB) key_bfrags_lo<K, D, C>(st.codes.data(), st.prm, ks, b.args, lane, lo);
        for (int jj = 0; jj < NT; ++jj)
          for (int q = 0; q < 4; ++q) {
            const int t = C * cc + C / 8 * n + jj, c = K::template channel<D>(ks, frag_k(i, q));
            const double got = (operand<K::kBf16>(hi[jj][q >> 1], q & 1) + operand<K::kBf16>(lo[jj][q >> 1], q & 1)) *
                               factor(t);
            const double want = b.y[static_cast<size_t>(t) * KD + static_cast<size_t>(c)];
            if (std::fabs(got - want) > rel * std::fabs(want) + abs && bad++ < 5)
              ADD_FAILURE() << "chunk " << cc << " k step " << ks << " lane " << lane << " token " << t << " channel "
                            << c << ": fragment gives " << got << ", the codec " << want;
          }
      }
  }
  EXPECT_EQ(bad, 0u);
}

// Every element of every value B fragment, times the lane's weight (value_weights), against the codec's decode:
// lane (n, i) half q of step vs is token (C / 4) i + value_token(vs, q), channel pc + channel(j, n).
template <class V, int D, int C>
void check_value_elements(const Block& b, int T, double rel, double abs) {
  constexpr int VD = value_space<V, D>(), DP = value_part<V, D>(), kParts = VD / DP, VS = C / 16, NJ = DP / 8;
  size_t bad = 0;
  for (int cc = 0; cc < T / C; ++cc)
    for (int part = 0; part < kParts; ++part) {
      const int pc = part * DP;
      Stage st;
      value_stage<V, D, DP, C>(b, cc, pc, st);
      for (int lane = 0; lane < 32; ++lane) {
        const int n = lane >> 2, i = lane & 3;
        float w[C / 4];
        value_weights<V, D, C>(st.prm, lane, pc, w);
        for (int j = 0; j < NJ; ++j) {
          uint32_t bf[VS][2];
          V::template bfrags<D, DP, C>(st.codes.data(), st.prm, b.args, lane, j, pc, bf);
          for (int vs = 0; vs < VS; ++vs)
            for (int q = 0; q < 4; ++q) {
              const int u = value_token<V, C>(vs, q), t = C * cc + C / 4 * i + u, c = pc + V::channel(j, n);
              const double got = operand<V::kBf16>(bf[vs][q >> 1], q & 1) * w[u];
              const double want = b.y[static_cast<size_t>(t) * VD + static_cast<size_t>(c)];
              if (std::fabs(got - want) > rel * std::fabs(want) + abs && bad++ < 5)
                ADD_FAILURE() << "chunk " << cc << " tile " << j << " lane " << lane << " token " << t << " channel "
                              << c << ": fragment gives " << got << ", the codec " << want;
            }
        }
      }
    }
  EXPECT_EQ(bad, 0u);
}

// Keys of KeyTraits and values of ValueTraits at the chunk size of their pair (a key trait meets C = 64 beside
// kivi:2 values, a value trait C = 32 beside keys of 32-token chunks).
template <class KeyTraits, class ValueTraits, int D>
void check_pair(const std::string& key_spec, const std::string& value_spec, uint64_t seed) {
  using K = typename KeyTraits::Key;
  using V = typename ValueTraits::Value;
  constexpr int C = SplitShape<K, V, D>::C;
  for (int T : {64, 128}) {
    SCOPED_TRACE(key_spec + " / " + value_spec + " d=" + std::to_string(D) + " T=" + std::to_string(T) +
                 " C=" + std::to_string(C));
    const Block kb = encode(key_spec, D, T, true, seed + static_cast<uint64_t>(T));
    check_keys<K, D, C>(kb, T, seed + 11);
    const Block vb = encode(value_spec, D, T, false, seed + static_cast<uint64_t>(T) + 1);
    check_values<V, D, C>(vb, T, seed + 12);
  }
}

// Keys only (the codecs whose values have no kernel, or other sketch sizes).
template <class K>
void check_every_dim_keys(const std::string& spec, uint64_t seed) {
  const auto at = [&]<int D>(uint64_t s) {
    for (int T : {64, 128}) {
      SCOPED_TRACE(spec + " keys d=" + std::to_string(D) + " T=" + std::to_string(T));
      check_keys<K, D, 32>(encode(spec, D, T, true, s + static_cast<uint64_t>(T)), T, s + 11);
    }
  };
  at.template operator()<64>(seed);
  at.template operator()<128>(seed + 100);
  at.template operator()<256>(seed + 200);
}

template <class KeyTraits, class ValueTraits = KeyTraits>
void check_every_dim(const std::string& key_spec, uint64_t seed, const std::string& value_spec = "") {
  const std::string& v = value_spec.empty() ? key_spec : value_spec;
  check_pair<KeyTraits, ValueTraits, 64>(key_spec, v, seed);
  check_pair<KeyTraits, ValueTraits, 128>(key_spec, v, seed + 100);
  check_pair<KeyTraits, ValueTraits, 256>(key_spec, v, seed + 200);
}

TEST(CudaFragments, FloatPairsMatchTheCodec) {
  KVQ_FRESH_SEED();
  check_every_dim<FloatTraits<false>>("f16", seed);
  check_every_dim<FloatTraits<true>>("bf16", seed + 1);
}

// f16/bf16 stages (FloatStage) at every (D, C) the kernels instantiate: each lane's key and value fragments hold
// exactly the chunk's elements that the unplaced rows give them (values read as ldmatrix.trans reads, from the row
// address of lane 8m + r for row r of matrix m), and the 16-byte reads of one shared-memory wavefront (a value
// matrix's 8 rows; a key load's quarter warp) fall in 8 distinct bank groups.
template <int D, int C>
void check_float_stage() {
  SCOPED_TRACE("d=" + std::to_string(D) + " C=" + std::to_string(C));
  using Key = FloatTraits<false>::Key;
  using Value = FloatTraits<false>::Value;
  std::vector<uint16_t> chunk(static_cast<size_t>(C) * D);
  for (size_t x = 0; x < chunk.size(); ++x) chunk[x] = static_cast<uint16_t>(x);  // element (t, c) is t D + c
  const std::vector<uint4> codes = float_stage<D, C>(reinterpret_cast<const uint8_t*>(chunk.data()));
  const auto half = [](uint32_t w, int h) { return static_cast<int>(h ? w >> 16 : w & 0xffffu); };
  const auto distinct_groups = [](const uint32_t (&offsets)[8]) {
    int seen = 0;
    for (uint32_t off : offsets) seen |= 1 << (off / 16 % 8);
    return seen == 0xff;
  };

  for (int ks = 0; ks < D / 16; ks += 2)
    for (int jj = 0; jj < C / 8; ++jj) {
      for (int q = 0; q < 4; ++q) {
        uint32_t offsets[8];
        for (int l = 0; l < 8; ++l) offsets[l] = Key::column<D, C>(8 * q + l, jj, ks);
        EXPECT_TRUE(distinct_groups(offsets)) << "keys: k steps " << ks << " tile " << jj << " quarter " << q;
      }
      for (int lane = 0; lane < 32; ++lane) {
        const int n = lane >> 2, i = lane & 3, t = C / 8 * n + jj;
        uint32_t b[C / 8][2];
        for (int s = 0; s < 2; ++s) {
          Key::bfrags<D, C>(codes.data(), ks + s, CodecArgs{}, lane, b);
          for (int e = 0; e < 4; ++e)
            ASSERT_EQ(half(b[jj][e >> 1], e & 1), t * D + Key::channel<D>(ks + s, frag_k(i, e)))
                << "keys: k step " << ks + s << " tile " << jj << " lane " << lane;
        }
      }
    }

  if constexpr (C <= 32) {
    for (int pc = 0; pc < D; pc += 128)
      for (int j = 0; j < (D < 128 ? D : 128) / 8; ++j) {
        const uint8_t* base = reinterpret_cast<const uint8_t*>(codes.data());
        for (int m = 0; m < 2 * (C / 16); ++m) {
          uint32_t offsets[8];
          for (int r = 0; r < 8; ++r)
            offsets[r] = static_cast<uint32_t>(Value::row<D, C>(codes.data(), Value::row_token<C>(m, r), j, pc) - base);
          EXPECT_TRUE(distinct_groups(offsets)) << "values: tile " << j << " part " << pc << " matrix " << m;
        }
        for (int lane = 0; lane < 32; ++lane) {
          const int n = lane >> 2, i = lane & 3;
          uint32_t b[C / 16][2];
          Value::bfrags<D, D, C>(codes.data(), nullptr, CodecArgs{}, lane, j, pc, b);
          for (int vs = 0; vs < C / 16; ++vs)
            for (int q = 0; q < 4; ++q) {
              const int t = C / 4 * i + value_token<Value, C>(vs, q);
              ASSERT_EQ(half(b[vs][q >> 1], q & 1), t * D + pc + Value::channel(j, n))
                  << "values: tile " << j << " part " << pc << " step " << vs << " lane " << lane;
            }
        }
      }
  }
}

TEST(CudaFragments, FloatStageReadsAreExactAndConflictFree) {
  check_float_stage<64, 16>();
  check_float_stage<64, 32>();
  check_float_stage<64, 64>();
  check_float_stage<128, 16>();
  check_float_stage<128, 32>();
  check_float_stage<128, 64>();
  check_float_stage<256, 16>();
  check_float_stage<256, 32>();
  check_float_stage<256, 64>();
}

TEST(CudaFragments, IntPairsMatchTheCodec) {
  KVQ_FRESH_SEED();
  check_every_dim<IntTraits<4>>("int4", seed);
  check_every_dim<IntTraits<4>>("int4:64", seed + 1);
  check_every_dim<IntTraits<8>>("int8", seed + 2);
  check_every_dim<IntTraits<8>>("int8:16", seed + 3);
}

TEST(CudaFragments, IntValuesFastPathMatchesTheCodec) {
  KVQ_FRESH_SEED();
  const auto at = [&]<int D>(const std::string& spec, uint64_t s) {
    for (int T : {64, 128}) {
      SCOPED_TRACE(spec + " fast values d=" + std::to_string(D) + " T=" + std::to_string(T));
      check_fast_values<IntTraits<4>::Value, D, 32>(encode(spec, D, T, false, s + static_cast<uint64_t>(T)), T, s);
    }
  };
  for (const std::string spec : {"int4", "int4:64"}) {
    at.template operator()<64>(spec, seed);
    at.template operator()<128>(spec, seed + 100);
    at.template operator()<256>(spec, seed + 200);
  }
  EXPECT_FALSE(IntTraits<4>::Value::fast_values(encode("int4:16", 128, 64, false, seed).args));
}

TEST(CudaFragments, TurboMseValuesFastPathMatchesTheCodec) {
  KVQ_FRESH_SEED();
  const auto at = [&]<class V, int D>(const std::string& spec, uint64_t s) {
    for (int T : {64, 128}) {
      SCOPED_TRACE(spec + " fast values d=" + std::to_string(D) + " T=" + std::to_string(T));
      check_fast_values<V, D, 32>(encode(spec, D, T, false, s + static_cast<uint64_t>(T)), T, s);
    }
  };
  at.template operator()<TurboMseTraits<1>::Value, 128>("turbo_mse:1", seed);
  at.template operator()<TurboMseTraits<2>::Value, 64>("turbo_mse:2", seed + 1);
  at.template operator()<TurboMseTraits<3>::Value, 128>("turbo_mse:3", seed + 2);
  at.template operator()<TurboMseTraits<3>::Value, 256>("turbo_mse:3", seed + 3);
  at.template operator()<TurboMseTraits<4>::Value, 128>("turbo_mse:4", seed + 4);
}

// kivi values on the fast path (groups of 32 channels or more), on Gaussian and on key-like data with outlier
// channels; groups of 16 keep the exact value path.
TEST(CudaFragments, KiviValuesFastPathMatchesTheCodec) {
  KVQ_FRESH_SEED();
  const auto at = [&]<class V, int D>(const std::string& spec, uint64_t s) {
    for (int T : {64, 128})
      for (bool key_like : {false, true}) {
        SCOPED_TRACE(spec + " fast values d=" + std::to_string(D) + " T=" + std::to_string(T) +
                     (key_like ? " key-like" : " Gaussian"));
        const uint64_t bs = s + static_cast<uint64_t>(T) + (key_like ? 1 : 0);
        check_fast_values<V, D, V::kChunk>(encode(spec, D, T, false, bs, key_like), T, s);
      }
  };
  for (const std::string spec : {"kivi:2", "kivi:2,g=64"}) {
    at.template operator()<KiviTraits<2>::Value, 64>(spec, seed);
    at.template operator()<KiviTraits<2>::Value, 128>(spec, seed + 100);
    at.template operator()<KiviTraits<2>::Value, 256>(spec, seed + 200);
  }
  for (const std::string spec : {"kivi:4", "kivi:4,g=64", "kivi:4,g=128"}) {
    at.template operator()<KiviTraits<4>::Value, 128>(spec, seed + 300);
    at.template operator()<KiviTraits<4>::Value, 256>(spec, seed + 400);
  }
  at.template operator()<KiviTraits<4>::Value, 64>("kivi:4", seed + 500);
  for (const std::string spec : {"kivi:3", "kivi:3,g=64"}) {
    at.template operator()<KiviTraits<3>::Value, 64>(spec, seed + 600);
    at.template operator()<KiviTraits<3>::Value, 128>(spec, seed + 700);
    at.template operator()<KiviTraits<3>::Value, 256>(spec, seed + 800);
  }
  EXPECT_FALSE(KiviTraits<3>::Value::fast_values(encode("kivi:3,g=16", 128, 64, false, seed).args));
  EXPECT_FALSE(KiviTraits<2>::Value::fast_values(encode("kivi:2,g=16", 128, 64, false, seed).args));
  EXPECT_FALSE(KiviTraits<4>::Value::fast_values(encode("kivi:4,g=16", 128, 64, false, seed).args));
}

TEST(CudaFragments, IntKeysIntegerPathMatchesTheCodec) {
  KVQ_FRESH_SEED();
  check_every_dim_int_keys<IntTraits<4>::Key>("int4", seed);
  check_every_dim_int_keys<IntTraits<4>::Key>("int4:16", seed + 1);
  check_every_dim_int_keys<IntTraits<4>::Key>("int4:64", seed + 2);
  check_every_dim_int_keys<IntTraits<8>::Key>("int8", seed + 3);
  check_every_dim_int_keys<IntTraits<8>::Key>("int8:16", seed + 4);
  check_every_dim_int_keys<IntTraits<8>::Key>("int8:64", seed + 5);
}

TEST(CudaFragments, KiviKeysIntegerPathMatchesTheCodec) {
  KVQ_FRESH_SEED();
  check_every_dim_kivi_int_keys<KiviTraits<2>::Key>("kivi:2", seed);
  check_every_dim_kivi_int_keys<KiviTraits<4>::Key>("kivi:4", seed + 1);
  check_every_dim_kivi_int_keys<KiviTraits<2>::Key>("kivi:2,g=16", seed + 2);
  check_every_dim_kivi_int_keys<KiviTraits<3>::Key>("kivi:3", seed + 3);
}

TEST(CudaFragments, TurboMseKeysIntegerPathMatchesTheCodec) {
  KVQ_FRESH_SEED();
  check_every_dim_int_keys<TurboMseTraits<1>::Key>("turbo_mse:1", seed);
  check_every_dim_int_keys<TurboMseTraits<2>::Key>("turbo_mse:2", seed + 1);
  check_every_dim_int_keys<TurboMseTraits<3>::Key>("turbo_mse:3", seed + 2);
}

// turbo_mse's shared pieces: in every region the lanes below 8 b copy each of the region's 8 b slots once, the rest
// nothing (lane_copies: a lane all of its pieces or none); every lane reads its low-bits and 1-bit slots inside the
// region; and the distinct slots that a quarter warp reads lie on distinct banks (slot mod 8: 16 bytes = 4 of the 32
// banks), so the reads take one wavefront each.
template <int kBits>
void check_shared_pieces() {
  using T = TurboMseTraits<kBits>;
  constexpr int R = T::kRegionSlots;
  for (int r = 0; r < 3; ++r) {
    std::vector<int> copies(R, 0);
    for (int lane = 0; lane < 32; ++lane) {
      EXPECT_EQ((lane_copies<typename T::Key, 128, 64>(lane)), lane < R);
      EXPECT_EQ((lane_copies<typename T::Value, 128, 128, 32>(lane)), lane < R);
      const int slot = lane_slot<typename T::Key>(r, lane);
      if (lane >= R) continue;
      ASSERT_GE(slot, R * r);
      ASSERT_LT(slot, R * (r + 1));
      ++copies[slot - R * r];
    }
    for (int c : copies) EXPECT_EQ(c, 1) << "turbo_mse:" << kBits;
    for (int quarter = 0; quarter < 4; ++quarter)
      for (const bool bit : {false, true}) {
        std::vector<int> slots;
        for (int lane = 8 * quarter; lane < 8 * quarter + 8; ++lane) {
          const int slot = bit ? T::bit_slot(r, lane) : T::low_slot(r, lane);
          ASSERT_GE(slot, R * r);
          ASSERT_LT(slot, R * (r + 1));
          if (std::find(slots.begin(), slots.end(), slot) == slots.end()) slots.push_back(slot);
        }
        std::vector<int> banks;
        for (int slot : slots) banks.push_back(slot % 8);
        std::sort(banks.begin(), banks.end());
        EXPECT_EQ(std::unique(banks.begin(), banks.end()), banks.end())
            << "turbo_mse:" << kBits << " quarter " << quarter << (bit ? " 1-bit" : " low") << " reads share banks";
      }
  }
}

// piece_source's premise: where a codec's steps are fixed (kFixedPieceSteps), a copying lane's piece k lies the same
// distance from its piece 0 for every lane.
template <class T, int D, int C>
void check_key_steps(const char* name) {
  static_assert(kFixedPieceSteps<T>);
  const CodecArgs args;
  const auto piece = [&](int lane, int k) { return T::template piece<D, C>(args, lane, k); };
  for (int k = 0; k < T::template pieces<D, C>(); ++k)
    for (int lane = 1; lane < 32; ++lane)
      if (lane_copies<T, D, C>(lane))
        EXPECT_EQ(piece(lane, k) - piece(lane, 0), piece(0, k) - piece(0, 0))
            << name << " keys d " << D << " piece " << k;
}
template <class T, int D, int DP, int C>
void check_value_steps(const char* name) {
  static_assert(kFixedPieceSteps<T>);
  const CodecArgs args;
  for (int pc = 0; pc + DP <= D; pc += 64) {
    const auto piece = [&](int lane, int k) { return T::template piece<D, DP, C>(args, lane, k, pc); };
    for (int k = 0; k < T::template pieces<D, DP, C>(); ++k)
      for (int lane = 1; lane < 32; ++lane)
        if (lane_copies<T, D, DP, C>(lane))
          EXPECT_EQ(piece(lane, k) - piece(lane, 0), piece(0, k) - piece(0, 0))
              << name << " values d " << D << " pc " << pc << " piece " << k;
  }
}
template <class T, int C>
void check_key_piece_steps(const char* name) {
  check_key_steps<typename T::Key, 64, C>(name);
  check_key_steps<typename T::Key, 128, C>(name);
  check_key_steps<typename T::Key, 256, C>(name);
}
template <class T, int C>
void check_value_piece_steps(const char* name) {
  check_value_steps<typename T::Value, 64, 64, C>(name);
  check_value_steps<typename T::Value, 128, 128, C>(name);
  check_value_steps<typename T::Value, 256, 128, C>(name);
}

TEST(CudaFragments, FixedPieceStepsAreTheSameForEveryLane) {
  check_key_piece_steps<IntTraits<4>, 32>("int4");
  check_key_piece_steps<IntTraits<4>, 64>("int4");
  check_key_piece_steps<IntTraits<8>, 32>("int8");
  check_key_piece_steps<IntTraits<8>, 64>("int8");
  check_key_piece_steps<KiviTraits<2>, 64>("kivi:2");
  check_key_piece_steps<KiviTraits<4>, 32>("kivi:4");
  check_key_piece_steps<KiviTraits<3>, 32>("kivi:3");
  check_key_piece_steps<KiviTraits<3>, 64>("kivi:3");
  check_key_piece_steps<TurboMseTraits<1>, 32>("turbo_mse:1");
  check_key_piece_steps<TurboMseTraits<2>, 64>("turbo_mse:2");
  check_key_piece_steps<TurboMseTraits<3>, 32>("turbo_mse:3");
  check_key_piece_steps<TurboMseTraits<4>, 64>("turbo_mse:4");
  check_value_piece_steps<IntTraits<4>, 32>("int4");
  check_value_piece_steps<IntTraits<8>, 32>("int8");
  check_value_piece_steps<KiviTraits<2>, 64>("kivi:2");
  check_value_piece_steps<KiviTraits<4>, 32>("kivi:4");
  check_value_piece_steps<KiviTraits<3>, 64>("kivi:3");
  check_value_piece_steps<TurboMseTraits<1>, 32>("turbo_mse:1");
  check_value_piece_steps<TurboMseTraits<2>, 32>("turbo_mse:2");
  check_value_piece_steps<TurboMseTraits<3>, 32>("turbo_mse:3");
  check_value_piece_steps<TurboMseTraits<4>, 32>("turbo_mse:4");
}

TEST(CudaFragments, TurboMseSharedPiecesAreCopiedOnceAndReadWithoutConflicts) {
  check_shared_pieces<1>();
  check_shared_pieces<2>();
  check_shared_pieces<3>();
  check_shared_pieces<4>();
}

TEST(CudaFragments, KiviPairsMatchTheCodec) {
  KVQ_FRESH_SEED();
  check_every_dim<KiviTraits<2>>("kivi:2", seed);
  check_every_dim<KiviTraits<2>>("kivi:2,g=16", seed + 1);
  check_every_dim<KiviTraits<4>>("kivi:4", seed + 2);
  check_every_dim<KiviTraits<4>>("kivi:4,g=16", seed + 3);
  check_every_dim<KiviTraits<4>>("kivi:4,g=64", seed + 4);
  check_every_dim<KiviTraits<3>>("kivi:3", seed + 5);
  check_every_dim<KiviTraits<3>>("kivi:3,g=16", seed + 6);
  check_every_dim<KiviTraits<3>>("kivi:3,g=64", seed + 7);
}

TEST(CudaFragments, TurboMsePairsMatchTheCodec) {
  KVQ_FRESH_SEED();
  check_every_dim<TurboMseTraits<1>>("turbo_mse:1", seed);
  check_every_dim<TurboMseTraits<2>>("turbo_mse:2", seed + 1);
  check_every_dim<TurboMseTraits<3>>("turbo_mse:3", seed + 2);
  check_every_dim<TurboMseTraits<4>>("turbo_mse:4", seed + 3);
}

// Mixed pairs: every key trait in chunks of 64 tokens (beside kivi:2 values), f16 values in chunks of 32.
TEST(CudaFragments, MixedPairsMatchTheCodecs) {
  KVQ_FRESH_SEED();
  check_every_dim<IntTraits<4>, KiviTraits<2>>("int4", seed, "kivi:2");
  check_every_dim<IntTraits<8>, KiviTraits<2>>("int8:16", seed + 1, "kivi:2");
  check_every_dim<KiviTraits<4>, KiviTraits<2>>("kivi:4", seed + 2, "kivi:2");
  check_every_dim<TurboMseTraits<3>, KiviTraits<2>>("turbo_mse:3", seed + 3, "kivi:2");
  check_every_dim<TurboMseTraits<4>, KiviTraits<2>>("turbo_mse:4", seed + 4, "kivi:2");
  check_every_dim<TurboMseTraits<1>, KiviTraits<2>>("turbo_mse:1", seed + 9, "kivi:2");
  check_every_dim<TurboMseTraits<2>, KiviTraits<2>>("turbo_mse:2", seed + 10, "kivi:2");
  check_every_dim<FloatTraits<true>, KiviTraits<2>>("bf16", seed + 5, "kivi:2");
  check_every_dim<IntTraits<4>, FloatTraits<false>>("int4", seed + 6, "f16");
  check_every_dim<KiviTraits<4>, IntTraits<4>>("kivi:4", seed + 7, "int4");
  check_every_dim<TurboMseTraits<4>, TurboMseTraits<2>>("turbo_mse:4", seed + 8, "turbo_mse:2");
  // kivi:3 (the default build's pairs; keys in chunks of 32 beside int4 and turbo_mse:2 values, of 64 beside
  // kivi:2's), kivi:4 / turbo_mse:2, and kivi:3 values beside keys of 32-token chunks
  check_every_dim<KiviTraits<3>, IntTraits<4>>("kivi:3", seed + 11, "int4");
  check_every_dim<KiviTraits<3>, TurboMseTraits<2>>("kivi:3", seed + 12, "turbo_mse:2");
  check_every_dim<KiviTraits<3>, KiviTraits<2>>("kivi:3", seed + 13, "kivi:2");
  check_every_dim<KiviTraits<4>, TurboMseTraits<2>>("kivi:4", seed + 14, "turbo_mse:2");
  check_every_dim<IntTraits<4>, KiviTraits<3>>("int4", seed + 15, "kivi:3");
}

TEST(CudaFragments, QjlPairsMatchTheCodec) {
  KVQ_FRESH_SEED();
  check_every_dim<QjlTraits<0>>("qjl", seed);
  check_every_dim<QjlTraits<256>>("qjl:256", seed + 1);
  check_every_dim<QjlTraits<0>, IntTraits<4>>("qjl", seed + 2, "int4");
  check_every_dim<QjlTraits<256>, IntTraits<4>>("qjl:256", seed + 3, "int4");
}

TEST(CudaFragments, VecInferPairsMatchTheCodec) {
  KVQ_FRESH_SEED();
  check_every_dim<VecInferTraits<8, 4>>("vecinfer:8/4", seed);
  check_every_dim<VecInferTraits<10, 4>>("vecinfer:10/4", seed + 1);
  check_every_dim_keys<VecInferTraits<8, 4>::Key>("vecinfer:8/4,norm=1", seed + 2);
}

// vecinfer:12/8: the codebook gathered from global memory (no shared-memory table), keys with and without gammas;
// every fragment element is the codebook's centroid coordinate (keys: hi + lo to fp32 accuracy; values: fp16).
TEST(CudaFragments, VecInfer12x8PairsMatchTheCodec) {
  KVQ_FRESH_SEED();
  using VI = VecInferTraits<12, 8>;
  static_assert(!VI::kSharedTable && VecInferTraits<10, 4>::kSharedTable && VecInferTraits<8, 4>::kSharedTable);
  check_every_dim<VI>("vecinfer:12/8", seed);
  check_every_dim_keys<VI::Key>("vecinfer:12/8,norm=1", seed + 1);
  const auto at = [&]<int D>(uint64_t s) {
    SCOPED_TRACE("vecinfer:12/8 elements d=" + std::to_string(D));
    const Block kb = encode("vecinfer:12/8", D, 64, true, s);
    EXPECT_EQ(kb.args.table_bytes, 0u);
    EXPECT_EQ(kb.table.size(), size_t{4096} * 8);  // 4096 centroids x 8 channels, fp16 hi + lo
    check_key_elements<VI::Key, D, 32>(kb, 64, [](int) { return 1.0; }, 1e-6, 1e-7);
    const Block vb = encode("vecinfer:12/8", D, 64, false, s + 1);
    EXPECT_EQ(vb.args.table_bytes, 0u);
    check_value_elements<VI::Value, D, 32>(vb, 64, 4.9e-4, 1e-7);  // fp16: 2^-11
  };
  at.template operator()<64>(seed + 2);
  at.template operator()<128>(seed + 3);
  at.template operator()<256>(seed + 4);
}

// vecinfer values with gammas (norm=1) have no kernel: the plan's codec arguments refuse them by name.
TEST(CudaFragments, VecInferValuesWithGammasAreRefused) {
  KVQ_FRESH_SEED();
  const Block keys = encode("vecinfer:8/4,norm=1", 128, 64, true, seed);
  EXPECT_NE(keys.args.sec1, 0u);  // the keys' gammas scale their score tiles
  const auto values = make_codec("vecinfer:8/4,norm=1", CodecParams{128, 64, seed, Role::value});
  try {
    host_codec_args(*values, false);
    ADD_FAILURE() << "vecinfer values with norm=1 must be refused";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("norm=1"), std::string::npos) << e.what();
  }
}

// turbo_rvq:b: the chunk's token-major rows as parameter ranges, each lane extracting its indices. Scores and value
// sums per chunk as for every codec, then every fragment element against the codec's decode: a key element (stage
// 1 in bfrags + stage 2 in bfrags_lo, levels times 2^12) times norm * 2^-12 is the decoded coordinate exactly (to
// float rounding); a value element (the stages added in fp16) times its weight is it to fp16 rounding.
template <int kBits>
void check_turbo_rvq(uint64_t seed) {
  using R = TurboRvqTraits<kBits>;
  const std::string spec = "turbo_rvq:" + std::to_string(kBits);
  check_every_dim<R>(spec, seed);
  const auto at = [&]<int D>(uint64_t s) {
    for (int T : {64, 128}) {
      SCOPED_TRACE(spec + " elements d=" + std::to_string(D) + " T=" + std::to_string(T));
      const Block kb = encode(spec, D, T, true, s + static_cast<uint64_t>(T));
      const auto tr = turbo_rvq_params(*kb.codec);
      ASSERT_TRUE(tr.has_value());
      EXPECT_EQ(kb.args.table_bytes, kb.table.size() * sizeof(uint32_t));
      const auto norm = [&](int t) {
        return static_cast<double>(load_f16(kb.bytes.data() + tr->layout.norms_offset(), static_cast<size_t>(t)));
      };
      check_key_elements<typename R::Key, D, 32>(kb, T, [&](int t) { return norm(t) * 0x1p-12; }, 1e-6, 1e-9);
      const Block vb = encode(spec, D, T, false, s + static_cast<uint64_t>(T) + 1);
      check_value_elements<typename R::Value, D, 32>(vb, T, 4.9e-4, 1e-9);  // fp16: 2^-11
    }
  };
  at.template operator()<64>(seed + 1);
  at.template operator()<128>(seed + 2);
  at.template operator()<256>(seed + 3);
}

TEST(CudaFragments, TurboRvqPairsMatchTheCodec) {
  KVQ_FRESH_SEED();
  check_turbo_rvq<1>(seed);
  check_turbo_rvq<2>(seed + 10);
  check_turbo_rvq<3>(seed + 20);
  check_turbo_rvq<4>(seed + 30);
  check_every_dim<TurboRvqTraits<2>, IntTraits<4>>("turbo_rvq:2", seed + 40, "int4");
}

TEST(CudaFragments, TurboProdPairsMatchTheCodec) {
  KVQ_FRESH_SEED();
  check_every_dim<TurboProdTraits<4>>("turbo_prod:4", seed);
  check_every_dim<TurboProdTraits<3>>("turbo_prod:3", seed + 3);
  check_every_dim<TurboProdTraits<2>>("turbo_prod:2", seed + 4);
  check_every_dim<TurboProdTraits<4>, IntTraits<4>>("turbo_prod:4", seed + 1, "int4");
  check_every_dim<TurboProdTraits<4>, TurboMseTraits<3>>("turbo_prod:4", seed + 2, "turbo_mse:3");
}

}  // namespace
}  // namespace kvq

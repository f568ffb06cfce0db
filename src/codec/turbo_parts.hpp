// Pieces shared by the TurboQuant codecs (turbo_mse, turbo_prod, turbo_rvq) and qjl: the norm split x = ||x|| u
// with the norm stored as fp16, a Lloyd–Max codebook in the float form the kernels use, and the fused kernels of
// codecs whose tokens decode to ||x|| times a level per coordinate.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string_view>
#include <vector>

#include "codec/block_layout.hpp"
#include "codec/lloyd_max.hpp"
#include "core/half.hpp"
#include "kvq/codec.hpp"
#include "kvq/rotation.hpp"

namespace kvq {

/// Codecs accept d <= 512, so per-token scratch fits on the stack.
constexpr int kMaxCodecDim = 512;

/// A symmetric scalar codebook in float, its centroids rounded to fp16 precision: every kernel (CPU and CUDA) then
/// uses the same levels, and the tensor-core kernels take them as exact fp16 operands (one product, not a hi + lo
/// pair). The rounding moves a centroid by at most 2^-12 of itself, raising the distortion by about 1e-6 of it. The
/// boundaries are the midpoints of the rounded centroids, so nearest() is the nearest of them.
class FloatCodebook {
 public:
  explicit FloatCodebook(const ScalarCodebook& book) : bits_(book.bits) {
    for (const double c : book.centroids) centroids_.push_back(round_f16(static_cast<float>(c)));
    for (size_t i = 0; i + 1 < centroids_.size(); ++i)
      boundaries_.push_back(0.5f * (centroids_[i] + centroids_[i + 1]));
  }

  int bits() const { return bits_; }
  int size() const { return static_cast<int>(centroids_.size()); }
  const float* centroids() const { return centroids_.data(); }
  float operator[](int i) const { return centroids_[i]; }
  /// The size() - 1 decision thresholds nearest() counts (the CUDA append kernels take the same ones).
  const std::vector<float>& boundaries() const { return boundaries_; }

  /// The index of the centroid nearest to u (the number of boundaries below u; a tie goes to the lower one).
  uint8_t nearest(float u) const {
    uint8_t i = 0;
    for (const float t : boundaries_) i += u > t;
    return i;
  }

 private:
  int bits_;
  std::vector<float> centroids_, boundaries_;
};

/// The fp16 bits of a norm as stored; throws kvq::Error, naming `codec`, when it is beyond the fp16 range.
uint16_t stored_norm(double norm, std::string_view codec);

/// u = R x / ||x|| (all zero for x = 0), ||x|| in double (lane_norm.hpp's order). Returns stored_norm(||x||).
uint16_t split_norm(const Rotation& rotation, const float* x, float* u, std::string_view codec);

/// Writes token t's d indices into a zeroed LaneCodes section (the low bits in part 0, the rest in part 1).
inline void write_lane_codes(const layout::LaneCodes& l, int t, const uint8_t* idx, uint8_t* codes) {
  for (size_t c = 0; c < l.d; ++c) {
    unsigned rest = idx[c];
    for (size_t p = 0; p < l.parts(); ++p) {
      const auto at = l.place(static_cast<size_t>(t), c, p);
      codes[at.byte] |= static_cast<uint8_t>((rest & ((1u << at.width) - 1)) << at.shift);
      rest >>= at.width;
    }
  }
}

/// Token t's d indices from a LaneCodes section.
inline void read_lane_codes(const layout::LaneCodes& l, int t, const uint8_t* codes, uint8_t* idx) {
  for (size_t c = 0; c < l.d; ++c) {
    unsigned value = 0, low = 0;
    for (size_t p = 0; p < l.parts(); ++p) {
      const auto at = l.place(static_cast<size_t>(t), c, p);
      value |= ((codes[at.byte] >> at.shift) & ((1u << at.width) - 1)) << low;
      low += at.width;
    }
    idx[c] = static_cast<uint8_t>(value);
  }
}

/// Token t's m sign bits (bitpack.hpp order: bit i of byte i / 8) from a SignTiles section into `bits`; returns bits.
inline const uint8_t* read_sign_bits(const layout::SignTiles& l, const uint8_t* section, size_t t, uint8_t* bits) {
  std::memset(bits, 0, (l.m + 7) / 8);
  for (size_t r = 0; r < l.m; ++r)
    bits[r / 8] |= static_cast<uint8_t>(((section[l.byte(t, r)] >> l.shift(t, r)) & 1) << (r % 8));
  return bits;
}

/// Writes token t's m sign bits (bitpack.hpp order) into a zeroed SignTiles section.
inline void write_sign_bits(const layout::SignTiles& l, size_t t, const uint8_t* bits, uint8_t* section) {
  for (size_t r = 0; r < l.m; ++r)
    section[l.byte(t, r)] |= static_cast<uint8_t>(((bits[r / 8] >> (r % 8)) & 1) << l.shift(t, r));
}

/// The level of each nibble 0..15 that a LaneCodes chunk of b-bit indices decodes to (layout::LaneCodes: the index
/// is the nibble for b = 4, its low 3 bits for b = 2, 3, bit 2 for b = 1).
inline std::array<float, 16> nibble_levels(int bits, const float* centroids) {
  std::array<float, 16> table{};
  for (int e = 0; e < 16; ++e) table[e] = centroids[bits == 4 ? e : bits == 1 ? (e >> 2) & 1 : e & ((1 << bits) - 1)];
  return table;
}

/// Element i of a section of fp16 values (blocks carry no alignment promise).
inline float load_f16(const uint8_t* section, size_t i) {
  uint16_t h;
  std::memcpy(&h, section + 2 * i, 2);
  return f16_to_f32(h);
}
inline void store_f16(uint8_t* section, size_t i, uint16_t h) { std::memcpy(section + 2 * i, &h, 2); }

// Codecs whose token decodes to ||x|| level[idx_j] in the rotated space (turbo_mse, turbo_rvq) share their fused
// kernels. LevelCodec provides dim(), block_tokens(), to_space(), levels() (the float level table) and
// `float unpack(block, t, idx)`, which writes token t's d level indices and returns its stored norm.

/// sum_j q_j level[idx_j] for d a multiple of 4, with four partial sums (independent additions pipeline).
inline float level_dot(const float* q, const float* level, const uint8_t* idx, int d) {
  float s[4] = {};
  for (int j = 0; j < d; j += 4)
    for (int k = 0; k < 4; ++k) s[k] += q[j + k] * level[idx[j + k]];
  return (s[0] + s[1]) + (s[2] + s[3]);
}

/// Scores rotated queries against each coordinate's level: no decoded keys, no allocation per call.
template <class LevelCodec>
class LevelScorer final : public Scorer {
 public:
  LevelScorer(const LevelCodec& codec, const float* q, int n_q)
      : Scorer(n_q, codec.block_tokens()), codec_(codec), q_(static_cast<size_t>(n_q) * codec.dim()) {
    codec.to_space(q, n_q, q_.data());
  }

  void scores(const uint8_t* block, int n, float* out) override {
    uint8_t idx[kMaxCodecDim];
    const int d = codec_.dim();
    const float* level = codec_.levels();
    for (int t = 0; t < n; ++t) {
      const float norm = codec_.unpack(block, t, idx);
      for (int i = 0; i < n_queries(); ++i) {
        out[static_cast<size_t>(i) * block_tokens() + t] =
            norm * level_dot(q_.data() + static_cast<size_t>(i) * d, level, idx, d);
      }
    }
  }

 private:
  const LevelCodec& codec_;
  std::vector<float> q_;  // n_q x d, rotated
};

/// y[t * d + j] = ||x_t|| level[idx_tj] for tokens t < n.
template <class LevelCodec>
void decode_levels(const LevelCodec& codec, const uint8_t* block, int n, float* y) {
  uint8_t idx[kMaxCodecDim];
  const int d = codec.dim();
  const float* level = codec.levels();
  for (int t = 0; t < n; ++t) {
    const float norm = codec.unpack(block, t, idx);
    float* yt = y + static_cast<size_t>(t) * d;
    for (int j = 0; j < d; ++j) yt[j] = norm * level[idx[j]];
  }
}

/// acc[i * d + j] += w[i * T + t] ||x_t|| level[idx_tj] for tokens t < n.
template <class LevelCodec>
void accumulate_levels(const LevelCodec& codec, const float* w, int n_q, const uint8_t* block, int n, float* acc) {
  uint8_t idx[kMaxCodecDim];
  const int d = codec.dim();
  const float* level = codec.levels();
  for (int t = 0; t < n; ++t) {
    const float norm = codec.unpack(block, t, idx);
    for (int i = 0; i < n_q; ++i) {
      const float a = w[static_cast<size_t>(i) * codec.block_tokens() + t] * norm;
      float* ai = acc + static_cast<size_t>(i) * d;
      for (int j = 0; j < d; ++j) ai[j] += a * level[idx[j]];
    }
  }
}

}  // namespace kvq

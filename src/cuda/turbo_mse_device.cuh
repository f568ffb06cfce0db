// The turbo_mse stage of the append kernels (src/codec/turbo_mse.cpp, split_norm of src/codec/turbo_parts.cpp),
// shared by the turbo_mse, turbo_prod and turbo_rvq encoders: per token the norm (lane_norm.hpp's order, four lanes per
// token: row_norm.cuh; stored as fp16), u = x / ||x|| in double rounded to float (unit_quotient.hpp: a product by the
// token's reciprocal), rotated (rotate_page, or the caller's passes), and each coordinate's index = the number of
// Lloyd–Max boundaries below it (LevelBoundaries). The same values as the CPU, so bit-exact wherever the rotation is
// (Hadamard).
#pragma once

#include <cstdint>

#include "codec/turbo_parts.hpp"
#include "codec/unit_quotient.hpp"
#include "cuda/boundary_search.cuh"
#include "cuda/device_half.cuh"
#include "cuda/encode_kernel.cuh"
#include "cuda/encode_passes.cuh"
#include "cuda/rotate_device.cuh"
#include "cuda/row_norm.cuh"

namespace kvq::cuda::detail {

constexpr int kTurboMaxBoundaries = 15;  // 4 bits

/// A scalar codebook's decision thresholds (FloatCodebook::boundaries).
struct LevelBoundaries {
  float at[kTurboMaxBoundaries] = {};
  int bits = 3;
  /// The index of the centroid nearest to v (FloatCodebook::nearest: the number of boundaries below v).
  __device__ uint32_t index(float v) const {
    uint32_t idx = 0;
    for (int k = 0; k < (1 << bits) - 1; ++k) idx += v > at[k];
    return idx;
  }
  /// The same by binary search, the width a constant (Bits == bits).
  template <int Bits>
  __device__ BoundarySearch<Bits> search() const {
    return BoundarySearch<Bits>(at);
  }
};

inline LevelBoundaries level_boundaries(const FloatCodebook& book) {
  LevelBoundaries b;
  for (size_t k = 0; k < book.boundaries().size(); ++k) b.at[k] = book.boundaries()[k];
  b.bits = book.bits();
  return b;
}

/// A token's norm and its reciprocal rounded to nearest, in shared memory (one 16-byte load; every encoder's scratch
/// places them at a multiple of 16 bytes).
struct alignas(16) TokenNorm {
  double norm, inverse;
};

struct TurboMseStage {
  RotationView rot;
  LevelBoundaries book;
  uint32_t norms_offset = 0;  ///< the fp16 norms' section in the block

  /// Shared floats of T tokens' TokenNorms.
  __host__ __device__ static size_t norms_floats(int T) { return static_cast<size_t>(T) * sizeof(TokenNorm) / 4; }

  /// norms[t] = ||x_t|| in double and its reciprocal for the T rows of x, its fp16 into the block; a norm beyond
  /// fp16 is reported.
  __device__ void store_norms(const EncodeContext& ctx, const float* x, TokenNorm* norms, uint32_t* block) const {
    for_each_row_norm(x, ctx.T, ctx.d, ctx.d, [&](int t, double norm) {
      norms[t] = {norm, __drcp_rn(norm)};
      if (!(norm <= 65504.0)) {
        ctx.report(t, 0);
        return;
      }
      put_half(block, norms_offset + 2 * t, to_f16_bits(__double2float_rn(norm)));
    });
  }

  /// Shared floats rotate_page needs beyond the tile: none (Hadamard), or a pass of rows (dense).
  __host__ __device__ size_t spare_floats(int T, int d) const {
    return rot.hadamard() ? 0 : static_cast<size_t>(encode_pass_rows(T, d)) * d;
  }

  /// Rotates the T rows of x in place: all at once (Hadamard), or a pass of rows at a time through `spare` (dense),
  /// so that a dense rotation needs no second page of shared memory.
  __device__ void rotate_page(const EncodeContext& ctx, float* x, float* spare) const {
    const int T = ctx.T, d = ctx.d, P = rot.hadamard() ? T : encode_pass_rows(T, d);
    for (int t0 = 0; t0 < T; t0 += P) rotate_rows(rot, x + t0 * d, spare, P < T - t0 ? P : T - t0, d, ctx.dd);
  }

  /// The stored norm of a token as decode reads it (fp16 to float).
  __device__ static float stored_norm(double norm) { return f16_bits_to_float(to_f16_bits(__double2float_rn(norm))); }

  /// u[i] = x[i] / ||x_t|| for the first n elements of rows of d (norms of those rows), 0 for a zero vector; u may
  /// be x.
  __device__ static void normalize(const FastDiv& dd, const float* x, const TokenNorm* norms, float* u, int n) {
    for (int i = threadIdx.x; i < n; i += blockDim.x) {
      const TokenNorm s = norms[dd.div(i)];
      u[i] = s.norm == 0 ? 0.0f : unit_quotient(x[i], s.norm, s.inverse);
    }
  }
};

/// A stage of `book`'s boundaries (the codec's own fp16-rounded codebook), its norms at `norms_offset`.
inline TurboMseStage turbo_mse_stage(const RotationView& rot, const FloatCodebook& book, size_t norms_offset) {
  TurboMseStage s;
  s.rot = rot;
  s.book = level_boundaries(book);
  s.norms_offset = static_cast<uint32_t>(norms_offset);
  return s;
}

/// ORs token t, channel c's b-bit index into a layout::LaneCodes section at the block's start (its parts: the low
/// bits, then the rest).
__device__ __forceinline__ void put_lane_index(uint32_t* block, bool key, int d, int bits, int t, int c, uint32_t idx) {
  for (int p = 0; p < (bits == 3 ? 2 : 1); ++p) {
    const CodePlace at = lane_codes_place(key, d, bits, t, c, p);
    put_bits(block, at, idx & ((1u << at.width) - 1));
    idx >>= at.width;
  }
}

}  // namespace kvq::cuda::detail

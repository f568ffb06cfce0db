// Encoders that need a work copy of the page's rows beyond the tile (turbo_prod's residual, vecinfer's smoothed and
// decoded rows) take the page in passes of a few rows, so that their shared memory beyond the tile stays small at
// any T (a page of T = 128 tokens at d = 256 fills 128 KB of the 200 KB by itself).
#pragma once

namespace kvq::cuda::detail {

constexpr int kPassFloats = 4096;  // a pass's rows x d: 16 KB per work buffer

/// The rows of one pass over a page of T tokens of d channels.
__host__ __device__ inline int encode_pass_rows(int T, int d) {
  const int rows = kPassFloats / d > 0 ? kPassFloats / d : 1;
  return rows < T ? rows : T;
}

}  // namespace kvq::cuda::detail

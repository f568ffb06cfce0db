// Matrix-matrix products for a chunk of positions: Y = X W^T with W [rows][cols] in a ggml format read in place.
// W is dequantized a tile of kTileRows rows at a time (so each weight is read once per chunk, not once per
// position) and multiplied from a transposed fp32 copy of the tile, a few positions per register block.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "attention/isa.hpp"
#include "kvq/model.hpp"

namespace kvq::detail {

constexpr int kTileRows = 16;

/// y[i * ldy + r] = sum_c x[i * w.cols + c] * W[r][c] for the n positions i and the rows r of tiles
/// [tile_begin, tile_end) (tile t: rows t * kTileRows .. min((t+1) * kTileRows, w.rows) - 1), by the kernels of
/// `isa` (the caller's choice, as for its other weight kernels; equal results on every one). scratch: per-caller
/// buffer, grown as needed.
void multiply_tiles(const WeightMatrix& w, int64_t tile_begin, int64_t tile_end, const float* x, int n, float* y,
                    size_t ldy, std::vector<float>& scratch, Isa isa);

inline int64_t tile_count(const WeightMatrix& w) { return (w.rows + kTileRows - 1) / kTileRows; }

}  // namespace kvq::detail

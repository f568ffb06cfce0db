// The append path's kernels besides the encoders, each one launch for every sequence of a batch: the key offsets of
// centered keys, the gather that moves the streams' unencoded tokens toward the fp32 windows (checking the fresh
// ones for NaN and Inf on the way), and the commit's moves (scratch tokens into windows, page ids into block tables).
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

#include "cuda/device_encoder.hpp"

namespace kvq::cuda::detail {

/// Sequences of one batch at most: the launches put them on the grid's y dimension.
constexpr size_t kMaxAppendBatch = 65535;

/// A sequence whose first page the append encodes (centered keys): offset[h][c] = the mean of its key stream's
/// first T keys of head h (window tokens, then fresh ones), summed in token order in fp32 as
/// src/cache/key_offset.hpp does. The stream's offset is ignored.
struct KeyMean {
  uint32_t stream = 0;
  float* offset = nullptr;  ///< [H][d]
};

/// Stream tokens [first, first + count) of one sequence, keys and values, centered as an encoder reads them, into
/// dst: keys [H][stride][d] from slot `slot`, the values behind them (dst + H * stride * d). dst must not overlap
/// the window tokens the stream reads.
struct WindowGather {
  uint32_t stream = 0;
  uint32_t first = 0, count = 0;
  float* dst = nullptr;
  int stride = 0, slot = 0;
};

/// The commit's move of `count` gathered tokens of each of the 2H rows (keys, then values) of `from`
/// ([2H][count][d]) into the first slots of a window ([2H][slots][d]).
struct WindowMove {
  const float* from = nullptr;
  float* to = nullptr;
  int count = 0;
};

/// Every key mean of the batch (n of them, device array; entries with a null offset are empty).
void launch_key_means(const EncodeSource& keys, const KeyMean* means, size_t n, cudaStream_t stream);

/// Every gather of the batch (n, device array; max_count: the largest count). A NaN or Inf among the fresh tokens
/// lowers nonfinite[0] (keys) or nonfinite[1] (values) to its flat index in the role's src.fresh_base.
void launch_gather_windows(const EncodeSource& keys, const EncodeSource& values, const WindowGather* gathers, size_t n,
                           size_t max_count, unsigned long long* nonfinite, cudaStream_t stream);

/// Every window move of the commit (n, device array; max_count: the largest count).
void launch_move_windows(const WindowMove* moves, size_t n, size_t max_count, int H, int slots, int d,
                         cudaStream_t stream);

/// The commit's block table entries: page p's target goes to table_ends[pages[p].stream][pages[p].first / T] (each
/// table_ends[i]: the first unused entry of sequence i's device block table; entries of kNoStream are empty).
void launch_place_page_ids(const EncodePage* pages, size_t n, PageId* const* table_ends, int T, cudaStream_t stream);

}  // namespace kvq::cuda::detail

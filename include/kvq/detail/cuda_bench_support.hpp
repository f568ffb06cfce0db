// What the device benchmarks (kvq bench attention/append --device cuda) and the GPU tests need beyond the API:
// device timing, the copy bandwidth their figures are compared with, and large caches built from a few pages.
#pragma once

#include <cstddef>
#include <functional>

#include "kvq/cuda.hpp"

namespace kvq::cuda {

/// A new sequence of n_tokens tokens (a multiple of T) in every layer where src holds pages, repeating src's pages
/// cyclically, copied device to device into fresh pages (src: whole pages, empty windows): a cache of distinct
/// memory as large as a benchmark needs from a few encoded pages.
SeqId add_sequence_repeating(KVCache& cache, SeqId src, size_t n_tokens);

/// Median device time in milliseconds of `reps` runs of `work` (CUDA events around each, after `warmup` runs).
double median_ms(const std::function<void()>& work, int reps, int warmup = 3);
/// The device's copy bandwidth in GB/s (bytes read + bytes written per second), device-to-device copies of
/// `bytes`, median of `reps`.
double copy_bandwidth_gbps(size_t bytes, int reps, int device = 0);

}  // namespace kvq::cuda

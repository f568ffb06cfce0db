// What KVCache (cache.hpp) calls for a CUDA cache, declared without CUDA's headers: src/cuda/device_cache.cpp
// implements it over the device store (src/cuda/device_store.hpp), src/cuda/without_cuda.cpp throws naming why
// there is no backend. The bookkeeping stays KVCache's; these move pages, windows and key offsets on the device.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>

#include "kvq/cache.hpp"

namespace kvq::cuda::detail {

struct Backend {
  /// The device pool and append kernels of a cache whose codecs and layout are built (cache.cuda_).
  static void open(KVCache& cache, int device);
  /// A CUDA cache's device store (src/cuda).
  static DeviceStore& store(KVCache& cache);
  /// The cache moved to a new address (its device store points back at it).
  static void moved(KVCache& cache) noexcept;
  /// A new sequence under `id`, its layers' device tables and windows allocated.
  static void add_sequence(KVCache& cache, SeqId id);
  /// KVCache::append from host memory.
  static void append(KVCache& cache, SeqId seq, int layer, const float* keys, const float* values, size_t n_tokens);
  /// KVCache::append_device_batch; `who` names the caller in errors.
  static void append_batch(KVCache& cache, const char* who, std::span<const SeqId> seqs, int layer,
                           const float* keys_dev, const float* values_dev, std::span<const size_t> n_tokens,
                           void* stream);
  static LayerView view(const KVCache& cache, SeqId seq, int layer);
  static const uint8_t* pool(const KVCache& cache);
  /// The device windows' and key offsets' bytes.
  static void add_memory(const KVCache& cache, CacheMemory& m);
  /// After train_layer: the layer's append kernels take the trained state.
  static void trained(KVCache& cache, int layer);
  /// Fills the empty CUDA cache `dev` (same configuration and codecs) with the CPU cache `host`'s sequences.
  static void upload(KVCache& dev, const KVCache& host);
  /// Waits for the cache's device: every append's commit, queued on any stream, done.
  static void synchronize(const KVCache& cache);
  /// A host copy of a layer of a CUDA cache: its window (every slot), window count and key offset; no pages.
  static KVCache::LayerState host_layer(const KVCache& cache, const KVCache::LayerState& layer);
  /// Copies `bytes` of the cache's device memory at `from` to host memory at `to`.
  static void copy_to_host(const KVCache& cache, void* to, const void* from, size_t bytes);
};

}  // namespace kvq::cuda::detail

// A CUDA KVCache's device part (cache.hpp), shared by the files of the device cache: device_cache.cpp (the cache's
// device side, its appends) and decode_step.cpp (decode steps of a fixed shape). Pages live in one cudaMalloc'd
// pool with the CPU's layout; block tables, fp32 windows and key offsets in device memory. The bookkeeping (page
// lists, window counts, the free list, the sequences) is the KVCache's own, reached through `cache`.
#pragma once

#include <cuda_runtime.h>

#include <memory>
#include <span>
#include <string>
#include <vector>

#include "cuda/append_kernels.hpp"
#include "cuda/append_plan.hpp"
#include "cuda/device_encoder.hpp"
#include "cuda/device_memory.hpp"
#include "kvq/cache.hpp"
#include "kvq/cuda.hpp"
#include "kvq/detail/page_table.hpp"

namespace kvq::cuda {

namespace detail {

// The batch's descriptors in one buffer: byte offsets of each array, 16-byte aligned.
struct StagingLayout {
  size_t key_streams = 0, value_streams = 0, pages = 0, table_ends = 0, gathers = 0, means = 0, moves = 0, bytes = 0;

  template <class T>
  size_t place(size_t n) {
    const size_t at = bytes;
    bytes = (bytes + n * sizeof(T) + 15) / 16 * 16;
    return at;
  }
  StagingLayout(size_t seqs, size_t pages_n, size_t gathers_n, size_t means_n, size_t moves_n) {
    key_streams = place<detail::EncodeStream>(seqs);
    value_streams = place<detail::EncodeStream>(seqs);
    pages = place<detail::EncodePage>(pages_n);
    table_ends = place<PageId*>(seqs);
    gathers = place<detail::WindowGather>(gathers_n);
    means = place<detail::KeyMean>(means_n);
    moves = place<detail::WindowMove>(moves_n);
  }
};

template <class T>
T* at(uint8_t* base, size_t offset) {
  return reinterpret_cast<T*>(base + offset);
}

/// One batched append's launches: the descriptors (device arrays) and how many of each.
struct AppendLaunch {
  EncodeSource keys, values;
  const EncodePage* pages = nullptr;
  size_t n_pages = 0;
  const WindowGather* gathers = nullptr;
  size_t n_gathers = 0, max_gather = 0;
  const KeyMean* means = nullptr;
  size_t n_means = 0;
  const WindowMove* moves = nullptr;
  size_t n_moves = 0, max_move = 0;
  PageId* const* table_ends = nullptr;
};

}  // namespace detail

using detail::AppendLaunch;
using detail::device_alloc;
using detail::DevicePtr;
using detail::StagingLayout;

namespace detail {

/// One (sequence, layer) of a CUDA cache on the device.
struct DeviceLayer {
  DevicePtr<PageId> pages;  // the block table, pages_capacity entries (KVCache::LayerState::pages its host copy)
  size_t pages_capacity = 0;
  DevicePtr<float> window;      // keys [H][slots][d], then values
  DevicePtr<float> key_offset;  // centered keys (cache.hpp): [H][d] once the first page is encoded
  bool has_offset = false;
  DevicePtr<uint16_t> sinks;  // f16 sink tokens: a copy of KVCache::LayerState::sinks, laid out as it is
  size_t sink_halves = 0;     // its size
};

struct DeviceStore {
  using Layer = KVCache::LayerState;
  using Sequence = KVCache::Sequence;

  KVCache* cache = nullptr;  // the owner (Backend::moved re-points it)
  int device = 0;
  DevicePtr<uint8_t> pool;
  // The append kernels of each layer's codecs (null: none, for the reason in *_why).
  std::vector<std::unique_ptr<detail::DeviceEncoder>> key_encoders, value_encoders;
  std::vector<std::string> key_why, value_why;
  // Scratch of the append path: uploaded host tokens, the batch's descriptors (pinned, uploaded in one copy), the
  // tokens gathered for windows whose used slots the append still reads, error positions.
  DevicePtr<float> upload;
  size_t upload_capacity = 0;
  std::unique_ptr<uint8_t[], detail::CudaFreeHost> staging_host;  // pinned
  DevicePtr<uint8_t> staging_dev;
  size_t staging_capacity = 0;
  DevicePtr<float> window_scratch;
  size_t window_scratch_capacity = 0;
  DevicePtr<unsigned long long> errors;
  std::unique_ptr<unsigned long long[], detail::CudaFreeHost> found;  // pinned copy of errors

  // The owner's bookkeeping.
  const CacheConfig& config() const { return cache->config_; }
  const kvq::detail::PageLayout& layout() const { return cache->layout_; }
  kvq::detail::FreePages& free() const { return cache->free_; }
  kvq::detail::SequenceTable<Layer>& sequences() const { return cache->sequences_; }
  std::vector<std::unique_ptr<Codec>>& key_codecs() const { return cache->key_codecs_; }
  std::vector<std::unique_ptr<Codec>>& value_codecs() const { return cache->value_codecs_; }

  /// The store of `owner` (codecs and layout built) on `dev`: the pool, the append kernels, the error flags.
  DeviceStore(KVCache& owner, int dev);
  /// The layer's append kernels, built again from its codecs (after training).
  void build_encoders(size_t layer);
  size_t slots() const { return static_cast<size_t>(config().residual_tokens + config().block_tokens - 1); }
  size_t window_floats() const {
    return 2 * static_cast<size_t>(config().n_kv_heads) * slots() * static_cast<size_t>(config().head_dim);
  }
  void check_layer(int layer) const { cache->check_layer(layer); }
  Sequence& insert(SeqId id) {
    std::vector<Layer> layers(static_cast<size_t>(config().n_layers));
    // Block tables start with room for 128 pages, so that appends rarely reallocate (a synchronizing cudaMalloc).
    const size_t table = std::min<size_t>(128, config().capacity_pages);
    for (Layer& l : layers) {
      l.device.reset(new DeviceLayer);
      l.device->pages = device_alloc<PageId>(table, "a block table");
      l.device->pages_capacity = table;
      l.device->window = device_alloc<float>(window_floats(), "a sequence's fp32 window");
      KVQ_CUDA_CHECK(cudaMemset(l.device->window.get(), 0, window_floats() * sizeof(float)));
    }
    return sequences().insert(id, std::move(layers));
  }
  uint8_t* page(PageId id) const { return pool.get() + static_cast<size_t>(id) * layout().page_bytes; }
  // Room for `need` entries in the layer's device block table. Growing it waits for the device: an append's
  // commit, queued on the caller's stream, may still be writing entries of the old table.
  void reserve_table(Layer& l, size_t need) {
    if (need > l.device->pages_capacity) {
      KVQ_CUDA_CHECK(cudaDeviceSynchronize());
      const size_t cap = std::max<size_t>(need, 2 * l.device->pages_capacity);
      DevicePtr<PageId> grown = device_alloc<PageId>(cap, "a block table");
      if (!l.pages.empty())
        KVQ_CUDA_CHECK(cudaMemcpy(grown.get(), l.device->pages.get(), l.pages.size() * sizeof(PageId),
                                  cudaMemcpyDeviceToDevice));
      l.device->pages = std::move(grown);
      l.device->pages_capacity = cap;
    }
  }
  /// Moves the free list's next n pages to the end of the layer's block table, on the host and the device.
  void take_pages(Layer& l, size_t n) {
    reserve_table(l, l.pages.size() + n);
    const size_t first = l.pages.size();
    free().take(n, l.pages);
    if (n > 0)
      KVQ_CUDA_CHECK(cudaMemcpyAsync(l.device->pages.get() + first, l.pages.data() + first, n * sizeof(PageId),
                                     cudaMemcpyHostToDevice));
  }
  /// A host copy of the layer's window (every slot), window count, key offset and sinks.
  Layer host_layer(const Layer& l) const;
  void set_key_offset(Layer& l, const float* host) const {
    const size_t n = static_cast<size_t>(config().n_kv_heads) * config().head_dim;
    if (!l.device->key_offset) l.device->key_offset = device_alloc<float>(n, "a key offset");
    KVQ_CUDA_CHECK(cudaMemcpy(l.device->key_offset.get(), host, n * sizeof(float), cudaMemcpyHostToDevice));
    l.device->has_offset = true;
  }
  /// The layer's device sinks made a copy of its host sinks (regrown with them), queued on `stream`.
  void upload_sinks(Layer& l, cudaStream_t stream) const;
  /// KVCache::append for a codec without append kernels: encoded by the CPU codecs (KVCache::append_on_host).
  void append_on_host(Layer& ls, int layer, SeqId seq, const float* keys, const float* values, size_t n_tokens);
  void append_batch(const char* who, std::span<const SeqId> seqs, int layer, const float* keys_dev,
                    const float* values_dev, std::span<const size_t> n_tokens, cudaStream_t stream);

  // The stages of a batched append, shared by append_batch and DecodeStep (decode_step.cpp).
  /// Allocations for what the append writes: block table entries, key offsets (nothing a reader sees changes).
  void reserve_append(const detail::AppendPlan& plan, std::span<Layer* const> layers);
  /// The batch's descriptors, written into `host` at lay's offsets; the launch reads their copy at `dev`. fixed:
  /// every array one entry per sequence (DecodeStep's launches of one shape), entries without work left empty.
  AppendLaunch describe_append(const detail::AppendPlan& plan, std::span<Layer* const> layers, const float* keys_dev,
                               const float* values_dev, float* scratch, uint8_t* host, uint8_t* dev,
                               const StagingLayout& lay, bool fixed) const;
  /// Key offsets, pages (encoded into free pages) and the tokens that stay unencoded (gathered), NaN, Inf and
  /// values a codec cannot store noted in err[0..3] (keys' and values' nonfinite, keys' and values' storage).
  void launch_append(const AppendLaunch& a, int layer, unsigned long long* err, cudaStream_t stream) const;
  /// The commit on the device: the pages join the block tables, the windows take their gathered tokens.
  void launch_commit(const AppendLaunch& a, cudaStream_t stream) const;
  /// The commit of the bookkeeping: pages, window counts, key offsets, the free list.
  void commit_append(const detail::AppendPlan& plan, std::span<Layer* const> layers);

  // The sink tokens of a batched append (CacheConfig::sink_tokens): each chunk's first n_sink[i] tokens, downloaded
  // (keys [sum n_sink][H][d], then values) and checked on the host, then rounded and stored as the CPU stores them,
  // on the host and the device. Only a sequence's first appends have any.
  std::vector<float> download_sinks(const char* who, std::span<const SeqId> seqs, const float* keys_dev,
                                    const float* values_dev, std::span<const size_t> n_tokens,
                                    std::span<const size_t> n_sink, cudaStream_t stream) const;
  /// Room for them on the host and the device before anything is committed (the held ones kept, regrown), so that
  /// storing them after the commit allocates nothing.
  void reserve_sinks(std::span<Layer* const> layers, std::span<const size_t> n_sink, cudaStream_t stream) const;
  void commit_sinks(std::span<Layer* const> layers, std::span<const size_t> n_sink, const std::vector<float>& tokens,
                    cudaStream_t stream) const;
};

}  // namespace detail

using detail::DeviceLayer;
using detail::DeviceStore;

}  // namespace kvq::cuda

// The CUDA backend: whether this build has it and which devices the machine offers (built, device_count,
// unavailable_reason, device_name), and the KV cache and decode attention on a device, with the same codecs, block
// layout (src/codec/block_layout.hpp), pages and block tables as the CPU KVCache (cache.hpp) and the pages in one
// cudaMalloc'd pool on the device.
//
// Appends encode on the device: every codec's append kernel (src/cuda/encode_*.cu) rotates, quantizes and packs full
// pages straight into the pool, the same bytes as the CPU codecs write (bit-exact for f32/f16/bf16, kivi and qjl,
// and for int8/int4, turbo_mse, turbo_prod, turbo_rvq and vecinfer under the Hadamard rotation, the default for a
// power-of-two d; other rotations use their dense matrix, whose float order differs: the reconstruction error is
// within 1% of the CPU's). append_device_batch appends a chunk to each of many sequences of one layer (a decode
// step, or prefill chunks) in one set of launches with one check and one host round trip; append_device is the
// batch of one. The fp32 window and the key offsets live on the device. A codec without an append kernel (none is
// registered now) makes append_device(_batch) throw naming it; append from host memory encodes it on the CPU.
// to_host copies the cache back into a CPU KVCache.
//
// Decode attention runs on the device: the queries are mapped to the key codec's space, a split-K kernel fused for
// the (key codec, value codec) pair scores and sums the pages, and a merge kernel folds the splits, maps the result
// back from the value codec's space, adds the fp32 window and normalizes. A codec pair without a kernel is an
// error (decode_kernel names what would run).
//
// Builds without the CUDA backend provide these declarations too: built() is false, device_count() 0, and every
// constructor and call on a device throws kvq::Error naming the reason (unavailable_reason()). Thread safety: as
// KVCache; a DecodePlan holds its own device workspace. Appends share the cache's device scratch: appends on
// different streams must be ordered by the caller.
#pragma once

#include <cstddef>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kvq/attention.hpp"
#include "kvq/cache.hpp"

namespace kvq::cuda {

/// Whether this build has the CUDA backend (CMake option KVQ_CUDA).
bool built();
/// Number of usable CUDA devices: 0 without the backend, a driver or a GPU.
int device_count();
/// Why no device can be used ("" when one can): the build, the driver's error, or no GPU.
std::string unavailable_reason();
/// Name and compute capability of a device, e.g. "NVIDIA H200 (sm_90)". Throws kvq::Error without one.
std::string device_name(int device = 0);

namespace detail {
struct DecodeTables;
}

/// A float array in device memory (cudaMalloc), for queries and outputs.
class DeviceFloats {
 public:
  explicit DeviceFloats(size_t n, int device = 0);
  ~DeviceFloats();
  DeviceFloats(DeviceFloats&&) noexcept;
  DeviceFloats& operator=(DeviceFloats&&) noexcept;
  DeviceFloats(const DeviceFloats&) = delete;
  DeviceFloats& operator=(const DeviceFloats&) = delete;

  float* data() { return data_; }
  const float* data() const { return data_; }
  size_t size() const { return size_; }
  void upload(std::span<const float> host);  ///< host.size() == size()
  std::vector<float> download() const;
  void fill(float value);

 private:
  float* data_ = nullptr;
  size_t size_ = 0;
};

/// Where one (sequence, layer) lives on the device, for the kernels.
struct DeviceLayerView {
  const PageId* pages = nullptr;  ///< device block table, n_pages entries
  size_t n_pages = 0;
  const float* window = nullptr;  ///< device fp32 window: keys [H][slots][d], then values [H][slots][d]
  int window_count = 0;
};

class DeviceKVCache {
 public:
  /// An empty cache with fresh codecs (the same seeds as KVCache(config)); allocates the device pool.
  explicit DeviceKVCache(const CacheConfig& config, int device = 0);
  /// A device copy of a CPU cache: its codecs (trained state included), sequences, pages and windows.
  /// capacity_pages: the device pool's size (0: the host cache's capacity).
  explicit DeviceKVCache(const KVCache& host, size_t capacity_pages = 0, int device = 0);
  ~DeviceKVCache();
  DeviceKVCache(DeviceKVCache&&) noexcept;
  DeviceKVCache& operator=(DeviceKVCache&&) noexcept;

  const CacheConfig& config() const;
  int device() const;
  const Codec& key_codec(int layer) const;
  const Codec& value_codec(int layer) const;

  SeqId add_sequence();
  void remove_sequence(SeqId seq);
  bool has_sequence(SeqId seq) const;
  std::vector<SeqId> sequences() const;  ///< live sequence ids in increasing order
  size_t length(SeqId seq, int layer) const;
  /// Appends tokens from host memory, [n_tokens][n_kv_heads][head_dim] each, as KVCache::append: uploaded, then
  /// append_device (codecs without append kernels: encoded on the host); synchronized. Throws before modifying
  /// anything on any error.
  void append(SeqId seq, int layer, const float* keys, const float* values, size_t n_tokens);
  /// Appends tokens already in device memory (16-byte aligned, [n_tokens][n_kv_heads][head_dim] fp32 each): the
  /// batch of one sequence (append_device_batch).
  void append_device(SeqId seq, int layer, const float* keys_dev, const float* values_dev, size_t n_tokens,
                     void* stream = nullptr);
  /// Appends one chunk to each of several sequences of one layer in one call, as one append per sequence would
  /// (the same pages, taken from the pool in the order of `seqs`, and windows). keys_dev and values_dev: the chunks
  /// concatenated in the order of `seqs`, [sum of n_tokens][n_kv_heads][head_dim] fp32 in device memory, 16-byte
  /// aligned: sequence seqs[i]'s n_tokens[i] tokens start at token n_tokens[0] + ... + n_tokens[i - 1] (a decode
  /// step: one token per sequence, the step's rows as they come). Full pages of every sequence are encoded by the
  /// append kernels into the pool (one launch per encoder kind for the whole batch), the rest goes to the device
  /// windows. Throws kvq::Error before modifying any sequence: an unknown or repeated sequence, a NaN or Inf
  /// (naming sequence, token, head and channel), a value the codec cannot store, an exhausted pool, or a codec
  /// without append kernels (naming it). Waits once for all the checks on `stream` (a cudaStream_t; null: the
  /// default stream); the commit (block table entries, window moves) is queued on it, so the inputs may be reused
  /// once the call returns.
  void append_device_batch(std::span<const SeqId> seqs, int layer, const float* keys_dev, const float* values_dev,
                           std::span<const size_t> n_tokens, void* stream = nullptr);
  /// A CPU copy of the cache: the same configuration, codecs (trained state included), sequences (ids, pages byte
  /// for byte, windows, key offsets) and next sequence id; page ids may differ. Waits for the device's queued work.
  /// capacity_pages: the host pool's size (0: this cache's capacity).
  KVCache to_host(size_t capacity_pages = 0) const;

  size_t page_bytes() const;
  size_t key_block_offset(int head) const;
  size_t value_block_offset(int head) const;
  size_t residual_slots() const;  ///< R + T - 1: window slots per kv head
  size_t free_pages() const;
  size_t capacity_pages() const;
  const uint8_t* device_pool() const;
  DeviceLayerView view(SeqId seq, int layer) const;

 private:
  friend SeqId add_sequence_repeating(DeviceKVCache& cache, SeqId src, size_t n_tokens);  // detail/cuda_bench_support
  friend class DecodeStep;

  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// What decode attention runs for a layer's codec pair, e.g. "cuda_int4_int4_fast" (int keys on the integer path,
/// KVQ_ATTENTION=fast, the default) or "cuda_int4_int4" (KVQ_ATTENTION=exact); throws kvq::Error for a pair (or
/// head dimension) without a CUDA kernel, or int4 keys in groups of 16 channels under KVQ_ATTENTION=exact.
std::string decode_kernel(const DeviceKVCache& cache, int layer);

/// One batch of sequences prepared for repeated decode steps: the block-table descriptors and the split-K
/// workspace live on the device. Valid until the sequences change (append, remove). A sliding window
/// (AttentionOptions::window) is placed when the plan is made, from each sequence's length then.
class DecodePlan {
 public:
  DecodePlan(const DeviceKVCache& cache, int layer, std::span<const SeqId> seqs, int n_q_heads,
             const AttentionOptions& options = {});
  ~DecodePlan();
  DecodePlan(DecodePlan&&) noexcept;
  DecodePlan& operator=(DecodePlan&&) noexcept;

  /// q_dev, out_dev: device arrays [seqs][n_q_heads][head_dim] (fp32). stream: a cudaStream_t (null: default).
  void run(const float* q_dev, float* out_dev, void* stream = nullptr) const;
  /// The split kernel's ranges per (sequence, kv head), not counting the window-start variant's (one block's ranges
  /// over the page a sliding window starts inside).
  int splits() const;

 private:
  friend class DecodeStep;
  // DecodeStep's plans: a grid for n_seqs sequences of up to max_pages pages, their tables read from `tables`.
  DecodePlan(const DeviceKVCache& cache, int layer, int n_seqs, int n_q_heads, const AttentionOptions& options,
             size_t max_pages, const detail::DecodeTables& tables);
  void enqueue(const float* q_dev, float* out_dev, void* stream) const;  // launches only: capturable

  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// Decode steps of a fixed batch in a form a CUDA graph can capture and replay: each step appends one token per
/// sequence to each of `layers` and attends the sequences' queries there, with every launch's shape fixed when the
/// step is made (for sequences of up to max_tokens tokens) and every length, page and window read from device
/// tables that prepare() rewrites before each step. A step gives what append_device_batch then decode_attention
/// give, bit for bit.
///
/// Per step: prepare() (outside any capture), then run() once for each of `layers`, in any order (the runs may be
/// a replayed graph). prepare() takes the step's pages from the pool and records the step in the cache's
/// bookkeeping (lengths, block tables, windows) before the runs write them: between prepare() and the step's runs
/// the cache's sequences must not change otherwise. The value checks of an append (NaN, Inf, values a codec cannot
/// store) run on the device within the step and are reported by the second prepare() after it, or by check(): the
/// sequences are then invalid (their windows hold what was appended) and every later prepare() throws.
class DecodeStep {
 public:
  /// options: one per entry of `layers` (scale, window, splits as decode_attention takes them). The cache must
  /// outlive the step.
  DecodeStep(DeviceKVCache& cache, std::span<const SeqId> seqs, std::span<const int> layers, int n_q_heads,
             std::span<const AttentionOptions> options, size_t max_tokens);
  ~DecodeStep();
  DecodeStep(DecodeStep&&) noexcept;
  DecodeStep& operator=(DecodeStep&&) noexcept;

  /// Makes room for the next step and uploads its tables, queued on `stream` (a cudaStream_t; null: default), the
  /// stream the runs go to. Throws kvq::Error, changing nothing, where the pool lacks the step's pages or a
  /// sequence would pass max_tokens, or for an error an earlier step found. Waits for the step before last.
  void prepare(void* stream = nullptr);
  /// Layer `layer`'s part of the prepared step: keys, values [seqs][n_kv_heads][head_dim] (16-byte aligned), q, out
  /// [seqs][n_q_heads][head_dim], fp32 device arrays, read and written by the launches (a captured graph reads the
  /// arrays it was captured with). Launches only (no allocation, no wait): capturable.
  void run(int layer, const float* keys_dev, const float* values_dev, const float* q_dev, float* out_dev,
           void* stream = nullptr);
  /// Waits for `stream` and throws for an error any step so far found.
  void check(void* stream = nullptr);
  /// Steps prepared so far.
  size_t steps() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// decode_attention (attention.hpp) on the device: one plan, one run, synchronized.
void decode_attention(const DeviceKVCache& cache, int layer, std::span<const SeqId> seqs, const float* q_dev,
                      float* out_dev, int n_q_heads, const AttentionOptions& options = {}, void* stream = nullptr);

}  // namespace kvq::cuda

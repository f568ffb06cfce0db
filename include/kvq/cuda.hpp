// The CUDA backend: whether this build has it and which devices the machine offers (built, device_count,
// unavailable_reason, device_name), float arrays in device memory, and decode steps a CUDA graph can capture. The
// cache itself is kvq::KVCache (cache.hpp) on Device::cuda(n): its pages live in one cudaMalloc'd pool with the
// CPU's block layout (src/codec/block_layout.hpp), appends encode on the device, and kvq::decode_attention and
// kvq::DecodePlan (attention.hpp) run there: the queries are mapped to the key codec's space, a split-K kernel fused
// for the (key codec, value codec) pair scores and sums the pages, and a merge kernel folds the splits, maps the
// result back from the value codec's space, adds the fp32 window and normalizes. A codec pair without a kernel is
// an error (attention_kernel names what would run).
//
// Builds without the CUDA backend provide these declarations too: built() is false, device_count() 0, and every
// constructor and call on a device throws kvq::Error naming the reason (unavailable_reason()).
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

/// Decode steps of a fixed batch in a form a CUDA graph can capture and replay: each step appends one token per
/// sequence to each of `layers` and attends the sequences' queries there, with every launch's shape fixed when the
/// step is made (for sequences of up to max_tokens tokens) and every length, page and window read from device
/// tables that prepare() rewrites before each step. A step gives what KVCache::append_device_batch then
/// decode_attention give, bit for bit.
///
/// Per step: prepare() (outside any capture), then run() once for each of `layers`, in any order (the runs may be
/// a replayed graph). prepare() takes the step's pages from the pool and records the step in the cache's
/// bookkeeping (lengths, block tables, windows) before the runs write them: between prepare() and the step's runs
/// the cache's sequences must not change otherwise. The value checks of an append (NaN, Inf, values a codec cannot
/// store) run on the device within the step and are reported by the second prepare() after it, or by check(): the
/// sequences are then invalid (their windows hold what was appended) and every later prepare() throws.
class DecodeStep {
 public:
  /// options: one per entry of `layers` (scale, window, splits as decode_attention takes them). cache: a CUDA
  /// cache (kvq::Error otherwise) that outlives the step and stays where it is (not moved from).
  DecodeStep(KVCache& cache, std::span<const SeqId> seqs, std::span<const int> layers, int n_q_heads,
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

}  // namespace kvq::cuda

// Decode attention planned on a CUDA cache's device, declared without CUDA's headers: kvq::DecodePlan (attention.hpp)
// holds one for a CUDA cache, cuda::DecodeStep one per layer. src/cuda/decode_attention.cu implements it,
// src/cuda/without_cuda.cpp throws.
#pragma once

#include <cstddef>
#include <memory>
#include <span>
#include <string>

#include "kvq/attention.hpp"
#include "kvq/cache.hpp"

namespace kvq::cuda::detail {

struct DecodeTables;

class DevicePlan {
 public:
  /// The batch `seqs` of a CUDA cache, as kvq::DecodePlan's arguments.
  DevicePlan(const KVCache& cache, int layer, std::span<const SeqId> seqs, int n_q_heads,
             const AttentionOptions& options);
  /// DecodeStep's plans: a grid for n_seqs sequences of up to max_pages pages, their tables read from `tables`.
  DevicePlan(const KVCache& cache, int layer, int n_seqs, int n_q_heads, const AttentionOptions& options,
             size_t max_pages, const DecodeTables& tables);
  ~DevicePlan();
  DevicePlan(DevicePlan&&) noexcept;
  DevicePlan& operator=(DevicePlan&&) noexcept;

  /// q_dev, out_dev: n_floats each, [seqs][n_q_heads][head_dim] in the cache's device memory (checked).
  void run(const float* q_dev, float* out_dev, size_t n_floats, void* stream) const;
  /// Launches only: capturable.
  void enqueue(const float* q_dev, float* out_dev, void* stream) const;
  int splits() const;
  /// The split kernel the layer's codec pair runs, e.g. "cuda_int4_int4"; throws for a pair without one.
  static std::string kernel(const KVCache& cache, int layer);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// Waits for `stream` (a cudaStream_t; null: the default stream) and throws for an error it ran into.
void synchronize(void* stream);

}  // namespace kvq::cuda::detail

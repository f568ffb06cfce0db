// Attention over a KVCache: decode (one new query token per sequence, several sequences per call) and causal
// prefill (a chunk of query positions of one sequence), plus the double-precision reference they are tested against.
//
// For each (sequence, kv head) the query heads of its GQA group are scored together: the encoded pages through the
// key codec's Scorer, an online softmax, and the value codec's accumulate in the value codec's space; the fp32
// residual window directly; one value_codec.from_space per query at the end. Split-K cuts the pages of the call
// into slices over the thread pool; the slices' partial AttnStates are merged.
//
// Kernels: the page loop runs either generic code through the codecs or a kernel fused for the (key codec, value
// codec) pair, compiled for each instruction set and chosen at run time (attention_kernel below).
//
// Empty context: a query that sees no token (a sequence of length 0) gets a zero output row, the rule of an empty
// AttnState (no error: a batch may hold a sequence that has not received its first token).
//
// Workers: ThreadPool, the optional pool an attention call (and the model runner) splits its work over.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <exception>
#include <limits>
#include <memory>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <type_traits>
#include <vector>

#include "kvq/cache.hpp"

namespace kvq {

/// A fixed set of worker threads for data-parallel loops: attention and the model's matrix products split their work
/// into tasks and wait for all of them. The calling thread works too (it is worker 0), so a pool of 1 starts no
/// thread and runs everything inline. Between loops the workers stay hot for a while (kSpin in thread_pool.cpp): a
/// forward pass runs a few loops per layer, microseconds apart, and a sleep and wake-up through the kernel costs
/// about as much as a loop; after kSpin without work they sleep, which frees the core for other processes.
class ThreadPool {
 public:
  /// A pool of `n_workers` >= 1 workers: the caller plus n_workers - 1 threads started here.
  explicit ThreadPool(int n_workers);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return n_workers_; }

  /// CPU seconds run so far by the threads started here (not the caller), read from their thread clocks, which
  /// count a running thread's time up to now: the process clock adds a thread running on another core only at the
  /// scheduler's next tick, so a call of a millisecond would miss most of its workers' time.
  double worker_cpu_seconds();

  /// Runs fn(task) or fn(task, worker) for every task < n_tasks and returns when all have finished. `worker` in
  /// [0, size()) names the worker running the task (for per-worker scratch); tasks are handed out in increasing
  /// order to whichever worker is free. If tasks throw, the tasks not yet started are skipped and the first
  /// exception is rethrown here. One caller thread at a time: a nested or concurrent call throws kvq::Error.
  template <class Fn>
  void parallel_for(size_t n_tasks, Fn&& fn) {
    auto call = [](void* ctx, size_t task, int worker) {
      Fn& f = *static_cast<std::remove_reference_t<Fn>*>(ctx);
      if constexpr (std::is_invocable_v<Fn&, size_t, int>) {
        f(task, worker);
      } else {
        f(task);
      }
    };
    run(n_tasks, const_cast<void*>(static_cast<const void*>(&fn)), call);
  }

 private:
  using Call = void (*)(void* ctx, size_t task, int worker);
  void run(size_t n_tasks, void* ctx, Call call);
  void work(int worker);
  void worker_loop(int worker);
  /// Returns once `ready()` holds: polls for a while, then sleeps on `cv` (whose notifier holds mutex_).
  template <class Ready>
  void wait_for(std::condition_variable& cv, Ready ready);

  int n_workers_;
  std::vector<std::thread> threads_;
  std::mutex mutex_;  // guards the sleeps on wake_ and done_, and error_
  std::condition_variable wake_, done_;
  // The current job: written by the caller before it increments generation_, read by workers after they see it.
  size_t n_tasks_ = 0;
  void* ctx_ = nullptr;
  Call call_ = nullptr;
  std::atomic<size_t> next_task_{0};  // next task to hand out
  std::atomic<int> busy_workers_{0};  // threads still working on the current generation
  std::atomic<uint64_t> generation_{0};
  std::atomic<bool> stop_{false};
  std::atomic<bool> running_{false};  // a parallel_for is in progress
  std::atomic<bool> failed_{false};   // a task of the current job threw: hand out no more
  std::exception_ptr error_;
};

/// Partial softmax attention of one query over a subset of the tokens (FlashInfer's state):
///   m = max_t s_t,  l = sum_t exp(s_t - m),  o = sum_t exp(s_t - m) v_t  (unnormalized).
/// o is a view owned elsewhere, in the original space or in a codec's space (merge is linear, so a state can be
/// mapped with from_space before it is normalized). Empty (no token yet): m = -inf, l = 0, o = 0.
struct AttnState {
  std::span<float> o;
  float m = -std::numeric_limits<float>::infinity();
  float l = 0;

  bool empty() const { return m == -std::numeric_limits<float>::infinity(); }
  /// Makes the state empty (o = 0).
  void reset();
  /// Folds in a state over other tokens (same dimension); either may be empty.
  void merge(const AttnState& other);
  /// o /= l: the attention output. An empty state gives zeros.
  void normalize();
};

struct AttentionOptions {
  float scale = 0;  ///< softmax scale; 0 means 1 / sqrt(head_dim)
  int splits = 0;   ///< split-K slices of the call's pages; 0 means one per worker of the pool
  /// Sliding-window attention: the query at position p sees only positions p - window + 1 .. p (Gemma's local
  /// layers, Mistral); 0 means every position up to p.
  size_t window = 0;

  /// The softmax scale of a call with head dimension d, after checking the options (kvq::Error for a NaN, Inf or
  /// negative scale, or negative splits). Both back ends take their scale from here.
  float resolved_scale(int head_dim) const;
};

/// Decode attention of one query token per sequence. q: [seqs.size()][n_q_heads][head_dim], n_q_heads a multiple
/// of the cache's n_kv_heads (query head j uses kv head j / (n_q_heads / n_kv_heads)); out: the same shape.
/// out = softmax(q K^T * scale) V over every token the sequence holds in `layer` (encoded pages + residual window).
/// The cache's device runs it: on a CPU cache q and out are host memory and `pool` the workers (null: the calling
/// thread); on a CUDA cache they are fp32 arrays in the cache's device memory, the call runs on `stream` (a
/// cudaStream_t; null: the default stream) and returns once it is done. A codec pair without a CUDA kernel, or
/// host arrays given to a CUDA cache, throw kvq::Error. It plans on every call (and, on a device, waits): a decode
/// loop makes one DecodePlan per batch and runs it at each step.
void decode_attention(const KVCache& cache, int layer, std::span<const SeqId> seqs, std::span<const float> q,
                      std::span<float> out, const AttentionOptions& options = {}, ThreadPool* pool = nullptr,
                      void* stream = nullptr);

/// Decode attention of one batch planned once and run at every step. On the CPU the batch's (sequence, kv head)
/// groups are made with the plan, and the scratch of a run (gathered queries, split-K states, the workers' buffers)
/// is kept for the next, so that a step allocates only when the sequences outgrow the last one; each run reads the
/// sequences as they are then (tokens appended between runs are attended). On a CUDA device the block-table
/// descriptors and the split-K workspace live on the device, valid until the sequences change (append, remove),
/// and a sliding window is placed from each sequence's length when the plan is made. Each run gives
/// decode_attention's output bit for bit. The cache and the pool must outlive the plan; one run at a time.
class DecodePlan {
 public:
  /// As decode_attention's arguments; throws kvq::Error for a bad layer, unknown sequence, n_q_heads that is not a
  /// multiple of the cache's kv heads, bad options, or (CUDA) a codec pair without a kernel.
  DecodePlan(const KVCache& cache, int layer, std::span<const SeqId> seqs, int n_q_heads,
             const AttentionOptions& options = {}, ThreadPool* pool = nullptr);
  ~DecodePlan();
  DecodePlan(DecodePlan&&) noexcept;
  DecodePlan& operator=(DecodePlan&&) noexcept;

  /// q, out: [seqs][n_q_heads][head_dim], in the cache's device memory. stream: a CUDA cache's cudaStream_t (null:
  /// the default stream), the run queued on it without waiting; unused on the CPU.
  void run(std::span<const float> q, std::span<float> out, void* stream = nullptr);
  /// CUDA caches: the split kernel's ranges per (sequence, kv head), not counting the window-start variant's; CPU
  /// caches: AttentionOptions::splits as given.
  int splits() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

/// Causal attention for n_queries consecutive positions start .. start + n_queries - 1 of one sequence, whose keys
/// and values are already appended to `layer`. q and out: [n_queries][n_q_heads][head_dim]; the query at position
/// p sees tokens 0..p. CPU caches.
void prefill_attention(const KVCache& cache, int layer, SeqId seq, size_t start, size_t n_queries,
                       std::span<const float> q, std::span<float> out, const AttentionOptions& options = {},
                       ThreadPool* pool = nullptr);

/// The kernel decode attention runs for `layer`. A CUDA cache: the split kernel of the codec pair, e.g.
/// "cuda_int4_int4_fast" (int keys on the integer path, KVQ_ATTENTION=fast) or "cuda_int4_int4" (exact); kvq::Error
/// for a pair or head dimension without one, or int4 keys in groups of 16 under KVQ_ATTENTION=exact. A CPU cache: the page-loop kernel of
/// decode_attention and prefill_attention on this CPU, "generic" (through the
/// codecs' Scorer and accumulate) or a kernel fused for the layer's codec pair, named fused_<key>_<value>_<isa>
/// (e.g. "fused_int4_int4_avx512vnni"). The environment variable KVQ_ISA=scalar|avx2|avx512|avx512vnni|avx512bf16
/// (x86) or KVQ_ISA=scalar|neon (AArch64) caps the instruction set; an unknown value, or one this CPU lacks, makes
/// this and every attention call throw kvq::Error. KVQ_ATTENTION=fast (the default) runs a fast kernel where the
/// instruction set has one for the pair, named with "_fast" after the ISA (int keys quantize the queries to 8-bit
/// digits, avx512bf16 sums int4 values with bf16 weights: docs/METHODS.md, "Fast attention kernels");
/// KVQ_ATTENTION=exact the kernels that match fp32 attention to 1e-5 (avx512bf16 has none of its own: avx512vnni's
/// run).
std::string attention_kernel(const KVCache& cache, int layer);
/// The instruction set the attention kernels use on this CPU under KVQ_ISA: "scalar", "avx2", "avx512",
/// "avx512vnni", "avx512bf16" or "neon".
std::string attention_isa();

/// The oracle, one head, in double precision with plain loops. q: n_q x d; k, v: n_tokens x d; out: n_q x d.
/// Query i sees the first min(first_visible + i, n_tokens) tokens: decode passes first_visible = n_tokens, a causal
/// chunk starting at position p passes p + 1. A query that sees no token gets zeros. magnitude (optional, n_q):
/// sum_t p_t |v_t|, the size of the weighted sum, which fp32 rounding errors of an attention output scale with.
void reference_attention(const float* q, size_t n_q, const float* k, const float* v, size_t n_tokens, int d,
                         size_t first_visible, double scale, float* out, double* magnitude = nullptr);

}  // namespace kvq

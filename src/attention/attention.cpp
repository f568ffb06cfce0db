// decode_attention, DecodePlan and prefill_attention: argument checks, then one QueryGroup per (sequence, kv head)
// (decode) or per kv head and chunk of positions (prefill).
#include "kvq/attention.hpp"

#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <vector>

#include "attention/attention_engine.hpp"
#include "attention/isa.hpp"
#include "attention/page_kernel.hpp"
#include "cuda/device_plan.hpp"
#include "kvq/error.hpp"

namespace kvq {
namespace {

// Prefill chunks are attended this many positions at a time, which bounds the scratch of one call.
constexpr size_t kPrefillPositions = 64;

int query_heads(const KVCache& cache, size_t rows, std::span<const float> q, std::span<float> out, const char* who) {
  const CacheConfig& cfg = cache.config();
  const size_t d = static_cast<size_t>(cfg.head_dim);
  KVQ_CHECK(q.size() == out.size(), who, ": q holds ", q.size(), " floats but out ", out.size());
  KVQ_CHECK(rows > 0 && q.size() % (rows * d) == 0, who, ": q holds ", q.size(), " floats, not a multiple of ", rows,
            " rows x head_dim ", d);
  const size_t hq = q.size() / (rows * d);
  KVQ_CHECK(hq >= static_cast<size_t>(cfg.n_kv_heads) && hq % static_cast<size_t>(cfg.n_kv_heads) == 0 && hq <= 65536,
            who, ": ", hq, " query heads is not a multiple of the cache's ", cfg.n_kv_heads, " kv heads");
  return static_cast<int>(hq);
}

}  // namespace

float AttentionOptions::resolved_scale(int head_dim) const {
  KVQ_CHECK(std::isfinite(scale) && scale >= 0, "attention: scale ", scale,
            " (need a finite value >= 0; 0 means 1/sqrt(d))");
  KVQ_CHECK(splits >= 0, "attention: splits = ", splits, " (need >= 0)");
  KVQ_CHECK(head_dim > 0, "attention: head dimension ", head_dim);
  return scale > 0 ? scale : 1.f / std::sqrt(static_cast<float>(head_dim));
}

void prefill_attention(const KVCache& cache, int layer, SeqId seq, size_t start, size_t n_queries,
                       std::span<const float> q, std::span<float> out, const AttentionOptions& options,
                       ThreadPool* pool) {
  KVQ_CHECK(cache.device().is_cpu(), "prefill_attention: a ", cache.device().str(),
            " cache; prefill runs on CPU caches (attend a copy: to(Device::cpu()))");
  const size_t length = cache.length(seq, layer);
  if (n_queries == 0 && q.empty() && out.empty()) return;
  KVQ_CHECK(start <= length && n_queries <= length - start, "prefill_attention: positions ", start, "..",
            start + n_queries - 1, " of sequence ", seq, ", which holds ", length, " tokens in layer ", layer,
            " (append the chunk's keys and values first)");
  const int hq = query_heads(cache, n_queries, q, out, "prefill_attention");
  const int H = cache.config().n_kv_heads, G = hq / H;
  const size_t d = static_cast<size_t>(cache.config().head_dim), row = static_cast<size_t>(hq) * d;
  std::vector<detail::QueryGroup> groups(static_cast<size_t>(H));
  for (size_t first = 0; first < n_queries; first += kPrefillPositions) {
    const size_t n = std::min(kPrefillPositions, n_queries - first);
    for (int h = 0; h < H; ++h) {
      const size_t offset = first * row + static_cast<size_t>(h * G) * d;
      groups[static_cast<size_t>(h)] = {
          seq, h, q.data() + offset, out.data() + offset, row, static_cast<int>(n), start + first + 1};
    }
    detail::run_attention(cache, layer, groups, G, options, pool);
  }
}

struct DecodePlan::Impl {
  std::optional<cuda::detail::DevicePlan> device;  // a CUDA cache's plan; the rest is the CPU's
  const KVCache* cache = nullptr;
  int layer = 0, G = 0;
  size_t n_seqs = 0, row = 0;  // row: floats of one sequence's queries
  AttentionOptions options;
  ThreadPool* pool = nullptr;
  std::vector<detail::QueryGroup> groups;  // q and out filled in by each run
  detail::AttentionEngine engine;
};

DecodePlan::DecodePlan(const KVCache& cache, int layer, std::span<const SeqId> seqs, int n_q_heads,
                       const AttentionOptions& options, ThreadPool* pool)
    : impl_(std::make_unique<Impl>()) {
  Impl& p = *impl_;
  if (cache.device().is_cuda()) {
    p.device.emplace(cache, layer, seqs, n_q_heads, options);
    return;
  }
  const CacheConfig& cfg = cache.config();
  cache.key_codec(layer);  // checks the layer
  options.resolved_scale(cfg.head_dim);
  KVQ_CHECK(n_q_heads > 0 && n_q_heads % cfg.n_kv_heads == 0 && n_q_heads <= 65536, "DecodePlan: ", n_q_heads,
            " query heads is not a multiple of the cache's ", cfg.n_kv_heads, " kv heads");
  for (const SeqId id : seqs) cache.length(id, layer);  // checks the sequence
  p.cache = &cache;
  p.layer = layer;
  p.G = n_q_heads / cfg.n_kv_heads;
  p.n_seqs = seqs.size();
  p.row = static_cast<size_t>(n_q_heads) * static_cast<size_t>(cfg.head_dim);
  p.options = options;
  p.pool = pool;
  for (const SeqId id : seqs)
    for (int h = 0; h < cfg.n_kv_heads; ++h)
      p.groups.push_back({id, h, nullptr, nullptr, p.row, 1, std::numeric_limits<size_t>::max()});
}

DecodePlan::~DecodePlan() = default;
DecodePlan::DecodePlan(DecodePlan&&) noexcept = default;
DecodePlan& DecodePlan::operator=(DecodePlan&&) noexcept = default;

int DecodePlan::splits() const { return impl_->device ? impl_->device->splits() : impl_->options.splits; }

void DecodePlan::run(std::span<const float> q, std::span<float> out, void* stream) {
  Impl& p = *impl_;
  if (p.device) {
    KVQ_CHECK(q.size() == out.size(), "DecodePlan::run: q holds ", q.size(), " floats and out ", out.size());
    return p.device->run(q.data(), out.data(), q.size(), stream);
  }
  KVQ_CHECK(q.size() == p.n_seqs * p.row && out.size() == q.size(), "DecodePlan::run: q holds ", q.size(),
            " floats and out ", out.size(), "; the plan's batch takes ", p.n_seqs * p.row, " ([", p.n_seqs,
            " sequences][query heads][head_dim])");
  if (p.n_seqs == 0) return;
  const size_t d = static_cast<size_t>(p.cache->config().head_dim);
  for (size_t i = 0; i < p.groups.size(); ++i) {
    const size_t s = i / static_cast<size_t>(p.cache->config().n_kv_heads);
    const size_t h = i % static_cast<size_t>(p.cache->config().n_kv_heads);
    const size_t offset = s * p.row + h * static_cast<size_t>(p.G) * d;
    p.groups[i].q = q.data() + offset;
    p.groups[i].out = out.data() + offset;
  }
  p.engine.run(*p.cache, p.layer, p.groups, p.G, p.options, p.pool);
}

void decode_attention(const KVCache& cache, int layer, std::span<const SeqId> seqs, std::span<const float> q,
                      std::span<float> out, const AttentionOptions& options, ThreadPool* pool, void* stream) {
  cache.key_codec(layer);  // checks the layer
  if (seqs.empty() && q.empty() && out.empty()) return;
  const int hq = query_heads(cache, seqs.size(), q, out, "decode_attention");
  DecodePlan plan(cache, layer, seqs, hq, options, pool);  // a plan run once
  plan.run(q, out, stream);
  if (cache.device().is_cuda()) cuda::detail::synchronize(stream);
}

std::string attention_kernel(const KVCache& cache, int layer) {
  if (cache.device().is_cuda()) return cuda::detail::DevicePlan::kernel(cache, layer);
  return detail::select_page_kernel(cache.key_codec(layer), cache.value_codec(layer), cache.config().block_tokens,
                                    detail::active_isa(), detail::active_precision())
      .name;
}

std::string attention_isa() { return detail::isa_name(detail::active_isa()); }

}  // namespace kvq

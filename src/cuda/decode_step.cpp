// DecodeStep (cuda.hpp): decode steps whose launches keep one shape, so that a CUDA graph can capture them
// once and replay them every step. The host does a step's bookkeeping in prepare() (plan_append for one token per
// sequence, the free list's pages, the commit of lengths and windows), writes every launch's descriptors and the
// decode kernels' tables into one pinned buffer and uploads it with one copy; run() only launches, with arrays sized
// for the whole batch whose empty entries do nothing (device_cache_impl.hpp: describe_append's fixed shape), reading
// the new keys and values from the caller's arrays (the launch's fresh_base), and a split-K grid made for max_tokens.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <optional>
#include <set>

#include "cache/key_offset.hpp"
#include "cuda/decode_tables.hpp"
#include "cache/cuda_backend.hpp"
#include "cuda/device_plan.hpp"
#include "cuda/device_store.hpp"
#include "cuda/encode_layout.cuh"
#include "cuda/window_start.hpp"
#include "kvq/error.hpp"

namespace kvq::cuda {

using detail::DecodeTables;
using detail::SeqPages;
using detail::WindowDesc;

struct DecodeStep::Impl {
  // One layer's part of the step: where its descriptors and tables lie in the staging buffer, its launches.
  struct LayerStep {
    int layer = 0;
    size_t at = 0;  // byte offset of its block in the staging buffer: append descriptors, then tables
    StagingLayout lay{0, 0, 0, 0, 0};
    size_t seqs_at = 0, windows_at = 0, starts_at = 0;  // the tables, from `at`
    AppendLaunch launch;
    AttentionOptions options;
    std::optional<detail::DevicePlan> plan;
  };

  DeviceStore* cache = nullptr;
  std::vector<SeqId> seqs;
  std::vector<LayerStep> steps_of;  // one per layer of the step
  std::vector<int> index;           // model layer -> its entry in steps_of, or -1
  size_t max_tokens = 0, hd = 0, prepared = 0;
  DevicePtr<float> scratch;  // the gathers' window scratch, shared by the layers (their runs are ordered)
  std::unique_ptr<uint8_t[], detail::CudaFreeHost> host;  // pinned
  DevicePtr<uint8_t> dev;
  size_t bytes = 0;
  DevicePtr<unsigned long long> errors;  // per layer of the step: 4 flags (append_batch's)
  std::unique_ptr<unsigned long long[], detail::CudaFreeHost> found;  // pinned copy of a step's flags
  size_t found_step = 0;                                              // the step whose flags `found` will hold
  bool found_pending = false;
  cudaEvent_t uploaded = nullptr;  // after prepare's copies
  std::string failure;             // an error a step found: every later prepare throws it

  ~Impl() {
    if (uploaded) cudaEventDestroy(uploaded);
  }

  size_t batch() const { return seqs.size(); }

  std::vector<DeviceStore::Layer*> layers_of(int layer) {
    std::vector<DeviceStore::Layer*> ls;
    for (const SeqId id : seqs) ls.push_back(&cache->sequences().at(id).layers[static_cast<size_t>(layer)]);
    return ls;
  }

  void check_flags(const unsigned long long* flags, size_t step);
};

DecodeStep::DecodeStep(KVCache& owner, std::span<const SeqId> seqs, std::span<const int> layers,
                       int n_q_heads, std::span<const AttentionOptions> options, size_t max_tokens)
    : impl_(std::make_unique<Impl>()) {
  Impl& s = *impl_;
  KVQ_CHECK(owner.device().is_cuda(), "DecodeStep: a ", owner.device().str(), " cache (decode steps run on CUDA caches)");
  DeviceStore& m = detail::Backend::store(owner);
  s.cache = &m;
  const CacheConfig& cfg = m.config();
  const size_t B = seqs.size(), T = static_cast<size_t>(cfg.block_tokens), R = static_cast<size_t>(cfg.residual_tokens);
  s.hd = static_cast<size_t>(cfg.n_kv_heads) * cfg.head_dim;
  KVQ_CHECK(B > 0, "DecodeStep: no sequences");
  KVQ_CHECK(B <= detail::kMaxAppendBatch, "DecodeStep: ", B, " sequences (at most ", detail::kMaxAppendBatch, ")");
  KVQ_CHECK(std::set<SeqId>(seqs.begin(), seqs.end()).size() == B, "DecodeStep: a sequence appears twice");
  KVQ_CHECK(!layers.empty(), "DecodeStep: no layers");
  KVQ_CHECK(options.size() == layers.size(), "DecodeStep: ", options.size(), " attention options for ",
            layers.size(), " layers");
  KVQ_CHECK(std::set<int>(layers.begin(), layers.end()).size() == layers.size(), "DecodeStep: a layer appears twice");
  KVQ_CHECK(max_tokens > 0, "DecodeStep: max_tokens = 0");
  const size_t max_pages = (max_tokens + T - 1) / T;
  KVQ_CHECK(max_pages <= cfg.capacity_pages, "DecodeStep: max_tokens = ", max_tokens, " is ", max_pages,
            " pages per sequence and layer; the pool holds ", cfg.capacity_pages);
  s.seqs.assign(seqs.begin(), seqs.end());
  s.max_tokens = max_tokens;
  s.index.assign(static_cast<size_t>(cfg.n_layers), -1);
  detail::use_device(m.device);
  for (size_t i = 0; i < layers.size(); ++i) {
    const int layer = layers[i];
    m.check_layer(layer);
    const size_t l = static_cast<size_t>(layer);
    KVQ_CHECK(m.key_encoders[l] != nullptr, "DecodeStep: key ", m.key_why[l]);
    KVQ_CHECK(m.value_encoders[l] != nullptr, "DecodeStep: value ", m.value_why[l]);
    for (const Codec* c : {m.key_codecs()[l].get(), m.value_codecs()[l].get()})
      KVQ_CHECK(c->trained(), "DecodeStep: layer ", layer, " codec '", c->spec().str(),
                "' needs training (train a host KVCache and copy it)");
    for (const SeqId id : seqs)
      KVQ_CHECK(owner.length(id, layer) < max_tokens, "DecodeStep: sequence ", id, " holds ",
                owner.length(id, layer), " tokens in layer ", layer, ", max_tokens = ", max_tokens,
                " leaves no room for a step");
    s.index[l] = static_cast<int>(i);
    Impl::LayerStep& ls = s.steps_of.emplace_back();
    ls.layer = layer;
    ls.options = options[i];
    // The staging block: the append's descriptors at their fixed shape, then the tables.
    ls.at = s.bytes;
    ls.lay = StagingLayout(B, B, B, B, B);
    StagingLayout tables = ls.lay;
    ls.seqs_at = tables.place<SeqPages>(B);
    ls.windows_at = tables.place<WindowDesc>(B);
    ls.starts_at = tables.place<SeqPages>(B);
    s.bytes += tables.bytes;
  }
  if (R > 0) s.scratch = device_alloc<float>(2 * s.hd * B * R, "a decode step's window scratch");
  s.host = detail::pinned_alloc<uint8_t>(s.bytes, "a decode step's descriptors");
  s.dev = device_alloc<uint8_t>(s.bytes, "a decode step's descriptors");
  std::memset(s.host.get(), 0, s.bytes);
  s.errors = device_alloc<unsigned long long>(4 * layers.size(), "a decode step's error flags");
  KVQ_CUDA_CHECK(cudaMemset(s.errors.get(), 0xff, 4 * layers.size() * sizeof(unsigned long long)));
  s.found = detail::pinned_alloc<unsigned long long>(4 * layers.size(), "a decode step's error flags");
  KVQ_CUDA_CHECK(cudaEventCreateWithFlags(&s.uploaded, cudaEventDisableTiming));
  for (Impl::LayerStep& ls : s.steps_of) {
    // Block tables at their largest from the start: no step reallocates one (a synchronizing cudaMalloc).
    for (DeviceStore::Layer* l : s.layers_of(ls.layer)) m.reserve_table(*l, max_pages);
    // A sliding window reads at most the pages it spans.
    const size_t window = ls.options.window;
    const size_t spanned = window > 0 ? std::min(max_pages, (window + T - 1) / T + 1) : max_pages;
    uint8_t* base = s.dev.get() + ls.at;
    const DecodeTables tables{detail::at<SeqPages>(base, ls.seqs_at), detail::at<WindowDesc>(base, ls.windows_at),
                              window > 0 ? detail::at<SeqPages>(base, ls.starts_at) : nullptr};
    ls.plan.emplace(detail::DevicePlan(owner, ls.layer, static_cast<int>(B), n_q_heads, ls.options, spanned, tables));
  }
}

DecodeStep::~DecodeStep() = default;
DecodeStep::DecodeStep(DecodeStep&&) noexcept = default;
DecodeStep& DecodeStep::operator=(DecodeStep&&) noexcept = default;

size_t DecodeStep::steps() const { return impl_->prepared; }

void DecodeStep::Impl::check_flags(const unsigned long long* flags, size_t step) {
  const int H = cache->config().n_kv_heads, d = cache->config().head_dim;
  for (size_t i = 0; i < steps_of.size() && failure.empty(); ++i) {
    const unsigned long long* f = flags + 4 * i;
    const int layer = steps_of[i].layer;
    for (int role = 0; role < 2 && failure.empty(); ++role) {
      if (f[role] == detail::kNoError) continue;
      const size_t at = static_cast<size_t>(f[role]);
      failure = kvq::detail::concat("DecodeStep: step ", step, " layer ", layer, ": sequence ", seqs[at / hd], ": ",
                                    role == 0 ? "key" : "value", " of head ", at / static_cast<size_t>(d) % H,
                                    " channel ", at % static_cast<size_t>(d),
                                    " was NaN or Inf (NaN and Inf are rejected); the sequences hold it from then on");
    }
    for (int role = 0; role < 2 && failure.empty(); ++role) {
      const unsigned long long e = f[2 + role];
      if (e == detail::kNoError) continue;
      const size_t l = static_cast<size_t>(layer);
      failure = kvq::detail::concat("DecodeStep: step ", step, " layer ", layer, ": ",
                                    (role == 0 ? cache->key_codecs()[l] : cache->value_codecs()[l])->spec().str(), ": a ",
                                    role == 0 ? "key" : "value", " of head ", (e >> 16) & 0xffff, " channel ",
                                    e & 0xffff, " was beyond what the codec's fp16 fields can hold; the sequences "
                                    "hold it from then on");
    }
  }
  if (!failure.empty()) throw Error(failure);
}

void DecodeStep::prepare(void* stream_ptr) {
  Impl& s = *impl_;
  DeviceStore& m = *s.cache;
  auto stream = static_cast<cudaStream_t>(stream_ptr);
  if (!s.failure.empty()) throw Error(s.failure);
  detail::use_device(m.device);
  // The staging buffer is free once the last upload is done; the flags it brought are those of the step before.
  KVQ_CUDA_CHECK(cudaEventSynchronize(s.uploaded));
  if (s.found_pending) {
    s.found_pending = false;
    s.check_flags(s.found.get(), s.found_step);
  }

  // Every check first: on an error nothing changes.
  const CacheConfig& cfg = m.config();
  const size_t T = static_cast<size_t>(cfg.block_tokens), R = static_cast<size_t>(cfg.residual_tokens);
  const bool centered = kvq::detail::centers_keys(cfg);
  std::vector<detail::AppendPlan> plans;
  size_t pages = 0;
  for (const Impl::LayerStep& ls : s.steps_of) {
    std::vector<detail::SequenceChunk> chunks;
    for (size_t i = 0; i < s.batch(); ++i) {
      const SeqId id = s.seqs[i];
      KVQ_CHECK(m.sequences().contains(id), "DecodeStep: sequence ", id, " was removed");
      const DeviceStore::Layer& l = m.sequences().at(id).layers[static_cast<size_t>(ls.layer)];
      const size_t length =
          static_cast<size_t>(l.sink_count) + l.pages.size() * T + static_cast<size_t>(l.residual_count);
      KVQ_CHECK(length < s.max_tokens, "DecodeStep: sequence ", id, " layer ", ls.layer, " holds ", length,
                " tokens: the step was made for max_tokens = ", s.max_tokens);
      // A step's launches append to pages and window only: the sinks must be full (an append fills them).
      KVQ_CHECK(l.sink_count == cfg.sink_tokens, "DecodeStep: sequence ", id, " layer ", ls.layer, " holds ",
                l.sink_count, " of its ", cfg.sink_tokens, " sink tokens: append its first ", cfg.sink_tokens,
                " tokens before decode steps");
      chunks.push_back({static_cast<size_t>(l.residual_count), 1, l.device->has_offset});
    }
    plans.push_back(detail::plan_append(chunks, T, R, centered));
    pages += plans.back().pages;
  }
  if (pages > m.free().size())
    throw Error(kvq::detail::concat("device KV cache pool exhausted: a decode step of ", s.batch(),
                                    " sequences needs ", pages, " new pages but ", m.free().size(), " of ",
                                    cfg.capacity_pages, " are free"));

  // Each layer's append described and committed to the bookkeeping, then its tables from the lengths after it.
  for (size_t i = 0; i < s.steps_of.size(); ++i) {
    Impl::LayerStep& ls = s.steps_of[i];
    const std::vector<DeviceStore::Layer*> layers = s.layers_of(ls.layer);
    m.reserve_append(plans[i], layers);
    uint8_t* host = s.host.get() + ls.at;
    ls.launch = m.describe_append(plans[i], layers, nullptr, nullptr, s.scratch.get(), host, s.dev.get() + ls.at,
                                  ls.lay, true);  // run() gives the keys and values
    m.commit_append(plans[i], layers);
    for (size_t j = 0; j < layers.size(); ++j) {
      const DeviceStore::Layer& l = *layers[j];
      const detail::WindowStart w = detail::window_start(l.pages.size(), cfg.block_tokens, l.residual_count,
                                                         ls.options.window, l.sink_count);
      const size_t whole = w.first_whole_page();
      const PageId* table = l.device->pages.get();
      detail::at<SeqPages>(host, ls.seqs_at)[j] = {table + whole, static_cast<int>(l.pages.size() - whole), 0};
      detail::at<WindowDesc>(host, ls.windows_at)[j] = {l.device->window.get(),
                                                        l.residual_count,
                                                        w.in_residual,
                                                        l.device->sinks.get(),
                                                        static_cast<int>(l.sink_slots),
                                                        l.sink_count,
                                                        w.in_sinks,
                                                        l.device->has_offset ? l.device->key_offset.get() : nullptr};
      detail::at<SeqPages>(host, ls.starts_at)[j] = {table + w.page, w.in_page > 0 ? 1 : 0, w.in_page};
    }
  }

  // The step before's flags come back, the flags are reset, the descriptors go up: all ordered after its runs.
  const size_t flag_bytes = 4 * s.steps_of.size() * sizeof(unsigned long long);
  if (s.prepared > 0) {
    KVQ_CUDA_CHECK(cudaMemcpyAsync(s.found.get(), s.errors.get(), flag_bytes, cudaMemcpyDeviceToHost, stream));
    KVQ_CUDA_CHECK(cudaMemsetAsync(s.errors.get(), 0xff, flag_bytes, stream));
    s.found_step = s.prepared - 1;
    s.found_pending = true;
  }
  KVQ_CUDA_CHECK(cudaMemcpyAsync(s.dev.get(), s.host.get(), s.bytes, cudaMemcpyHostToDevice, stream));
  KVQ_CUDA_CHECK(cudaEventRecord(s.uploaded, stream));
  ++s.prepared;
}

void DecodeStep::run(int layer, const float* keys_dev, const float* values_dev, const float* q_dev, float* out_dev,
                     void* stream_ptr) {
  Impl& s = *impl_;
  DeviceStore& m = *s.cache;
  auto stream = static_cast<cudaStream_t>(stream_ptr);
  KVQ_CHECK(layer >= 0 && static_cast<size_t>(layer) < s.index.size() && s.index[static_cast<size_t>(layer)] >= 0,
            "DecodeStep::run: layer ", layer, " is not one of the step's layers");
  KVQ_CHECK(s.prepared > 0, "DecodeStep::run: no step prepared (call prepare() first)");
  KVQ_CHECK(keys_dev && values_dev && q_dev && out_dev, "DecodeStep::run: a null array");
  for (const float* x : {keys_dev, values_dev})
    KVQ_CHECK(reinterpret_cast<uintptr_t>(x) % 16 == 0, "DecodeStep::run: the ", x == keys_dev ? "keys" : "values",
              " must be 16-byte aligned device memory");
  const size_t i = static_cast<size_t>(s.index[static_cast<size_t>(layer)]);
  AppendLaunch launch = s.steps_of[i].launch;
  launch.keys.fresh_base = keys_dev;
  launch.values.fresh_base = values_dev;
  m.launch_append(launch, layer, s.errors.get() + 4 * i, stream);
  m.launch_commit(launch, stream);
  const Impl::LayerStep& ls = s.steps_of[i];
  ls.plan->enqueue(q_dev, out_dev, stream);
}

void DecodeStep::check(void* stream_ptr) {
  Impl& s = *impl_;
  if (!s.failure.empty()) throw Error(s.failure);
  if (s.prepared == 0) return;
  detail::use_device(s.cache->device);
  KVQ_CUDA_CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(stream_ptr)));
  if (s.found_pending) {
    s.found_pending = false;
    s.check_flags(s.found.get(), s.found_step);
  }
  const size_t flag_bytes = 4 * s.steps_of.size() * sizeof(unsigned long long);
  KVQ_CUDA_CHECK(cudaMemcpy(s.found.get(), s.errors.get(), flag_bytes, cudaMemcpyDeviceToHost));
  s.check_flags(s.found.get(), s.prepared - 1);
}

}  // namespace kvq::cuda

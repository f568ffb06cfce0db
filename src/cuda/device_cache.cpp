// A CUDA KVCache's device side (its state: device_store.hpp; what KVCache calls: cache/cuda_backend.hpp). Appends
// of tokens in device memory encode full pages with the append kernels (device_encoder.hpp) straight into the pool
// and move the rest into the window on the device; appends from host memory upload the tokens first.
#include <algorithm>
#include <cstdint>
#include <cstring>
#include <utility>

#include "cache/key_offset.hpp"
#include "cache/cuda_backend.hpp"
#include "core/finite.hpp"
#include "cuda/device_store.hpp"
#include "cuda/encode_layout.cuh"
#include "kvq/cuda.hpp"
#include "kvq/detail/cuda_bench_support.hpp"
#include "kvq/detail/random.hpp"

namespace kvq::cuda {
namespace detail {

void use_device(int device) {
  KVQ_CHECK(device >= 0 && device < device_count(), "no CUDA device ", device, ": ",
            device_count() == 0 ? unavailable_reason() : std::to_string(device_count()) + " device(s) present");
  KVQ_CUDA_CHECK(cudaSetDevice(device));
}

}  // namespace detail

namespace detail {

DeviceStore::DeviceStore(KVCache& owner, int dev) : cache(&owner), device(dev) {
  detail::use_device(device);
  pool = device_alloc<uint8_t>(config().capacity_pages * layout().page_bytes,
                               "the KV cache pool (" + std::to_string(config().capacity_pages) + " pages)");
  key_encoders.resize(static_cast<size_t>(config().n_layers));
  value_encoders.resize(key_encoders.size());
  key_why.resize(key_encoders.size());
  value_why.resize(key_encoders.size());
  for (size_t l = 0; l < key_encoders.size(); ++l) build_encoders(l);
  errors = device_alloc<unsigned long long>(4, "the append path's error flags");
  found = detail::pinned_alloc<unsigned long long>(4, "the append path's error flags");
}

void DeviceStore::build_encoders(size_t l) {
  key_encoders[l] = detail::make_device_encoder(*key_codecs()[l], &key_why[l]);
  value_encoders[l] = detail::make_device_encoder(*value_codecs()[l], &value_why[l]);
}

void DeviceDeleter::operator()(DeviceStore* p) const noexcept { delete p; }
void DeviceDeleter::operator()(DeviceLayer* p) const noexcept { delete p; }

// ---- what KVCache calls (cache/cuda_backend.hpp) ----------------------------------------------------------------

DeviceStore& Backend::store(KVCache& cache) { return *cache.cuda_; }

void Backend::open(KVCache& cache, int device) { cache.cuda_.reset(new DeviceStore(cache, device)); }

void Backend::moved(KVCache& cache) noexcept { cache.cuda_->cache = &cache; }

void Backend::add_sequence(KVCache& cache, SeqId id) {
  use_device(cache.cuda_->device);
  cache.cuda_->insert(id);
}

void Backend::trained(KVCache& cache, int layer) {
  use_device(cache.cuda_->device);
  cache.cuda_->build_encoders(static_cast<size_t>(layer));
}

const uint8_t* Backend::pool(const KVCache& cache) { return cache.cuda_->pool.get(); }

LayerView Backend::view(const KVCache& cache, SeqId seq, int layer) {
  const DeviceStore& m = *cache.cuda_;
  const DeviceStore::Layer& l = m.sequences().at(seq).layers[static_cast<size_t>(layer)];
  const size_t head = m.slots() * static_cast<size_t>(m.config().head_dim);
  LayerView v;
  v.pages = l.pages;
  v.block_tokens = m.config().block_tokens;
  v.residual_count = l.residual_count;
  v.residual_keys = l.device->window.get();
  v.residual_values = l.device->window.get() + static_cast<size_t>(m.config().n_kv_heads) * head;
  v.residual_stride = head;
  if (l.device->has_offset) v.key_offset = l.device->key_offset.get();
  v.device_pages = l.device->pages.get();
  v.sink_count = l.sink_count;
  if (l.device->sinks) {
    v.sink_stride = l.sink_slots * static_cast<size_t>(m.config().head_dim);
    v.sink_keys = l.device->sinks.get();
    v.sink_values = l.device->sinks.get() + static_cast<size_t>(m.config().n_kv_heads) * v.sink_stride;
  }
  return v;
}

void Backend::add_memory(const KVCache& cache, CacheMemory& mem) {
  const DeviceStore& m = *cache.cuda_;
  const size_t hd = static_cast<size_t>(m.config().n_kv_heads) * m.config().head_dim;
  for (const auto& [id, seq] : m.sequences())
    for (const DeviceStore::Layer& l : seq.layers) {
      mem.residual_bytes += m.window_floats() * sizeof(float);
      mem.key_offset_bytes += l.device->has_offset ? hd * sizeof(float) : 0;
    }
}

void Backend::append(KVCache& cache, SeqId seq, int layer, const float* keys, const float* values, size_t n_tokens) {
  DeviceStore& m = *cache.cuda_;
  m.check_layer(layer);
  DeviceStore::Layer& ls = m.sequences().at(seq).layers[static_cast<size_t>(layer)];
  if (n_tokens == 0) return;
  KVQ_CHECK(keys != nullptr && values != nullptr, "KVCache::append: null keys or values");
  detail::use_device(m.device);
  const size_t l = static_cast<size_t>(layer);
  if (!m.key_encoders[l] || !m.value_encoders[l]) {
    // A codec without an append kernel: the tokens are on the host already, so its CPU encoder does the work.
    m.append_on_host(ls, layer, seq, keys, values, n_tokens);
    return;
  }
  const size_t n = n_tokens * static_cast<size_t>(m.config().n_kv_heads) * m.config().head_dim;
  if (2 * n > m.upload_capacity) {
    m.upload = device_alloc<float>(2 * n, "the uploaded tokens of an append");
    m.upload_capacity = 2 * n;
  }
  KVQ_CUDA_CHECK(cudaMemcpy(m.upload.get(), keys, n * sizeof(float), cudaMemcpyHostToDevice));
  KVQ_CUDA_CHECK(cudaMemcpy(m.upload.get() + n, values, n * sizeof(float), cudaMemcpyHostToDevice));
  m.append_batch("KVCache::append", {&seq, 1}, layer, m.upload.get(), m.upload.get() + n, {&n_tokens, 1}, nullptr);
  KVQ_CUDA_CHECK(cudaDeviceSynchronize());
}

void Backend::append_batch(KVCache& cache, const char* who, std::span<const SeqId> seqs, int layer,
                           const float* keys_dev, const float* values_dev, std::span<const size_t> n_tokens,
                           void* stream) {
  cache.cuda_->append_batch(who, seqs, layer, keys_dev, values_dev, n_tokens, static_cast<cudaStream_t>(stream));
}

void Backend::upload(KVCache& dev, const KVCache& host) {
  DeviceStore& m = *dev.cuda_;
  detail::use_device(m.device);
  for (size_t l = 0; l < static_cast<size_t>(m.config().n_layers); ++l) m.build_encoders(l);  // the codecs' state
  KVQ_CHECK(m.layout().page_bytes == host.page_bytes(), "KVCache::to: page layout differs from the host cache's");
  size_t needed = 0;
  for (SeqId id : host.sequences())
    for (int l = 0; l < m.config().n_layers; ++l) needed += host.view(id, l).pages.size();
  KVQ_CHECK(needed <= m.free().size(), "KVCache::to: the cache holds ", needed, " pages but the copy's pool has ",
            m.free().size());
  const size_t d = static_cast<size_t>(m.config().head_dim), H = static_cast<size_t>(m.config().n_kv_heads);
  for (SeqId id : host.sequences()) {
    DeviceStore::Sequence& s = m.insert(id);
    for (int l = 0; l < m.config().n_layers; ++l) {
      const LayerView v = host.view(id, l);
      DeviceStore::Layer& dl = s.layers[static_cast<size_t>(l)];
      m.take_pages(dl, v.pages.size());
      for (size_t j = 0; j < v.pages.size(); ++j)
        KVQ_CUDA_CHECK(
            cudaMemcpy(m.page(dl.pages[j]), host.page(v.pages[j]), m.layout().page_bytes, cudaMemcpyHostToDevice));
      dl.residual_count = v.residual_count;
      if (v.key_offset != nullptr) m.set_key_offset(dl, v.key_offset);
      const size_t head = m.slots() * d;
      std::vector<float> window(m.window_floats(), 0.0f);
      for (size_t h = 0; h < H; ++h) {
        std::memcpy(window.data() + h * head, v.residual_key(static_cast<int>(h)),
                    static_cast<size_t>(v.residual_count) * d * sizeof(float));
        std::memcpy(window.data() + (H + h) * head, v.residual_value(static_cast<int>(h)),
                    static_cast<size_t>(v.residual_count) * d * sizeof(float));
      }
      KVQ_CUDA_CHECK(cudaMemcpy(dl.device->window.get(), window.data(), window.size() * sizeof(float),
                                cudaMemcpyHostToDevice));
      if (v.sink_count > 0) {
        dl.sink_count = v.sink_count;
        dl.sink_slots = v.sink_stride / d;
        dl.sinks.assign(v.sink_keys, v.sink_keys + 2 * H * v.sink_stride);  // keys, then values right after
        m.upload_sinks(dl, nullptr);
      }
    }
  }
  m.sequences().next_id = host.next_sequence_id();
}

}  // namespace detail

DeviceStore::Layer DeviceStore::host_layer(const Layer& l) const {
  Layer host;
  host.residual.resize(window_floats());
  KVQ_CUDA_CHECK(cudaMemcpy(host.residual.data(), l.device->window.get(), host.residual.size() * sizeof(float),
                            cudaMemcpyDeviceToHost));
  host.window_slots = slots();
  host.residual_count = l.residual_count;
  if (l.device->has_offset) {
    host.key_offset.resize(static_cast<size_t>(config().n_kv_heads) * config().head_dim);
    KVQ_CUDA_CHECK(cudaMemcpy(host.key_offset.data(), l.device->key_offset.get(),
                              host.key_offset.size() * sizeof(float), cudaMemcpyDeviceToHost));
  }
  host.sink_count = l.sink_count;
  host.sink_slots = l.sink_slots;
  host.sinks = l.sinks;
  return host;
}

void DeviceStore::upload_sinks(Layer& l, cudaStream_t st) const {
  if (l.sinks.size() != l.device->sink_halves) {
    KVQ_CUDA_CHECK(cudaDeviceSynchronize());  // a decode queued before may still read the old copy
    l.device->sinks = device_alloc<uint16_t>(l.sinks.size(), "a sequence's f16 sink tokens");
    l.device->sink_halves = l.sinks.size();
  }
  // Pageable memory: the call returns once the host copy is staged, so the next append may change it.
  if (!l.sinks.empty())
    KVQ_CUDA_CHECK(cudaMemcpyAsync(l.device->sinks.get(), l.sinks.data(), l.sinks.size() * sizeof(uint16_t),
                                   cudaMemcpyHostToDevice, st));
}

void DeviceStore::append_on_host(Layer& ls, int layer, SeqId seq, const float* keys, const float* values,
                                 size_t n_tokens) {
  Layer host = host_layer(ls);
  std::vector<std::vector<uint8_t>> staged;  // the new pages, encoded on the host
  cache->append_on_host(
      host, layer, seq, keys, values, n_tokens,
      [&](size_t) { return staged.emplace_back(layout().page_bytes, uint8_t{0}).data(); },
      [&](size_t n) {
        for (size_t j = 0; j < n; ++j)
          KVQ_CUDA_CHECK(cudaMemcpy(page(free().next(j)), staged[j].data(), staged[j].size(), cudaMemcpyHostToDevice));
        take_pages(ls, n);
      });
  if (!host.key_offset.empty() && !ls.device->has_offset) set_key_offset(ls, host.key_offset.data());
  ls.residual_count = host.residual_count;
  KVQ_CUDA_CHECK(cudaMemcpy(ls.device->window.get(), host.residual.data(), host.residual.size() * sizeof(float),
                            cudaMemcpyHostToDevice));
  if (host.sink_count != ls.sink_count) {
    ls.sink_count = host.sink_count;
    ls.sink_slots = host.sink_slots;
    ls.sinks = std::move(host.sinks);
    upload_sinks(ls, nullptr);
    KVQ_CUDA_CHECK(cudaDeviceSynchronize());
  }
}

void DeviceStore::append_batch(const char* who, std::span<const SeqId> seqs, int layer, const float* keys_dev,
                                       const float* values_dev, std::span<const size_t> n_tokens,
                                       cudaStream_t st) {
  // Every check before anything is launched: on any error the cache stays as it was for every sequence.
  check_layer(layer);
  KVQ_CHECK(seqs.size() == n_tokens.size(), who, ": ", seqs.size(), " sequences but ", n_tokens.size(),
            " token counts");
  KVQ_CHECK(seqs.size() <= detail::kMaxAppendBatch, who, ": ", seqs.size(), " sequences in one batch (at most ",
            detail::kMaxAppendBatch, ")");
  std::vector<Layer*> layers;
  for (const SeqId id : seqs) layers.push_back(&sequences().at(id).layers[static_cast<size_t>(layer)]);
  {
    std::vector<SeqId> sorted(seqs.begin(), seqs.end());
    std::sort(sorted.begin(), sorted.end());
    const auto twice = std::adjacent_find(sorted.begin(), sorted.end());
    KVQ_CHECK(twice == sorted.end(), who, ": sequence ", twice == sorted.end() ? 0 : *twice,
              " appears twice in one batch (append its tokens as one chunk)");
  }
  const size_t l = static_cast<size_t>(layer);
  KVQ_CHECK(key_encoders[l] != nullptr, who, ": key ", key_why[l]);
  KVQ_CHECK(value_encoders[l] != nullptr, who, ": value ", value_why[l]);
  size_t sum = 0;
  for (const size_t n : n_tokens) sum += n;
  if (sum == 0) return;
  for (const Codec* c : {key_codecs()[l].get(), value_codecs()[l].get()})
    KVQ_CHECK(c->trained(), who, ": layer ", layer, " codec '", c->spec().str(),
              "' needs training (train a host KVCache and copy it)");
  KVQ_CHECK(keys_dev != nullptr && values_dev != nullptr, who, ": null keys or values");
  for (const float* x : {keys_dev, values_dev})
    KVQ_CHECK(reinterpret_cast<uintptr_t>(x) % 16 == 0, who, ": the ", x == keys_dev ? "keys" : "values",
              " must be 16-byte aligned device memory");
  int current = -1;
  if (cudaGetDevice(&current) != cudaSuccess || current != device) detail::use_device(device);
  const int H = config().n_kv_heads, d = config().head_dim, T = config().block_tokens;
  const size_t uT = static_cast<size_t>(T), hd = static_cast<size_t>(H) * d;
  const bool centered = kvq::detail::centers_keys(config());
  std::vector<size_t> n_sink(seqs.size());
  for (size_t i = 0; i < seqs.size(); ++i) n_sink[i] = cache->sinks_taken(*layers[i], n_tokens[i]);
  const std::vector<float> sink_tokens = download_sinks(who, seqs, keys_dev, values_dev, n_tokens, n_sink, st);
  std::vector<detail::SequenceChunk> chunks;
  for (size_t i = 0; i < seqs.size(); ++i)
    chunks.push_back({static_cast<size_t>(layers[i]->residual_count), n_tokens[i], layers[i]->device->has_offset,
                      n_sink[i]});
  const detail::AppendPlan plan =
      detail::plan_append(chunks, uT, static_cast<size_t>(config().residual_tokens), centered);
  if (plan.pages > free().size()) {
    const std::string what = seqs.size() == 1
                                 ? kvq::detail::concat(sum, " tokens to sequence ", seqs[0], " layer ", layer)
                                 : kvq::detail::concat(sum, " tokens to ", seqs.size(), " sequences of layer ", layer);
    throw Error(kvq::detail::concat("device KV cache pool exhausted: appending ", what, " needs ", plan.pages,
                                    " new pages but ", free().size(), " of ", config().capacity_pages, " are free"));
  }
  KVQ_CHECK(plan.pages * uT <= 0xffffffffull, who, ": ", plan.pages, " new pages in one batch (at most ",
            0xffffffffull / uT, ")");

  reserve_append(plan, layers);
  reserve_sinks(layers, n_sink, st);
  // A buffer outgrown is replaced only once no earlier append's commit (queued on any stream) can still read it.
  size_t gathers = 0, means = 0, moves = 0;
  for (const detail::SequencePlan& p : plan.seqs) {
    gathers += p.gather_count > 0 ? 1 : 0;
    means += p.new_offset ? 1 : 0;
    moves += p.through_scratch ? 1 : 0;
  }
  const size_t scratch_floats = 2 * hd * plan.scratch_tokens;
  const StagingLayout lay(seqs.size(), plan.pages, gathers, means, moves);
  if (scratch_floats > window_scratch_capacity || lay.bytes > staging_capacity)
    KVQ_CUDA_CHECK(cudaDeviceSynchronize());
  if (scratch_floats > window_scratch_capacity) {
    window_scratch = device_alloc<float>(scratch_floats, "the append path's window scratch");
    window_scratch_capacity = scratch_floats;
  }
  if (lay.bytes > staging_capacity) {
    staging_host = detail::pinned_alloc<uint8_t>(lay.bytes, "the append path's batch descriptors");
    staging_dev = device_alloc<uint8_t>(lay.bytes, "the append path's batch descriptors");
    staging_capacity = lay.bytes;
  }
  const AppendLaunch launch = describe_append(plan, layers, keys_dev, values_dev, window_scratch.get(),
                                              staging_host.get(), staging_dev.get(), lay, false);

  // One pass over the fresh tokens, checked before the commit: no reader sees any of it before the checks pass.
  KVQ_CUDA_CHECK(cudaMemcpyAsync(staging_dev.get(), staging_host.get(), lay.bytes, cudaMemcpyHostToDevice, st));
  unsigned long long* err = errors.get();
  KVQ_CUDA_CHECK(cudaMemsetAsync(err, 0xff, 4 * sizeof(unsigned long long), st));
  launch_append(launch, layer, err, st);
  unsigned long long* flags = found.get();
  KVQ_CUDA_CHECK(cudaMemcpyAsync(flags, err, 4 * sizeof(unsigned long long), cudaMemcpyDeviceToHost, st));
  KVQ_CUDA_CHECK(cudaStreamSynchronize(st));
  for (int role = 0; role < 2; ++role) {
    if (flags[role] == detail::kNoError) continue;
    const size_t i = static_cast<size_t>(flags[role]);
    const detail::StreamToken where = detail::locate_fresh_token(plan, i / hd);
    float x = 0;
    KVQ_CUDA_CHECK(cudaMemcpy(&x, (role == 0 ? keys_dev : values_dev) + i, sizeof(float), cudaMemcpyDeviceToHost));
    throw Error(kvq::detail::concat(who, ": sequence ", seqs[where.seq], ": ", role == 0 ? "key" : "value",
                                    " of token ", where.index, " head ", i / static_cast<size_t>(d) % H, " channel ",
                                    i % static_cast<size_t>(d), " is ", x, " (NaN and Inf are rejected)"));
  }
  for (int role = 0; role < 2; ++role) {
    const unsigned long long e = flags[2 + role];
    if (e == detail::kNoError) continue;
    const size_t token = static_cast<size_t>(e >> 32);
    const detail::StreamToken where = detail::locate_page_token(plan, token / uT, token % uT, uT);
    throw Error(kvq::detail::concat(who, ": ", (role == 0 ? key_codecs()[l] : value_codecs()[l])->spec().str(),
                                    ": sequence ", seqs[where.seq], ": ", role == 0 ? "key" : "value", " of ",
                                    where.in_window ? "window token " : "token ", where.index, " head ",
                                    (e >> 16) & 0xffff, " channel ", e & 0xffff,
                                    " is beyond what the codec's fp16 fields can hold"));
  }
  launch_commit(launch, st);
  commit_append(plan, layers);
  commit_sinks(layers, n_sink, sink_tokens, st);
}

std::vector<float> DeviceStore::download_sinks(const char* who, std::span<const SeqId> seqs, const float* keys_dev,
                                               const float* values_dev, std::span<const size_t> n_tokens,
                                               std::span<const size_t> n_sink, cudaStream_t st) const {
  const size_t hd = static_cast<size_t>(config().n_kv_heads) * config().head_dim;
  size_t total = 0;
  for (const size_t n : n_sink) total += n;
  std::vector<float> tokens(2 * total * hd);  // keys [total][H][d], then values
  if (total == 0) return tokens;
  for (size_t i = 0, chunk = 0, at = 0; i < seqs.size(); chunk += n_tokens[i], at += n_sink[i], ++i)
    for (int role = 0; role < 2 && n_sink[i] > 0; ++role)
      KVQ_CUDA_CHECK(cudaMemcpyAsync(tokens.data() + (role * total + at) * hd,
                                     (role == 0 ? keys_dev : values_dev) + chunk * hd, n_sink[i] * hd * sizeof(float),
                                     cudaMemcpyDeviceToHost, st));
  KVQ_CUDA_CHECK(cudaStreamSynchronize(st));
  for (size_t i = 0, at = 0; i < seqs.size(); at += n_sink[i], ++i) {
    const float* keys = tokens.data() + at * hd;
    const float* values = keys + total * hd;
    const size_t n = n_sink[i] * hd, d = static_cast<size_t>(config().head_dim);
    for (const float* x : {keys, values}) {
      const size_t j = first_non_finite(x, n);
      KVQ_CHECK(j == n, who, ": sequence ", seqs[i], ": ", x == keys ? "key" : "value", " of token ", j / hd,
                " head ", j / d % static_cast<size_t>(config().n_kv_heads), " channel ", j % d, " is ", x[j],
                " (NaN and Inf are rejected)");
    }
    cache->check_sink_range(kvq::detail::concat(who, ": sequence ", seqs[i]), keys, values, n_sink[i]);
  }
  return tokens;
}

void DeviceStore::reserve_sinks(std::span<Layer* const> layers, std::span<const size_t> n_sink,
                                cudaStream_t st) const {
  for (size_t i = 0; i < layers.size(); ++i) {
    Layer& l = *layers[i];
    if (n_sink[i] == 0) continue;
    cache->reserve_sinks(l, static_cast<size_t>(l.sink_count) + n_sink[i]);
    if (l.sinks.size() != l.device->sink_halves) upload_sinks(l, st);  // the held ones, in the regrown layout
  }
}

void DeviceStore::commit_sinks(std::span<Layer* const> layers, std::span<const size_t> n_sink,
                               const std::vector<float>& tokens, cudaStream_t st) const {
  const size_t hd = static_cast<size_t>(config().n_kv_heads) * config().head_dim, total = tokens.size() / (2 * hd);
  for (size_t i = 0, at = 0; i < layers.size(); at += n_sink[i], ++i) {
    if (n_sink[i] == 0) continue;
    cache->store_sinks(*layers[i], tokens.data() + at * hd, tokens.data() + (total + at) * hd, n_sink[i]);
    upload_sinks(*layers[i], st);
  }
}

void DeviceStore::reserve_append(const detail::AppendPlan& plan, std::span<Layer* const> layers) {
  const size_t hd = static_cast<size_t>(config().n_kv_heads) * config().head_dim;
  for (size_t i = 0; i < layers.size(); ++i) {
    const detail::SequencePlan& p = plan.seqs[i];
    reserve_table(*layers[i], layers[i]->pages.size() + p.n_pages);
    if (p.new_offset && !layers[i]->device->key_offset) layers[i]->device->key_offset = device_alloc<float>(hd, "a key offset");
  }
}

AppendLaunch DeviceStore::describe_append(const detail::AppendPlan& plan, std::span<Layer* const> layers,
                                                  const float* keys_dev, const float* values_dev, float* scratch,
                                                  uint8_t* host, uint8_t* dev, const StagingLayout& lay,
                                                  bool fixed) const {
  using detail::at;
  const int H = config().n_kv_heads, d = config().head_dim, T = config().block_tokens;
  const size_t uT = static_cast<size_t>(T), hd = static_cast<size_t>(H) * d, n = layers.size();
  const bool centered = kvq::detail::centers_keys(config());
  const size_t slots_n = slots();
  const int n_slots = static_cast<int>(slots_n);
  AppendLaunch a;
  a.keys = {at<detail::EncodeStream>(dev, lay.key_streams), keys_dev, H, n_slots, d, T};
  a.values = {at<detail::EncodeStream>(dev, lay.value_streams), values_dev, H, n_slots, d, T};
  a.pages = at<detail::EncodePage>(dev, lay.pages);
  a.gathers = at<detail::WindowGather>(dev, lay.gathers);
  a.means = at<detail::KeyMean>(dev, lay.means);
  a.moves = at<detail::WindowMove>(dev, lay.moves);
  a.table_ends = at<PageId*>(dev, lay.table_ends);
  a.n_pages = plan.pages;
  // Streams, pages (the free list's next pages, in batch order), gathers, key means, window moves.
  for (size_t i = 0; i < n; ++i) {
    const detail::SequencePlan& p = plan.seqs[i];
    Layer& ls = *layers[i];
    float* window_k = ls.device->window.get();
    const float* offset = centered && (ls.device->has_offset || p.new_offset) ? ls.device->key_offset.get() : nullptr;
    at<detail::EncodeStream>(host, lay.key_streams)[i] = {window_k, p.fresh_first, offset, static_cast<int>(p.used),
                                                          p.new_offset};
    at<detail::EncodeStream>(host, lay.value_streams)[i] = {window_k + hd * slots_n, p.fresh_first, nullptr,
                                                            static_cast<int>(p.used), false};
    at<PageId*>(host, lay.table_ends)[i] = ls.device->pages.get() + ls.pages.size();
    for (size_t j = 0; j < p.n_pages; ++j)
      at<detail::EncodePage>(host, lay.pages)[p.first_page + j] = {
          static_cast<uint32_t>(i), static_cast<uint32_t>(j * uT), free().next(p.first_page + j)};
    if (p.gather_count > 0) {
      float* to = p.through_scratch ? scratch + 2 * hd * p.scratch_first : ls.device->window.get();
      at<detail::WindowGather>(host, lay.gathers)[a.n_gathers++] = {
          static_cast<uint32_t>(i), static_cast<uint32_t>(p.gather_first), static_cast<uint32_t>(p.gather_count),
          to, p.through_scratch ? static_cast<int>(p.kept) : n_slots, static_cast<int>(p.window_slot)};
      a.max_gather = std::max(a.max_gather, p.gather_count);
    }
    if (p.new_offset) at<detail::KeyMean>(host, lay.means)[a.n_means++] = {static_cast<uint32_t>(i), ls.device->key_offset.get()};
    if (p.through_scratch) {
      at<detail::WindowMove>(host, lay.moves)[a.n_moves++] = {scratch + 2 * hd * p.scratch_first, ls.device->window.get(),
                                                              static_cast<int>(p.kept)};
      a.max_move = std::max(a.max_move, p.kept);
    }
  }
  if (fixed) {  // one entry per sequence in every array, the rest empty; the largest counts a token's step can have
    for (size_t j = a.n_pages; j < n; ++j) at<detail::EncodePage>(host, lay.pages)[j] = {detail::kNoStream, 0, 0};
    for (size_t j = a.n_gathers; j < n; ++j) at<detail::WindowGather>(host, lay.gathers)[j] = {};
    for (size_t j = a.n_means; j < n; ++j) at<detail::KeyMean>(host, lay.means)[j] = {};
    for (size_t j = a.n_moves; j < n; ++j) at<detail::WindowMove>(host, lay.moves)[j] = {};
    const size_t R = static_cast<size_t>(config().residual_tokens);
    a.n_pages = a.n_gathers = a.n_moves = n;
    a.n_means = centered ? n : 0;  // only a cache that centers keys ever sets an offset
    a.max_gather = std::max<size_t>(1, R);
    a.max_move = R;
  }
  return a;
}

void DeviceStore::launch_append(const AppendLaunch& a, int layer, unsigned long long* err,
                                        cudaStream_t st) const {
  const size_t l = static_cast<size_t>(layer);
  detail::launch_key_means(a.keys, a.means, a.n_means, st);
  if (a.n_pages > 0) {
    const detail::EncodeRole kr{
        a.keys,
        {pool.get(), layout().page_bytes, layout().key_offset(0), layout().key_stride, key_codecs()[l]->block_bytes()},
        a.pages, err + 2, err};
    const detail::EncodeRole vr{
        a.values,
        {pool.get(), layout().page_bytes, layout().value_offset(0), layout().value_stride, value_codecs()[l]->block_bytes()},
        a.pages, err + 3, err + 1};
    if (!key_encoders[l]->encode(kr, value_encoders[l].get(), &vr, a.n_pages, st))
      value_encoders[l]->encode(vr, nullptr, nullptr, a.n_pages, st);
  }
  detail::launch_gather_windows(a.keys, a.values, a.gathers, a.n_gathers, a.max_gather, err, st);
}

void DeviceStore::launch_commit(const AppendLaunch& a, cudaStream_t st) const {
  detail::launch_place_page_ids(a.pages, a.n_pages, a.table_ends, config().block_tokens, st);
  detail::launch_move_windows(a.moves, a.n_moves, a.max_move, config().n_kv_heads, static_cast<int>(slots()),
                              config().head_dim, st);
}

void DeviceStore::commit_append(const detail::AppendPlan& plan, std::span<Layer* const> layers) {
  for (size_t i = 0; i < layers.size(); ++i) {
    const detail::SequencePlan& p = plan.seqs[i];
    Layer& ls = *layers[i];
    free().take(p.n_pages, ls.pages);  // in batch order: the pages describe_append numbered free().next(first_page + j)
    ls.residual_count = static_cast<int>(p.kept);
    ls.device->has_offset = ls.device->has_offset || p.new_offset;
  }
}

SeqId add_sequence_repeating(KVCache& cache, SeqId src, size_t n_tokens) {
  KVQ_CHECK(cache.device().is_cuda(), "add_sequence_repeating: a ", cache.device().str(), " cache");
  DeviceStore& m = detail::Backend::store(cache);
  detail::use_device(m.device);
  const size_t T = static_cast<size_t>(m.config().block_tokens);
  KVQ_CHECK(n_tokens % T == 0, "add_sequence_repeating: ", n_tokens, " tokens is not a multiple of the page size ", T);
  KVQ_CHECK(m.config().sink_tokens == 0, "add_sequence_repeating: a cache with sink_tokens = ",
            m.config().sink_tokens, " (its sequences start with their sinks, not with pages)");
  const size_t n_pages = n_tokens / T, layers = static_cast<size_t>(m.config().n_layers);
  size_t needed = 0;
  for (const DeviceStore::Layer& l : m.sequences().at(src).layers) {
    KVQ_CHECK(l.residual_count == 0, "add_sequence_repeating: sequence ", src,
              " must hold whole pages only (", l.residual_count, " window tokens)");
    needed += l.pages.empty() ? 0 : n_pages;
  }
  KVQ_CHECK(needed <= m.free().size(), "device KV cache pool exhausted: ", needed, " pages needed, ", m.free().size(),
            " free");
  const SeqId id = m.sequences().next_id;
  DeviceStore::Sequence& s = m.insert(id);
  const DeviceStore::Sequence& from = m.sequences().at(src);
  for (size_t l = 0; l < layers; ++l) {
    const std::vector<PageId>& pattern = from.layers[l].pages;
    if (pattern.empty()) continue;  // a layer the source never received stays empty
    m.take_pages(s.layers[l], n_pages);
    for (size_t j = 0; j < n_pages; ++j)
      KVQ_CUDA_CHECK(cudaMemcpyAsync(m.page(s.layers[l].pages[j]), m.page(pattern[j % pattern.size()]),
                                     m.layout().page_bytes, cudaMemcpyDeviceToDevice));
    if (from.layers[l].device->has_offset) {
      const size_t n = static_cast<size_t>(m.config().n_kv_heads) * m.config().head_dim;
      s.layers[l].device->key_offset = device_alloc<float>(n, "a key offset");
      KVQ_CUDA_CHECK(cudaMemcpy(s.layers[l].device->key_offset.get(), from.layers[l].device->key_offset.get(),
                                n * sizeof(float), cudaMemcpyDeviceToDevice));
      s.layers[l].device->has_offset = true;
    }
  }
  KVQ_CUDA_CHECK(cudaDeviceSynchronize());
  return id;
}

void detail::Backend::synchronize(const KVCache& cache) {
  detail::use_device(cache.cuda_->device);
  KVQ_CUDA_CHECK(cudaDeviceSynchronize());
}

KVCache::LayerState detail::Backend::host_layer(const KVCache& cache, const KVCache::LayerState& layer) {
  return cache.cuda_->host_layer(layer);
}

void detail::Backend::copy_to_host(const KVCache& cache, void* to, const void* from, size_t bytes) {
  detail::use_device(cache.cuda_->device);
  KVQ_CUDA_CHECK(cudaMemcpy(to, from, bytes, cudaMemcpyDeviceToHost));
}

// ---- device arrays and timing -------------------------------------------------------------------------------

DeviceFloats::DeviceFloats(size_t n, int device) : size_(n) {
  detail::use_device(device);
  data_ = device_alloc<float>(n, "a float array").release();
}
DeviceFloats::~DeviceFloats() { cudaFree(data_); }
DeviceFloats::DeviceFloats(DeviceFloats&& o) noexcept
    : data_(std::exchange(o.data_, nullptr)), size_(std::exchange(o.size_, 0)) {}
DeviceFloats& DeviceFloats::operator=(DeviceFloats&& o) noexcept {
  std::swap(data_, o.data_);
  std::swap(size_, o.size_);
  return *this;
}
void DeviceFloats::upload(std::span<const float> host) {
  KVQ_CHECK(host.size() == size_, "DeviceFloats::upload: ", host.size(), " floats into an array of ", size_);
  KVQ_CUDA_CHECK(cudaMemcpy(data_, host.data(), size_ * sizeof(float), cudaMemcpyHostToDevice));
}
std::vector<float> DeviceFloats::download() const {
  std::vector<float> host(size_);
  KVQ_CUDA_CHECK(cudaMemcpy(host.data(), data_, size_ * sizeof(float), cudaMemcpyDeviceToHost));
  return host;
}
void DeviceFloats::fill(float value) { upload(std::vector<float>(size_, value)); }

}  // namespace kvq::cuda

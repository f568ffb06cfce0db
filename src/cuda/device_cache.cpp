// The device-side KV cache: pages in one cudaMalloc'd pool with the CPU KVCache's layout, block tables, fp32 windows
// and key offsets in device memory (the host keeps the bookkeeping: page lists, window counts). Appends of tokens in
// device memory encode full pages with the append kernels (device_encoder.hpp) straight into the pool and move the
// rest into the window on the device; appends from host memory upload the tokens first.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <map>
#include <utility>

#include "cache/cache_builder.hpp"
#include "cache/key_offset.hpp"
#include "cache/residual_window.hpp"
#include "cuda/append_kernels.hpp"
#include "cuda/append_plan.hpp"
#include "cuda/device_encoder.hpp"
#include "cuda/device_memory.hpp"
#include "cuda/encode_layout.cuh"
#include "kvq/cuda.hpp"
#include "kvq/cuda_cache.hpp"
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

using detail::device_alloc;
using detail::DevicePtr;

namespace {

constexpr size_t kBlockAlign = 64;
size_t align64(size_t n) { return (n + kBlockAlign - 1) / kBlockAlign * kBlockAlign; }

std::unique_ptr<Codec> copy_codec(const Codec& c) {
  auto copy = make_codec(c.spec().str(), c.params());
  if (c.trained()) copy->load_state(c.state());  // an untrained codec (a layer not used yet) stays untrained
  return copy;
}

}  // namespace

struct DeviceKVCache::Impl {
  struct Layer {
    std::vector<PageId> pages;
    DevicePtr<PageId> pages_dev;
    size_t pages_capacity = 0;
    int window_count = 0;
    DevicePtr<float> window_dev;      // keys [H][slots][d], then values
    DevicePtr<float> key_offset_dev;  // centered keys (cache.hpp): [H][d] once the first page is encoded
    bool has_offset = false;
  };
  struct Sequence {
    std::vector<Layer> layers;
  };

  CacheConfig config;
  int device = 0;
  std::vector<std::unique_ptr<Codec>> key_codecs, value_codecs;
  size_t key_stride = 0, value_stride = 0, page_bytes = 0;
  DevicePtr<uint8_t> pool;
  std::vector<PageId> free;
  std::map<SeqId, Sequence> sequences;
  SeqId next_id = 0;
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

  void init(int dev) {
    device = dev;
    detail::use_device(device);
    key_stride = align64(key_codecs[0]->block_bytes());
    value_stride = align64(value_codecs[0]->block_bytes());
    page_bytes = static_cast<size_t>(config.n_kv_heads) * (key_stride + value_stride);
    pool = device_alloc<uint8_t>(config.capacity_pages * page_bytes,
                                 "the KV cache pool (" + std::to_string(config.capacity_pages) + " pages)");
    free.resize(config.capacity_pages);
    for (size_t i = 0; i < free.size(); ++i) free[i] = static_cast<PageId>(free.size() - 1 - i);
    for (int l = 0; l < config.n_layers; ++l) {
      key_why.emplace_back();
      value_why.emplace_back();
      key_encoders.push_back(detail::make_device_encoder(*key_codecs[static_cast<size_t>(l)], &key_why.back()));
      value_encoders.push_back(detail::make_device_encoder(*value_codecs[static_cast<size_t>(l)], &value_why.back()));
    }
    errors = device_alloc<unsigned long long>(4, "the append path's error flags");
    found = detail::pinned_alloc<unsigned long long>(4, "the append path's error flags");
  }
  size_t slots() const { return static_cast<size_t>(config.residual_tokens + config.block_tokens - 1); }
  size_t window_floats() const {
    return 2 * static_cast<size_t>(config.n_kv_heads) * slots() * static_cast<size_t>(config.head_dim);
  }
  void check_layer(int layer) const {
    KVQ_CHECK(layer >= 0 && layer < config.n_layers, "DeviceKVCache: layer ", layer, " out of range (0..",
              config.n_layers - 1, ")");
  }
  Sequence& sequence(SeqId seq) {
    const auto it = sequences.find(seq);
    KVQ_CHECK(it != sequences.end(), "DeviceKVCache: no sequence with id ", seq);
    return it->second;
  }
  Sequence& insert(SeqId id) {
    Sequence s;
    s.layers.resize(static_cast<size_t>(config.n_layers));
    // Block tables start with room for 128 pages, so that appends rarely reallocate (a synchronizing cudaMalloc).
    const size_t table = std::min<size_t>(128, config.capacity_pages);
    for (Layer& l : s.layers) {
      l.pages_dev = device_alloc<PageId>(table, "a block table");
      l.pages_capacity = table;
      l.window_dev = device_alloc<float>(window_floats(), "a sequence's fp32 window");
      KVQ_CUDA_CHECK(cudaMemset(l.window_dev.get(), 0, window_floats() * sizeof(float)));
    }
    return sequences.emplace(id, std::move(s)).first->second;
  }
  uint8_t* page(PageId id) const { return pool.get() + static_cast<size_t>(id) * page_bytes; }
  // Room for `need` entries in the layer's device block table. Growing it waits for the device: an append's
  // commit, queued on the caller's stream, may still be writing entries of the old table.
  void reserve_table(Layer& l, size_t need) {
    if (need > l.pages_capacity) {
      KVQ_CUDA_CHECK(cudaDeviceSynchronize());
      const size_t cap = std::max<size_t>(need, 2 * l.pages_capacity);
      DevicePtr<PageId> grown = device_alloc<PageId>(cap, "a block table");
      if (!l.pages.empty())
        KVQ_CUDA_CHECK(cudaMemcpy(grown.get(), l.pages_dev.get(), l.pages.size() * sizeof(PageId),
                                  cudaMemcpyDeviceToDevice));
      l.pages_dev = std::move(grown);
      l.pages_capacity = cap;
    }
  }
  void push_pages(Layer& l, const PageId* ids, size_t n, cudaStream_t stream = nullptr) {
    reserve_table(l, l.pages.size() + n);
    if (n > 0)
      KVQ_CUDA_CHECK(cudaMemcpyAsync(l.pages_dev.get() + l.pages.size(), ids, n * sizeof(PageId),
                                     cudaMemcpyHostToDevice, stream));
    l.pages.insert(l.pages.end(), ids, ids + n);
  }
  std::vector<float> download_window(const Layer& l) const {
    std::vector<float> w(window_floats());
    KVQ_CUDA_CHECK(cudaMemcpy(w.data(), l.window_dev.get(), w.size() * sizeof(float), cudaMemcpyDeviceToHost));
    return w;
  }
  void set_key_offset(Layer& l, const float* host) const {
    const size_t n = static_cast<size_t>(config.n_kv_heads) * config.head_dim;
    if (!l.key_offset_dev) l.key_offset_dev = device_alloc<float>(n, "a key offset");
    KVQ_CUDA_CHECK(cudaMemcpy(l.key_offset_dev.get(), host, n * sizeof(float), cudaMemcpyHostToDevice));
    l.has_offset = true;
  }
  void append_on_host(Layer& ls, int layer, SeqId seq, const float* keys, const float* values, size_t n_tokens);
  void append_batch(const char* who, std::span<const SeqId> seqs, int layer, const float* keys_dev,
                    const float* values_dev, std::span<const size_t> n_tokens, cudaStream_t stream);
};

DeviceKVCache::DeviceKVCache(const CacheConfig& config, int device) : impl_(std::make_unique<Impl>()) {
  detail::use_device(device);
  // The codecs (seeds, canonical specs, validation) exactly as the CPU cache builds them.
  CacheConfig one_page = config;
  one_page.capacity_pages = 1;
  const KVCache host(one_page);
  impl_->config = host.config();
  impl_->config.capacity_pages = config.capacity_pages;
  for (int l = 0; l < config.n_layers; ++l) {
    impl_->key_codecs.push_back(copy_codec(host.key_codec(l)));
    impl_->value_codecs.push_back(copy_codec(host.value_codec(l)));
  }
  impl_->init(device);
}

DeviceKVCache::DeviceKVCache(const KVCache& host, size_t capacity_pages, int device)
    : impl_(std::make_unique<Impl>()) {
  detail::use_device(device);
  Impl& m = *impl_;
  m.config = host.config();
  if (capacity_pages != 0) m.config.capacity_pages = capacity_pages;
  for (int l = 0; l < m.config.n_layers; ++l) {
    m.key_codecs.push_back(copy_codec(host.key_codec(l)));
    m.value_codecs.push_back(copy_codec(host.value_codec(l)));
  }
  m.init(device);
  KVQ_CHECK(m.page_bytes == host.page_bytes(), "DeviceKVCache: page layout differs from the host cache's");
  size_t needed = 0;
  for (SeqId id : host.sequences())
    for (int l = 0; l < m.config.n_layers; ++l) needed += host.view(id, l).pages.size();
  KVQ_CHECK(needed <= m.free.size(), "DeviceKVCache: the host cache holds ", needed, " pages but the device pool has ",
            m.free.size());
  const size_t d = static_cast<size_t>(m.config.head_dim), H = static_cast<size_t>(m.config.n_kv_heads);
  m.next_id = host.next_sequence_id();
  for (SeqId id : host.sequences()) {
    Impl::Sequence& s = m.insert(id);
    for (int l = 0; l < m.config.n_layers; ++l) {
      const LayerView v = host.view(id, l);
      Impl::Layer& dl = s.layers[static_cast<size_t>(l)];
      std::vector<PageId> ids(v.pages.size());
      for (size_t j = 0; j < ids.size(); ++j) {
        ids[j] = m.free.back();
        m.free.pop_back();
        KVQ_CUDA_CHECK(cudaMemcpy(m.page(ids[j]), host.page(v.pages[j]), m.page_bytes, cudaMemcpyHostToDevice));
      }
      m.push_pages(dl, ids.data(), ids.size());
      dl.window_count = v.residual_count;
      if (v.key_offset != nullptr) m.set_key_offset(dl, v.key_offset);
      const size_t head = m.slots() * d;
      std::vector<float> window(m.window_floats(), 0.0f);
      for (size_t h = 0; h < H; ++h) {
        std::memcpy(window.data() + h * head, v.residual_key(static_cast<int>(h)),
                    static_cast<size_t>(v.residual_count) * d * sizeof(float));
        std::memcpy(window.data() + (H + h) * head, v.residual_value(static_cast<int>(h)),
                    static_cast<size_t>(v.residual_count) * d * sizeof(float));
      }
      KVQ_CUDA_CHECK(cudaMemcpy(dl.window_dev.get(), window.data(), window.size() * sizeof(float),
                                cudaMemcpyHostToDevice));
    }
  }
}

DeviceKVCache::~DeviceKVCache() = default;
DeviceKVCache::DeviceKVCache(DeviceKVCache&&) noexcept = default;
DeviceKVCache& DeviceKVCache::operator=(DeviceKVCache&&) noexcept = default;

const CacheConfig& DeviceKVCache::config() const { return impl_->config; }
int DeviceKVCache::device() const { return impl_->device; }
const Codec& DeviceKVCache::key_codec(int layer) const {
  impl_->check_layer(layer);
  return *impl_->key_codecs[static_cast<size_t>(layer)];
}
const Codec& DeviceKVCache::value_codec(int layer) const {
  impl_->check_layer(layer);
  return *impl_->value_codecs[static_cast<size_t>(layer)];
}

SeqId DeviceKVCache::add_sequence() {
  detail::use_device(impl_->device);
  impl_->insert(impl_->next_id);
  return impl_->next_id++;
}

void DeviceKVCache::remove_sequence(SeqId seq) {
  Impl::Sequence& s = impl_->sequence(seq);
  for (const Impl::Layer& l : s.layers) impl_->free.insert(impl_->free.end(), l.pages.rbegin(), l.pages.rend());
  impl_->sequences.erase(seq);
}

bool DeviceKVCache::has_sequence(SeqId seq) const { return impl_->sequences.count(seq) != 0; }

std::vector<SeqId> DeviceKVCache::sequences() const {
  std::vector<SeqId> ids;
  for (const auto& entry : impl_->sequences) ids.push_back(entry.first);
  return ids;
}

size_t DeviceKVCache::length(SeqId seq, int layer) const {
  const DeviceLayerView v = view(seq, layer);
  return v.n_pages * static_cast<size_t>(impl_->config.block_tokens) + static_cast<size_t>(v.window_count);
}

void DeviceKVCache::append(SeqId seq, int layer, const float* keys, const float* values, size_t n_tokens) {
  Impl& m = *impl_;
  m.check_layer(layer);
  Impl::Layer& ls = m.sequence(seq).layers[static_cast<size_t>(layer)];
  if (n_tokens == 0) return;
  KVQ_CHECK(keys != nullptr && values != nullptr, "DeviceKVCache::append: null keys or values");
  detail::use_device(m.device);
  const size_t l = static_cast<size_t>(layer);
  for (const Codec* c : {m.key_codecs[l].get(), m.value_codecs[l].get()})
    KVQ_CHECK(c->trained(), "DeviceKVCache::append: layer ", layer, " codec '", c->spec().str(),
              "' needs training (train a host KVCache and copy it)");
  if (!m.key_encoders[l] || !m.value_encoders[l]) {
    // A codec without an append kernel: the tokens are on the host already, so its CPU encoder does the work.
    m.append_on_host(ls, layer, seq, keys, values, n_tokens);
    return;
  }
  const size_t n = n_tokens * static_cast<size_t>(m.config.n_kv_heads) * m.config.head_dim;
  if (2 * n > m.upload_capacity) {
    m.upload = device_alloc<float>(2 * n, "the uploaded tokens of an append");
    m.upload_capacity = 2 * n;
  }
  KVQ_CUDA_CHECK(cudaMemcpy(m.upload.get(), keys, n * sizeof(float), cudaMemcpyHostToDevice));
  KVQ_CUDA_CHECK(cudaMemcpy(m.upload.get() + n, values, n * sizeof(float), cudaMemcpyHostToDevice));
  append_device(seq, layer, m.upload.get(), m.upload.get() + n, n_tokens);
  KVQ_CUDA_CHECK(cudaDeviceSynchronize());
}

void DeviceKVCache::Impl::append_on_host(Layer& ls, int layer, SeqId seq, const float* keys, const float* values,
                                         size_t n_tokens) {
  const Codec& kc = *key_codecs[static_cast<size_t>(layer)];
  const Codec& vc = *value_codecs[static_cast<size_t>(layer)];
  const size_t H = static_cast<size_t>(config.n_kv_heads), d = static_cast<size_t>(config.head_dim);
  const size_t T = static_cast<size_t>(config.block_tokens), R = static_cast<size_t>(config.residual_tokens);
  for (const float* x : {keys, values})
    for (size_t i = 0; i < n_tokens * H * d; ++i)
      KVQ_CHECK(std::isfinite(x[i]), "DeviceKVCache::append: ", x == keys ? "key" : "value", " of token ",
                i / (H * d), " head ", i / d % H, " channel ", i % d, " is ", x[i], " (NaN and Inf are rejected)");
  const size_t u = static_cast<size_t>(ls.window_count), total = u + n_tokens;
  const size_t n_pages = total >= R + T ? (total - R - T) / T + 1 : 0;
  KVQ_CHECK(n_pages <= free.size(), "device KV cache pool exhausted: appending ", n_tokens, " tokens to sequence ",
            seq, " layer ", layer, " needs ", n_pages, " new pages but ", free.size(), " of ", config.capacity_pages,
            " are free");

  const size_t n_slots = slots();
  std::vector<float> window = download_window(ls);
  std::vector<float> offset;
  if (ls.has_offset) {
    offset.resize(H * d);
    KVQ_CUDA_CHECK(cudaMemcpy(offset.data(), ls.key_offset_dev.get(), H * d * sizeof(float), cudaMemcpyDeviceToHost));
  }
  float* window_k = window.data();
  float* window_v = window_k + H * n_slots * d;
  kvq::detail::CenteredKeys centered(kvq::detail::centers_keys(config), offset, window_k, H, n_slots, d, u, keys,
                                     n_tokens, T, n_pages > 0);
  auto stream_token = [&](const float* w, const float* fresh, size_t idx, size_t h) {
    return idx < u ? w + (h * n_slots + idx) * d : fresh + ((idx - u) * H + h) * d;
  };
  // Encode every new page on the host first: if an encoder throws, nothing has changed.
  std::vector<uint8_t> staged(n_pages * page_bytes, 0);
  std::vector<float> block(T * d);
  for (size_t j = 0; j < n_pages; ++j) {
    uint8_t* p = staged.data() + j * page_bytes;
    for (size_t h = 0; h < H; ++h) {
      for (size_t t = 0; t < T; ++t)
        std::memcpy(block.data() + t * d, stream_token(centered.window(), centered.fresh(), j * T + t, h),
                    d * sizeof(float));
      kc.encode(block.data(), static_cast<int>(T), p + h * key_stride);
      for (size_t t = 0; t < T; ++t)
        std::memcpy(block.data() + t * d, stream_token(window_v, values, j * T + t, h), d * sizeof(float));
      vc.encode(block.data(), static_cast<int>(T), p + H * key_stride + h * value_stride);
    }
  }
  std::vector<PageId> ids(free.end() - static_cast<ptrdiff_t>(n_pages), free.end());
  std::reverse(ids.begin(), ids.end());
  for (size_t j = 0; j < n_pages; ++j)
    KVQ_CUDA_CHECK(cudaMemcpy(page(ids[j]), staged.data() + j * page_bytes, page_bytes, cudaMemcpyHostToDevice));
  push_pages(ls, ids.data(), n_pages);
  free.resize(free.size() - n_pages);

  const size_t encoded = n_pages * T;
  centered.commit(window_k, offset);
  if (!offset.empty() && !ls.has_offset) set_key_offset(ls, offset.data());
  kvq::detail::advance_window(window_k, H, n_slots, d, u, encoded, centered.fresh(), n_tokens);
  kvq::detail::advance_window(window_v, H, n_slots, d, u, encoded, values, n_tokens);
  ls.window_count = static_cast<int>(total - encoded);
  KVQ_CUDA_CHECK(cudaMemcpy(ls.window_dev.get(), window.data(), window.size() * sizeof(float),
                            cudaMemcpyHostToDevice));
}

void DeviceKVCache::append_device(SeqId seq, int layer, const float* keys_dev, const float* values_dev,
                                  size_t n_tokens, void* stream) {
  impl_->append_batch("DeviceKVCache::append_device", {&seq, 1}, layer, keys_dev, values_dev, {&n_tokens, 1},
                      static_cast<cudaStream_t>(stream));
}

void DeviceKVCache::append_device_batch(std::span<const SeqId> seqs, int layer, const float* keys_dev,
                                        const float* values_dev, std::span<const size_t> n_tokens, void* stream) {
  impl_->append_batch("DeviceKVCache::append_device_batch", seqs, layer, keys_dev, values_dev, n_tokens,
                      static_cast<cudaStream_t>(stream));
}

namespace {

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

}  // namespace

void DeviceKVCache::Impl::append_batch(const char* who, std::span<const SeqId> seqs, int layer, const float* keys_dev,
                                       const float* values_dev, std::span<const size_t> n_tokens,
                                       cudaStream_t st) {
  // Every check before anything is launched: on any error the cache stays as it was for every sequence.
  check_layer(layer);
  KVQ_CHECK(seqs.size() == n_tokens.size(), who, ": ", seqs.size(), " sequences but ", n_tokens.size(),
            " token counts");
  KVQ_CHECK(seqs.size() <= detail::kMaxAppendBatch, who, ": ", seqs.size(), " sequences in one batch (at most ",
            detail::kMaxAppendBatch, ")");
  std::vector<Layer*> layers;
  for (const SeqId id : seqs) layers.push_back(&sequence(id).layers[static_cast<size_t>(layer)]);
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
  for (const Codec* c : {key_codecs[l].get(), value_codecs[l].get()})
    KVQ_CHECK(c->trained(), who, ": layer ", layer, " codec '", c->spec().str(),
              "' needs training (train a host KVCache and copy it)");
  KVQ_CHECK(keys_dev != nullptr && values_dev != nullptr, who, ": null keys or values");
  for (const float* x : {keys_dev, values_dev})
    KVQ_CHECK(reinterpret_cast<uintptr_t>(x) % 16 == 0, who, ": the ", x == keys_dev ? "keys" : "values",
              " must be 16-byte aligned device memory");
  int current = -1;
  if (cudaGetDevice(&current) != cudaSuccess || current != device) detail::use_device(device);
  const int H = config.n_kv_heads, d = config.head_dim, T = config.block_tokens;
  const size_t uT = static_cast<size_t>(T), hd = static_cast<size_t>(H) * d;
  const bool centered = kvq::detail::centers_keys(config);
  std::vector<detail::SequenceChunk> chunks;
  for (size_t i = 0; i < seqs.size(); ++i)
    chunks.push_back({static_cast<size_t>(layers[i]->window_count), n_tokens[i], layers[i]->has_offset});
  const detail::AppendPlan plan =
      detail::plan_append(chunks, uT, static_cast<size_t>(config.residual_tokens), centered);
  if (plan.pages > free.size()) {
    const std::string what = seqs.size() == 1
                                 ? kvq::detail::concat(sum, " tokens to sequence ", seqs[0], " layer ", layer)
                                 : kvq::detail::concat(sum, " tokens to ", seqs.size(), " sequences of layer ", layer);
    throw Error(kvq::detail::concat("device KV cache pool exhausted: appending ", what, " needs ", plan.pages,
                                    " new pages but ", free.size(), " of ", config.capacity_pages, " are free"));
  }
  KVQ_CHECK(plan.pages * uT <= 0xffffffffull, who, ": ", plan.pages, " new pages in one batch (at most ",
            0xffffffffull / uT, ")");

  // Room for what the launches write (allocations only: nothing a reader sees changes).
  std::vector<size_t> gathered, moved, offsets;  // sequences with a gather, a window move, a new key offset
  size_t max_gather = 0, max_move = 0;
  for (size_t i = 0; i < seqs.size(); ++i) {
    const detail::SequencePlan& p = plan.seqs[i];
    reserve_table(*layers[i], layers[i]->pages.size() + p.n_pages);
    if (p.new_offset && !layers[i]->key_offset_dev) layers[i]->key_offset_dev = device_alloc<float>(hd, "a key offset");
    if (p.gather_count > 0) {
      gathered.push_back(i);
      max_gather = std::max(max_gather, p.gather_count);
    }
    if (p.through_scratch) {
      moved.push_back(i);
      max_move = std::max(max_move, p.kept);
    }
    if (p.new_offset) offsets.push_back(i);
  }
  // A buffer outgrown is replaced only once no earlier append's commit (queued on any stream) can still read it.
  const size_t scratch_floats = 2 * hd * plan.scratch_tokens;
  const StagingLayout lay(seqs.size(), plan.pages, gathered.size(), offsets.size(), moved.size());
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

  // The descriptors: streams, pages (the free list's next pages, in batch order), gathers, key means, moves.
  uint8_t* host = staging_host.get();
  uint8_t* dev = staging_dev.get();
  const size_t slots_n = slots();
  const int n_slots = static_cast<int>(slots_n);
  float* scratch = window_scratch.get();
  for (size_t i = 0; i < seqs.size(); ++i) {
    const detail::SequencePlan& p = plan.seqs[i];
    Layer& ls = *layers[i];
    float* window_k = ls.window_dev.get();
    const float* offset = centered && (ls.has_offset || p.new_offset) ? ls.key_offset_dev.get() : nullptr;
    at<detail::EncodeStream>(host, lay.key_streams)[i] = {window_k, keys_dev + p.fresh_first * hd, offset,
                                                          static_cast<int>(p.used), p.new_offset};
    at<detail::EncodeStream>(host, lay.value_streams)[i] = {window_k + hd * slots_n, values_dev + p.fresh_first * hd,
                                                            nullptr, static_cast<int>(p.used), false};
    at<PageId*>(host, lay.table_ends)[i] = ls.pages_dev.get() + ls.pages.size();
    for (size_t j = 0; j < p.n_pages; ++j)
      at<detail::EncodePage>(host, lay.pages)[p.first_page + j] = {
          static_cast<uint32_t>(i), static_cast<uint32_t>(j * uT), free[free.size() - 1 - (p.first_page + j)]};
  }
  for (size_t g = 0; g < gathered.size(); ++g) {
    const size_t i = gathered[g];
    const detail::SequencePlan& p = plan.seqs[i];
    float* to = p.through_scratch ? scratch + 2 * hd * p.scratch_first : layers[i]->window_dev.get();
    at<detail::WindowGather>(host, lay.gathers)[g] = {
        static_cast<uint32_t>(i), static_cast<uint32_t>(p.gather_first), static_cast<uint32_t>(p.gather_count), to,
        p.through_scratch ? static_cast<int>(p.kept) : n_slots, static_cast<int>(p.window_slot)};
  }
  for (size_t k = 0; k < offsets.size(); ++k)
    at<detail::KeyMean>(host, lay.means)[k] = {static_cast<uint32_t>(offsets[k]),
                                               layers[offsets[k]]->key_offset_dev.get()};
  for (size_t k = 0; k < moved.size(); ++k) {
    const detail::SequencePlan& p = plan.seqs[moved[k]];
    at<detail::WindowMove>(host, lay.moves)[k] = {scratch + 2 * hd * p.scratch_first,
                                                  layers[moved[k]]->window_dev.get(), static_cast<int>(p.kept)};
  }

  // One pass over the fresh tokens: the key offsets, the pages (encoded into free pages) and the tokens that stay
  // unencoded (behind the windows' used slots or into the scratch), NaN and Inf noted on the way. No reader sees
  // any of it before the checks below pass.
  KVQ_CUDA_CHECK(cudaMemcpyAsync(dev, host, lay.bytes, cudaMemcpyHostToDevice, st));
  unsigned long long* err = errors.get();
  KVQ_CUDA_CHECK(cudaMemsetAsync(err, 0xff, 4 * sizeof(unsigned long long), st));
  const detail::EncodeSource ks{at<detail::EncodeStream>(dev, lay.key_streams), keys_dev, H, n_slots, d, T};
  const detail::EncodeSource vs{at<detail::EncodeStream>(dev, lay.value_streams), values_dev, H, n_slots, d, T};
  const auto* pages = at<detail::EncodePage>(dev, lay.pages);
  detail::launch_key_means(ks, at<detail::KeyMean>(dev, lay.means), offsets.size(), st);
  if (plan.pages > 0) {
    const detail::EncodeRole kr{ks, {pool.get(), page_bytes, 0, key_stride, key_codecs[l]->block_bytes()}, pages,
                                err + 2, err};
    const detail::EncodeRole vr{
        vs, {pool.get(), page_bytes, static_cast<size_t>(H) * key_stride, value_stride, value_codecs[l]->block_bytes()},
        pages, err + 3, err + 1};
    if (!key_encoders[l]->encode(kr, value_encoders[l].get(), &vr, plan.pages, st))
      value_encoders[l]->encode(vr, nullptr, nullptr, plan.pages, st);
  }
  detail::launch_gather_windows(ks, vs, at<detail::WindowGather>(dev, lay.gathers), gathered.size(), max_gather, err,
                                st);
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
    throw Error(kvq::detail::concat(who, ": ", (role == 0 ? key_codecs[l] : value_codecs[l])->spec().str(),
                                    ": sequence ", seqs[where.seq], ": ", role == 0 ? "key" : "value", " of ",
                                    where.in_window ? "window token " : "token ", where.index, " head ",
                                    (e >> 16) & 0xffff, " channel ", e & 0xffff,
                                    " is beyond what the codec's fp16 fields can hold"));
  }

  // Commit: the pages join the block tables, the windows take their gathered tokens, the key offsets are set.
  detail::launch_place_page_ids(pages, plan.pages, at<PageId*>(dev, lay.table_ends), T, st);
  detail::launch_move_windows(at<detail::WindowMove>(dev, lay.moves), moved.size(), max_move, H, n_slots, d, st);
  for (size_t i = 0; i < seqs.size(); ++i) {
    const detail::SequencePlan& p = plan.seqs[i];
    Layer& ls = *layers[i];
    for (size_t j = 0; j < p.n_pages; ++j) ls.pages.push_back(free[free.size() - 1 - (p.first_page + j)]);
    ls.window_count = static_cast<int>(p.kept);
    ls.has_offset = ls.has_offset || p.new_offset;
  }
  free.resize(free.size() - plan.pages);
}

SeqId add_sequence_repeating(DeviceKVCache& cache, SeqId src, size_t n_tokens) {
  using Impl = DeviceKVCache::Impl;
  Impl& m = *cache.impl_;
  detail::use_device(m.device);
  const size_t T = static_cast<size_t>(m.config.block_tokens);
  KVQ_CHECK(n_tokens % T == 0, "add_sequence_repeating: ", n_tokens, " tokens is not a multiple of the page size ", T);
  const size_t n_pages = n_tokens / T, layers = static_cast<size_t>(m.config.n_layers);
  size_t needed = 0;
  for (const Impl::Layer& l : m.sequence(src).layers) {
    KVQ_CHECK(l.window_count == 0, "add_sequence_repeating: sequence ", src,
              " must hold whole pages only (", l.window_count, " window tokens)");
    needed += l.pages.empty() ? 0 : n_pages;
  }
  KVQ_CHECK(needed <= m.free.size(), "device KV cache pool exhausted: ", needed, " pages needed, ", m.free.size(),
            " free");
  const SeqId id = m.next_id++;
  Impl::Sequence& s = m.insert(id);
  const Impl::Sequence& from = m.sequence(src);
  for (size_t l = 0; l < layers; ++l) {
    std::vector<PageId> ids(n_pages);
    const std::vector<PageId>& pattern = from.layers[l].pages;
    if (pattern.empty()) continue;  // a layer the source never received stays empty
    for (size_t j = 0; j < n_pages; ++j) {
      ids[j] = m.free.back();
      m.free.pop_back();
      KVQ_CUDA_CHECK(cudaMemcpyAsync(m.page(ids[j]), m.page(pattern[j % pattern.size()]), m.page_bytes,
                                     cudaMemcpyDeviceToDevice));
    }
    m.push_pages(s.layers[l], ids.data(), n_pages);
    if (from.layers[l].has_offset) {
      const size_t n = static_cast<size_t>(m.config.n_kv_heads) * m.config.head_dim;
      s.layers[l].key_offset_dev = device_alloc<float>(n, "a key offset");
      KVQ_CUDA_CHECK(cudaMemcpy(s.layers[l].key_offset_dev.get(), from.layers[l].key_offset_dev.get(),
                                n * sizeof(float), cudaMemcpyDeviceToDevice));
      s.layers[l].has_offset = true;
    }
  }
  KVQ_CUDA_CHECK(cudaDeviceSynchronize());
  return id;
}

KVCache DeviceKVCache::to_host(size_t capacity_pages) const {
  const Impl& m = *impl_;
  detail::use_device(m.device);
  KVQ_CUDA_CHECK(cudaDeviceSynchronize());  // appends' commits queued on any stream
  CacheConfig config = m.config;
  if (capacity_pages != 0) config.capacity_pages = capacity_pages;
  size_t needed = 0;
  for (const auto& [id, s] : m.sequences)
    for (const Impl::Layer& l : s.layers) needed += l.pages.size();
  KVQ_CHECK(needed <= config.capacity_pages, "DeviceKVCache::to_host: the device cache holds ", needed,
            " pages but the host pool would have ", config.capacity_pages);
  kvq::detail::CacheBuilder builder(config);
  for (int l = 0; l < m.config.n_layers; ++l)
    builder.load_codecs(l, *m.key_codecs[static_cast<size_t>(l)], *m.value_codecs[static_cast<size_t>(l)]);
  const size_t hd = static_cast<size_t>(m.config.n_kv_heads) * m.config.head_dim;
  std::vector<uint8_t> pages;
  std::vector<float> offset(hd);
  for (const auto& [id, s] : m.sequences) {
    builder.add_sequence(id);
    for (int l = 0; l < m.config.n_layers; ++l) {
      const Impl::Layer& dl = s.layers[static_cast<size_t>(l)];
      pages.resize(dl.pages.size() * m.page_bytes);
      for (size_t j = 0; j < dl.pages.size(); ++j)
        KVQ_CUDA_CHECK(cudaMemcpy(pages.data() + j * m.page_bytes, m.page(dl.pages[j]), m.page_bytes,
                                  cudaMemcpyDeviceToHost));
      const std::vector<float> window = m.download_window(dl);
      if (dl.has_offset)
        KVQ_CUDA_CHECK(cudaMemcpy(offset.data(), dl.key_offset_dev.get(), hd * sizeof(float), cudaMemcpyDeviceToHost));
      builder.fill_layer(id, l, pages.data(), dl.pages.size(), window.data(), m.slots(), dl.window_count,
                         dl.has_offset ? offset.data() : nullptr);
    }
  }
  builder.set_next_id(m.next_id);
  return builder.finish();
}

size_t DeviceKVCache::page_bytes() const { return impl_->page_bytes; }
size_t DeviceKVCache::key_block_offset(int head) const { return static_cast<size_t>(head) * impl_->key_stride; }
size_t DeviceKVCache::value_block_offset(int head) const {
  return static_cast<size_t>(impl_->config.n_kv_heads) * impl_->key_stride +
         static_cast<size_t>(head) * impl_->value_stride;
}
size_t DeviceKVCache::residual_slots() const { return impl_->slots(); }
size_t DeviceKVCache::free_pages() const { return impl_->free.size(); }
size_t DeviceKVCache::capacity_pages() const { return impl_->config.capacity_pages; }
const uint8_t* DeviceKVCache::device_pool() const { return impl_->pool.get(); }

DeviceLayerView DeviceKVCache::view(SeqId seq, int layer) const {
  impl_->check_layer(layer);
  const Impl::Layer& l = impl_->sequence(seq).layers[static_cast<size_t>(layer)];
  return {l.pages_dev.get(), l.pages.size(), l.window_dev.get(), l.window_count};
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

// The device-side KV cache: pages in one cudaMalloc'd pool with the CPU KVCache's layout, block tables and fp32
// windows in device memory mirrored by host copies (the host keeps the bookkeeping; the kernels read the device).
// Appends encode on the host with the CPU codecs, then copy the new pages and the window.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <utility>

#include "cache/key_offset.hpp"
#include "cache/residual_window.hpp"
#include "cuda/device_memory.hpp"
#include "kvq/cuda.hpp"
#include "kvq/cuda_cache.hpp"
#include "kvq/random.hpp"

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
    std::vector<float> window;  // keys [H][slots][d], then values
    DevicePtr<float> window_dev;
    std::vector<float> key_offset;  // centered keys (cache.hpp): [H][d] once the first page is encoded
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
    for (Layer& l : s.layers) {
      l.window.assign(window_floats(), 0.0f);
      l.window_dev = device_alloc<float>(window_floats(), "a sequence's fp32 window");
      KVQ_CUDA_CHECK(cudaMemset(l.window_dev.get(), 0, window_floats() * sizeof(float)));
    }
    return sequences.emplace(id, std::move(s)).first->second;
  }
  uint8_t* page(PageId id) const { return pool.get() + static_cast<size_t>(id) * page_bytes; }
  // Takes n pages off the free list (checked by the caller) and appends them to the layer's block table.
  void push_pages(Layer& l, const PageId* ids, size_t n) {
    const size_t need = l.pages.size() + n;
    if (need > l.pages_capacity) {
      const size_t cap = std::max<size_t>(need, 2 * l.pages_capacity);
      DevicePtr<PageId> grown = device_alloc<PageId>(cap, "a block table");
      if (!l.pages.empty())
        KVQ_CUDA_CHECK(cudaMemcpy(grown.get(), l.pages_dev.get(), l.pages.size() * sizeof(PageId),
                                  cudaMemcpyDeviceToDevice));
      l.pages_dev = std::move(grown);
      l.pages_capacity = cap;
    }
    KVQ_CUDA_CHECK(cudaMemcpy(l.pages_dev.get() + l.pages.size(), ids, n * sizeof(PageId), cudaMemcpyHostToDevice));
    l.pages.insert(l.pages.end(), ids, ids + n);
  }
  void upload_window(Layer& l) const {
    KVQ_CUDA_CHECK(cudaMemcpy(l.window_dev.get(), l.window.data(), l.window.size() * sizeof(float),
                              cudaMemcpyHostToDevice));
  }
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
  for (SeqId id : host.sequences()) {
    Impl::Sequence& s = m.insert(id);
    m.next_id = std::max(m.next_id, id + 1);
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
      if (v.key_offset != nullptr) dl.key_offset.assign(v.key_offset, v.key_offset + H * d);
      const size_t head = m.slots() * d;
      for (size_t h = 0; h < H; ++h) {
        std::memcpy(dl.window.data() + h * head, v.residual_key(static_cast<int>(h)),
                    static_cast<size_t>(v.residual_count) * d * sizeof(float));
        std::memcpy(dl.window.data() + (H + h) * head, v.residual_value(static_cast<int>(h)),
                    static_cast<size_t>(v.residual_count) * d * sizeof(float));
      }
      m.upload_window(dl);
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
  const Codec& kc = *m.key_codecs[static_cast<size_t>(layer)];
  const Codec& vc = *m.value_codecs[static_cast<size_t>(layer)];
  for (const Codec* c : {&kc, &vc})
    KVQ_CHECK(c->trained(), "DeviceKVCache::append: layer ", layer, " codec '", c->spec().str(),
              "' needs training (train a host KVCache and copy it)");
  const size_t H = static_cast<size_t>(m.config.n_kv_heads), d = static_cast<size_t>(m.config.head_dim);
  const size_t T = static_cast<size_t>(m.config.block_tokens), R = static_cast<size_t>(m.config.residual_tokens);
  for (const float* x : {keys, values})
    for (size_t i = 0; i < n_tokens * H * d; ++i)
      KVQ_CHECK(std::isfinite(x[i]), "DeviceKVCache::append: ", x == keys ? "key" : "value", " of token ",
                i / (H * d), " head ", i / d % H, " channel ", i % d, " is ", x[i], " (NaN and Inf are rejected)");
  const size_t u = static_cast<size_t>(ls.window_count), total = u + n_tokens;
  const size_t n_pages = total >= R + T ? (total - R - T) / T + 1 : 0;
  KVQ_CHECK(n_pages <= m.free.size(), "device KV cache pool exhausted: appending ", n_tokens, " tokens to sequence ",
            seq, " layer ", layer, " needs ", n_pages, " new pages but ", m.free.size(), " of ",
            m.config.capacity_pages, " are free");

  const size_t slots = m.slots();
  float* window_k = ls.window.data();
  float* window_v = window_k + H * slots * d;
  kvq::detail::CenteredKeys centered(kvq::detail::centers_keys(m.config), ls.key_offset, window_k, H, slots, d, u, keys, n_tokens,
                                     T, n_pages > 0);
  auto stream_token = [&](const float* window, const float* fresh, size_t idx, size_t h) {
    return idx < u ? window + (h * slots + idx) * d : fresh + ((idx - u) * H + h) * d;
  };
  // Encode every new page on the host first: if an encoder throws, nothing has changed.
  std::vector<uint8_t> staged(n_pages * m.page_bytes, 0);
  std::vector<float> block(T * d);
  for (size_t j = 0; j < n_pages; ++j) {
    uint8_t* p = staged.data() + j * m.page_bytes;
    for (size_t h = 0; h < H; ++h) {
      for (size_t t = 0; t < T; ++t)
        std::memcpy(block.data() + t * d, stream_token(centered.window(), centered.fresh(), j * T + t, h),
                    d * sizeof(float));
      kc.encode(block.data(), static_cast<int>(T), p + h * m.key_stride);
      for (size_t t = 0; t < T; ++t)
        std::memcpy(block.data() + t * d, stream_token(window_v, values, j * T + t, h), d * sizeof(float));
      vc.encode(block.data(), static_cast<int>(T), p + H * m.key_stride + h * m.value_stride);
    }
  }
  std::vector<PageId> ids(m.free.end() - static_cast<ptrdiff_t>(n_pages), m.free.end());
  std::reverse(ids.begin(), ids.end());
  for (size_t j = 0; j < n_pages; ++j)
    KVQ_CUDA_CHECK(cudaMemcpy(m.page(ids[j]), staged.data() + j * m.page_bytes, m.page_bytes, cudaMemcpyHostToDevice));
  m.push_pages(ls, ids.data(), n_pages);
  m.free.resize(m.free.size() - n_pages);

  const size_t encoded = n_pages * T;
  centered.commit(window_k, ls.key_offset);
  kvq::detail::advance_window(window_k, H, slots, d, u, encoded, centered.fresh(), n_tokens);
  kvq::detail::advance_window(window_v, H, slots, d, u, encoded, values, n_tokens);
  ls.window_count = static_cast<int>(total - encoded);
  m.upload_window(ls);
}

SeqId DeviceKVCache::add_sequence_repeating(SeqId src, size_t n_tokens) {
  Impl& m = *impl_;
  detail::use_device(m.device);
  const size_t T = static_cast<size_t>(m.config.block_tokens);
  KVQ_CHECK(n_tokens % T == 0, "DeviceKVCache::add_sequence_repeating: ", n_tokens,
            " tokens is not a multiple of the page size ", T);
  const size_t n_pages = n_tokens / T, layers = static_cast<size_t>(m.config.n_layers);
  size_t needed = 0;
  for (const Impl::Layer& l : m.sequence(src).layers) {
    KVQ_CHECK(l.window_count == 0, "DeviceKVCache::add_sequence_repeating: sequence ", src,
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
    s.layers[l].key_offset = from.layers[l].key_offset;
  }
  KVQ_CUDA_CHECK(cudaDeviceSynchronize());
  return id;
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

double median_ms(const std::function<void()>& work, int reps, int warmup) {
  KVQ_CHECK(reps > 0, "median_ms: reps = ", reps);
  for (int i = 0; i < warmup; ++i) work();
  cudaEvent_t start = nullptr, stop = nullptr;
  KVQ_CUDA_CHECK(cudaEventCreate(&start));
  KVQ_CUDA_CHECK(cudaEventCreate(&stop));
  std::vector<float> ms(static_cast<size_t>(reps));
  for (float& t : ms) {
    KVQ_CUDA_CHECK(cudaEventRecord(start));
    work();
    KVQ_CUDA_CHECK(cudaEventRecord(stop));
    KVQ_CUDA_CHECK(cudaEventSynchronize(stop));
    KVQ_CUDA_CHECK(cudaEventElapsedTime(&t, start, stop));
  }
  cudaEventDestroy(start);
  cudaEventDestroy(stop);
  std::nth_element(ms.begin(), ms.begin() + reps / 2, ms.end());
  return ms[static_cast<size_t>(reps / 2)];
}

double copy_bandwidth_gbps(size_t bytes, int reps, int device) {
  detail::use_device(device);
  // Several buffer pairs, rotated, so that a buffer smaller than ~3x L2 is not served from the cache.
  constexpr int kPairs = 2;
  std::vector<DevicePtr<uint8_t>> src, dst;
  for (int i = 0; i < kPairs; ++i) {
    src.push_back(device_alloc<uint8_t>(bytes, "the copy-bandwidth source"));
    dst.push_back(device_alloc<uint8_t>(bytes, "the copy-bandwidth destination"));
    KVQ_CUDA_CHECK(cudaMemset(src.back().get(), 0x5a + i, bytes));
  }
  int next = 0;
  const double ms = median_ms(
      [&] {
        KVQ_CUDA_CHECK(cudaMemcpyAsync(dst[next].get(), src[next].get(), bytes, cudaMemcpyDeviceToDevice));
        next = (next + 1) % kPairs;
      },
      reps);
  return 2.0 * static_cast<double>(bytes) / (ms * 1e6);
}

}  // namespace kvq::cuda

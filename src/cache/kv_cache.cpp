#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <new>
#include <vector>

#if defined(__linux__)
#include <sys/mman.h>
#endif

#include "cache/cache_builder.hpp"
#include "cache/cuda_backend.hpp"
#include "cache/key_offset.hpp"
#include "cache/residual_window.hpp"
#include "core/finite.hpp"
#include "core/half.hpp"
#include "core/system_memory.hpp"
#include "kvq/cache.hpp"
#include "kvq/detail/random.hpp"
#include "kvq/error.hpp"

namespace kvq {
namespace {

// Asks for 2 MiB pages under the pool where the system grants them on request (Linux transparent huge pages in
// "madvise" mode): attention streams the pool, and with 4 KiB pages it read about 20% slower (TLB misses, and the
// hardware prefetchers stop at every page boundary). Advice only: a refusal changes nothing.
void advise_huge_pages(uint8_t* p, size_t bytes) {
#if defined(__linux__) && defined(MADV_HUGEPAGE)
  constexpr uintptr_t kHuge = uintptr_t{2} << 20;
  const uintptr_t start = reinterpret_cast<uintptr_t>(p), end = (start + bytes) & ~(kHuge - 1);
  const uintptr_t first = (start + kHuge - 1) & ~(kHuge - 1);
  if (end > first) madvise(reinterpret_cast<void*>(first), end - first, MADV_HUGEPAGE);
#else
  (void)p, (void)bytes;
#endif
}

void validate(const CacheConfig& c) {
  KVQ_CHECK(c.n_layers >= 1 && c.n_layers <= 4096, "KVCache: n_layers = ", c.n_layers, " (need 1..4096)");
  KVQ_CHECK(c.n_kv_heads >= 1 && c.n_kv_heads <= 1024, "KVCache: n_kv_heads = ", c.n_kv_heads, " (need 1..1024)");
  KVQ_CHECK(c.block_tokens == 64 || c.block_tokens == 128, "KVCache: block_tokens = ", c.block_tokens,
            " (pages hold 64 or 128 tokens)");
  KVQ_CHECK(c.residual_tokens >= 0 && c.residual_tokens <= 65536 && c.residual_tokens % c.block_tokens == 0,
            "KVCache: residual_tokens = ", c.residual_tokens, " (need a multiple of block_tokens = ", c.block_tokens,
            ", at most 65536)");
  KVQ_CHECK(c.sink_tokens >= 0 && c.sink_tokens <= kMaxSinkTokens, "KVCache: sink_tokens = ", c.sink_tokens,
            " (need 0..", kMaxSinkTokens, ": the first tokens of each sequence kept in f16)");
  KVQ_CHECK(c.capacity_pages <= std::numeric_limits<PageId>::max(), "KVCache: capacity_pages = ", c.capacity_pages,
            " exceeds the page id range");
}

}  // namespace

namespace {

// The pool is anonymous memory mapped without reserving swap: a page of it costs memory once it is written, so a
// pool is address space until used (and loading a file costs what the file holds).
uint8_t* map_pool(size_t bytes) {
#if defined(__linux__)
  void* p = ::mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  return p == MAP_FAILED ? nullptr : static_cast<uint8_t*>(p);
#else
  return static_cast<uint8_t*>(::operator new[](bytes, std::align_val_t{detail::PageLayout::kAlign}, std::nothrow));
#endif
}

// A per-head buffer of 2 H rows (keys, then values) of `slots` tokens of d each, regrown to new_slots with the
// first `held` tokens of every row kept.
template <class T>
void regrow_rows(std::vector<T>& rows, size_t n_rows, size_t slots, size_t held, size_t new_slots, size_t d) {
  std::vector<T> grown(n_rows * new_slots * d, T{});
  for (size_t row = 0; row < n_rows; ++row)
    std::copy_n(rows.data() + row * slots * d, held * d, grown.data() + row * new_slots * d);
  rows = std::move(grown);
}

}  // namespace

bool centering_applies(const std::string& key_codec) {
  const std::string name = CodecSpec::parse(key_codec).name;
  return name != "f32" && name != "f16" && name != "bf16";
}

void KVCache::PoolDeleter::operator()(uint8_t* p) const {
#if defined(__linux__)
  ::munmap(p, bytes);
#else
  ::operator delete[](p, std::align_val_t{detail::PageLayout::kAlign});
#endif
}

KVCache::KVCache(const CacheConfig& config, Device device) : config_(config), device_(device) {
  validate(config_);
  config_.key_codec = CodecSpec::parse(config.key_codec).str();
  config_.value_codec = CodecSpec::parse(config.value_codec).str();
  for (int l = 0; l < config_.n_layers; ++l) {
    const uint64_t layer_seed = derive_seed(config_.seed, static_cast<uint64_t>(l));
    key_codecs_.push_back(make_codec(
        config_.key_codec, CodecParams{config_.head_dim, config_.block_tokens, derive_seed(layer_seed, 0), Role::key}));
    value_codecs_.push_back(make_codec(config_.value_codec, CodecParams{config_.head_dim, config_.block_tokens,
                                                                        derive_seed(layer_seed, 1), Role::value}));
  }
  layout_ = detail::PageLayout(key_codecs_[0]->block_bytes(), value_codecs_[0]->block_bytes(), config_.n_kv_heads);
  const size_t page_bytes = layout_.page_bytes;
  KVQ_CHECK(config_.capacity_pages <= std::numeric_limits<size_t>::max() / page_bytes,
            "KVCache: ", config_.capacity_pages, " pages of ", page_bytes, " bytes overflow the address space");
  free_ = detail::FreePages(config_.capacity_pages);
  if (device_.is_cuda()) {
    cuda::detail::Backend::open(*this, device_.index);
  } else if (config_.capacity_pages > 0) {
    // A pool larger than the machine could never be filled: a mistake or a crafted file, refused before the
    // allocation (which would fail late, or abort under a sanitizer).
    const size_t bytes = config_.capacity_pages * page_bytes, memory = detail::physical_memory_bytes();
    KVQ_CHECK(memory == 0 || bytes <= memory, "KVCache: ", config_.capacity_pages, " pages of ", page_bytes,
              " bytes (", bytes, " bytes) exceed this machine's memory of ", memory, " bytes");
    pool_ = std::unique_ptr<uint8_t[], PoolDeleter>(map_pool(bytes), PoolDeleter{bytes});
    KVQ_CHECK(pool_ != nullptr, "KVCache: cannot allocate ", config_.capacity_pages, " pages of ", page_bytes,
              " bytes (", bytes, " bytes)");
    advise_huge_pages(pool_.get(), bytes);
  }
}

KVCache::~KVCache() = default;
KVCache::KVCache(KVCache&& o) noexcept { *this = std::move(o); }

KVCache& KVCache::operator=(KVCache&& o) noexcept {
  config_ = std::move(o.config_);
  device_ = o.device_;
  key_codecs_ = std::move(o.key_codecs_);
  value_codecs_ = std::move(o.value_codecs_);
  layout_ = o.layout_;
  pool_ = std::move(o.pool_);
  cuda_ = std::move(o.cuda_);
  free_ = std::move(o.free_);
  sequences_ = std::move(o.sequences_);
  if (cuda_) cuda::detail::Backend::moved(*this);  // the device store points back at its cache
  return *this;
}

void KVCache::check_layer(int layer) const {
  KVQ_CHECK(layer >= 0 && layer < config_.n_layers, "KVCache: layer ", layer, " out of range (", config_.n_layers,
            " layers)");
}

const Codec& KVCache::key_codec(int layer) const {
  check_layer(layer);
  return *key_codecs_[static_cast<size_t>(layer)];
}

const Codec& KVCache::value_codec(int layer) const {
  check_layer(layer);
  return *value_codecs_[static_cast<size_t>(layer)];
}

bool KVCache::ready(int layer) const { return key_codec(layer).trained() && value_codec(layer).trained(); }

void KVCache::check_untouched(int layer, std::string_view what) const {
  check_layer(layer);
  for (const auto& [id, seq] : sequences_)
    KVQ_CHECK(seq.layers[static_cast<size_t>(layer)].pages.empty(), "KVCache::", what, "(", layer, "): sequence ", id,
              " already holds encoded tokens in this layer; train before appending");
}

void KVCache::train_layer(int layer, const float* keys, const float* values, size_t n) {
  check_untouched(layer, "train_layer");
  KVQ_CHECK(keys != nullptr && values != nullptr && n > 0, "KVCache::train_layer(", layer,
            "): needs n > 0 key and value vectors");
  if (detail::centers_keys(config_)) {
    const size_t d = static_cast<size_t>(config_.head_dim);
    std::vector<double> mean(d, 0.0);
    for (size_t i = 0; i < n; ++i)
      for (size_t c = 0; c < d; ++c) mean[c] += keys[i * d + c];
    std::vector<float> centered(keys, keys + n * d);
    for (size_t i = 0; i < n; ++i)
      for (size_t c = 0; c < d; ++c) centered[i * d + c] -= static_cast<float>(mean[c] / static_cast<double>(n));
    key_codecs_[static_cast<size_t>(layer)]->train(centered.data(), n);
  } else {
    key_codecs_[static_cast<size_t>(layer)]->train(keys, n);
  }
  value_codecs_[static_cast<size_t>(layer)]->train(values, n);
  if (cuda_) cuda::detail::Backend::trained(*this, layer);
}

void KVCache::load_layer_state(int layer, const std::vector<uint8_t>& key_state,
                               const std::vector<uint8_t>& value_state) {
  check_untouched(layer, "load_layer_state");
  Codec& key = *key_codecs_[static_cast<size_t>(layer)];
  Codec& value = *value_codecs_[static_cast<size_t>(layer)];
  // Both checked before either changes: a refused state leaves the layer as it was.
  if (!key_state.empty()) make_codec(key.spec().str(), key.params())->load_state(key_state);
  if (!value_state.empty()) make_codec(value.spec().str(), value.params())->load_state(value_state);
  if (!key_state.empty()) key.load_state(key_state);
  if (!value_state.empty()) value.load_state(value_state);
  if (cuda_) cuda::detail::Backend::trained(*this, layer);
}

size_t KVCache::residual_slots() const {
  return static_cast<size_t>(config_.residual_tokens + config_.block_tokens - 1);
}

void KVCache::reserve_window(LayerState& ls, size_t tokens) const {
  if (tokens <= ls.window_slots) return;
  const size_t H = static_cast<size_t>(config_.n_kv_heads), d = static_cast<size_t>(config_.head_dim);
  const size_t slots = std::min(residual_slots(), std::max(tokens, 2 * ls.window_slots));
  KVQ_CHECK(tokens <= slots, "KVCache: a window of ", tokens, " tokens (at most ", residual_slots(), ")");
  regrow_rows(ls.residual, 2 * H, ls.window_slots, static_cast<size_t>(ls.residual_count), slots, d);
  ls.window_slots = slots;
}

void KVCache::reserve_sinks(LayerState& ls, size_t tokens) const {
  if (tokens <= ls.sink_slots) return;
  const size_t H = static_cast<size_t>(config_.n_kv_heads), d = static_cast<size_t>(config_.head_dim);
  const size_t S = static_cast<size_t>(config_.sink_tokens);
  KVQ_CHECK(tokens <= S, "KVCache: ", tokens, " sink tokens (at most ", S, ")");
  const size_t slots = std::min(S, std::max(tokens, 2 * ls.sink_slots));
  regrow_rows(ls.sinks, 2 * H, ls.sink_slots, static_cast<size_t>(ls.sink_count), slots, d);
  ls.sink_slots = slots;
}

SeqId KVCache::add_sequence() {
  const SeqId id = sequences_.next_id;
  if (cuda_)
    cuda::detail::Backend::add_sequence(*this, id);
  else
    sequences_.insert(id, config_.n_layers);
  return id;
}

void KVCache::remove_sequence(SeqId seq) { sequences_.erase(seq, free_); }

bool KVCache::has_sequence(SeqId seq) const { return sequences_.contains(seq); }

std::vector<SeqId> KVCache::sequences() const { return sequences_.ids(); }

size_t KVCache::key_block_offset(int head) const {
  KVQ_CHECK(head >= 0 && head < config_.n_kv_heads, "KVCache: kv head ", head, " out of range (", config_.n_kv_heads,
            " heads)");
  return layout_.key_offset(head);
}

size_t KVCache::value_block_offset(int head) const {
  KVQ_CHECK(head >= 0 && head < config_.n_kv_heads, "KVCache: kv head ", head, " out of range (", config_.n_kv_heads,
            " heads)");
  return layout_.value_offset(head);
}

const uint8_t* KVCache::page(PageId id) const {
  KVQ_CHECK(id < config_.capacity_pages, "KVCache: page ", id, " out of range (", config_.capacity_pages, " pages)");
  const uint8_t* pool = cuda_ ? cuda::detail::Backend::pool(*this) : pool_.get();
  return pool + static_cast<size_t>(id) * layout_.page_bytes;
}

uint8_t* KVCache::page_mut(PageId id) { return const_cast<uint8_t*>(page(id)); }

void KVCache::zero_page_padding(uint8_t* p) const {
  const size_t kb = key_codecs_[0]->block_bytes(), vb = value_codecs_[0]->block_bytes();
  for (int h = 0; h < config_.n_kv_heads; ++h) {
    std::memset(p + key_block_offset(h) + kb, 0, layout_.key_stride - kb);
    std::memset(p + value_block_offset(h) + vb, 0, layout_.value_stride - vb);
  }
}

void KVCache::append_device(SeqId seq, int layer, const float* keys_dev, const float* values_dev, size_t n_tokens,
                            void* stream) {
  KVQ_CHECK(cuda_, "KVCache::append_device: a cpu cache takes tokens from host memory (append)");
  cuda::detail::Backend::append_batch(*this, "KVCache::append_device", {&seq, 1}, layer, keys_dev, values_dev,
                                      {&n_tokens, 1}, stream);
}

void KVCache::append_device_batch(std::span<const SeqId> seqs, int layer, const float* keys_dev,
                                  const float* values_dev, std::span<const size_t> n_tokens, void* stream) {
  KVQ_CHECK(cuda_, "KVCache::append_device_batch: a cpu cache takes tokens from host memory (append)");
  cuda::detail::Backend::append_batch(*this, "KVCache::append_device_batch", seqs, layer, keys_dev, values_dev,
                                      n_tokens, stream);
}

void KVCache::append(SeqId seq, int layer, const float* keys, const float* values, size_t n_tokens) {
  if (cuda_) return cuda::detail::Backend::append(*this, seq, layer, keys, values, n_tokens);
  check_layer(layer);
  LayerState& ls = sequences_.at(seq).layers[static_cast<size_t>(layer)];
  append_on_host(
      ls, layer, seq, keys, values, n_tokens,
      [&](size_t j) {
        uint8_t* p = page_mut(free_.next(j));  // encoded while still on the free list
        zero_page_padding(p);
        return p;
      },
      [&](size_t n) { free_.take(n, ls.pages); });
}

void KVCache::append_on_host(LayerState& ls, int layer, SeqId seq, const float* keys, const float* values,
                             size_t n_tokens, const std::function<uint8_t*(size_t)>& page_at,
                             const std::function<void(size_t)>& take) {
  if (n_tokens == 0) return;
  KVQ_CHECK(keys != nullptr && values != nullptr, "KVCache::append: null keys or values");
  const Codec& kc = *key_codecs_[static_cast<size_t>(layer)];
  const Codec& vc = *value_codecs_[static_cast<size_t>(layer)];
  for (const Codec* c : {&kc, &vc})
    KVQ_CHECK(c->trained(), "KVCache::append: layer ", layer, " codec '", c->spec().str(),
              "' needs training: call train_layer first");
  const size_t H = static_cast<size_t>(config_.n_kv_heads), d = static_cast<size_t>(config_.head_dim);
  const size_t T = static_cast<size_t>(config_.block_tokens), R = static_cast<size_t>(config_.residual_tokens);
  // Check everything before changing anything: a cache must never hold a value that poisons attention.
  for (const float* x : {keys, values}) {
    const size_t i = first_non_finite(x, n_tokens * H * d);
    KVQ_CHECK(i == n_tokens * H * d, "KVCache::append: ", x == keys ? "key" : "value", " of token ", i / (H * d),
              " head ", i / d % H, " channel ", i % d, " is ", x[i], " (NaN and Inf are rejected)");
  }
  // The first tokens of the sequence go to the f16 sinks, the rest to the stream of pages and window.
  const size_t n_sink = sinks_taken(ls, n_tokens);
  check_sink_range("KVCache::append", keys, values, n_sink);
  reserve_sinks(ls, static_cast<size_t>(ls.sink_count) + n_sink);  // room, the held ones kept: nothing changes
  const float* sink_keys = keys;
  const float* sink_values = values;
  keys += n_sink * H * d;
  values += n_sink * H * d;
  n_tokens -= n_sink;

  // The unencoded stream is the window (u tokens) followed by the new tokens; its oldest blocks of T are encoded
  // until fewer than R + T remain.
  const size_t u = static_cast<size_t>(ls.residual_count), total = u + n_tokens;
  const size_t n_pages = total >= R + T ? (total - R - T) / T + 1 : 0;
  KVQ_CHECK(n_pages <= free_pages(), "KV cache pool exhausted: appending ", n_tokens, " tokens to sequence ", seq,
            " layer ", layer, " needs ", n_pages, " new pages but ", free_pages(), " of ", config_.capacity_pages,
            " are free (remove sequences or configure more capacity_pages)");
  ls.pages.reserve(ls.pages.size() + n_pages);
  reserve_window(ls, total - n_pages * T);  // keeps the window's tokens where they are in the stream

  const size_t slots = ls.window_slots;
  float* window_k = ls.residual.data();
  float* window_v = window_k + H * slots * d;
  detail::CenteredKeys centered(detail::centers_keys(config_), ls.key_offset, window_k, H, slots, d, u, keys, n_tokens, T,
                                n_pages > 0);
  auto stream_token = [&](const float* window, const float* fresh, size_t idx, size_t h) {
    return idx < u ? window + (h * slots + idx) * d : fresh + ((idx - u) * H + h) * d;
  };
  // Encode every new page before taking any: if an encoder throws, nothing has changed.
  std::vector<float> block(T * d);
  for (size_t j = 0; j < n_pages; ++j) {
    uint8_t* p = page_at(j);
    for (size_t h = 0; h < H; ++h) {
      const int head = static_cast<int>(h);
      for (size_t t = 0; t < T; ++t)
        std::memcpy(block.data() + t * d, stream_token(centered.window(), centered.fresh(), j * T + t, h),
                    d * sizeof(float));
      kc.encode(block.data(), static_cast<int>(T), p + key_block_offset(head));
      for (size_t t = 0; t < T; ++t)
        std::memcpy(block.data() + t * d, stream_token(window_v, values, j * T + t, h), d * sizeof(float));
      vc.encode(block.data(), static_cast<int>(T), p + value_block_offset(head));
    }
  }

  // Commit (nothing below throws once take has).
  take(n_pages);
  const size_t encoded = n_pages * T;
  centered.commit(window_k, ls.key_offset);
  detail::advance_window(window_k, H, slots, d, u, encoded, centered.fresh(), n_tokens);
  detail::advance_window(window_v, H, slots, d, u, encoded, values, n_tokens);
  ls.residual_count = static_cast<int>(total - encoded);
  store_sinks(ls, sink_keys, sink_values, n_sink);
}

size_t KVCache::sinks_taken(const LayerState& ls, size_t n_tokens) const {
  return std::min(n_tokens, static_cast<size_t>(config_.sink_tokens - ls.sink_count));
}

void KVCache::check_sink_range(const std::string& who, const float* keys, const float* values, size_t n_sink) const {
  const size_t H = static_cast<size_t>(config_.n_kv_heads), d = static_cast<size_t>(config_.head_dim);
  for (const float* x : {keys, values})
    for (size_t i = 0; i < n_sink * H * d; ++i)
      KVQ_CHECK(std::abs(x[i]) <= 65504.f, who, ": ", x == keys ? "key" : "value", " of token ", i / (H * d),
                " head ", i / d % H, " channel ", i % d, " is ", x[i],
                ", beyond f16's range: sink tokens are kept in f16");
}

void KVCache::store_sinks(LayerState& ls, const float* keys, const float* values, size_t n_sink) const {
  if (n_sink == 0) return;
  const size_t H = static_cast<size_t>(config_.n_kv_heads), d = static_cast<size_t>(config_.head_dim);
  const size_t held = static_cast<size_t>(ls.sink_count);
  reserve_sinks(ls, held + n_sink);
  for (size_t t = 0; t < n_sink; ++t)
    for (size_t h = 0; h < H; ++h)
      for (size_t c = 0; c < d; ++c) {
        const size_t at = (h * ls.sink_slots + held + t) * d + c, from = (t * H + h) * d + c;
        ls.sinks[at] = f32_to_f16(keys[from]);
        ls.sinks[H * ls.sink_slots * d + at] = f32_to_f16(values[from]);
      }
  ls.sink_count = static_cast<int>(held + n_sink);
}

size_t KVCache::length(SeqId seq, int layer) const {
  check_layer(layer);
  const LayerState& ls = sequences_.at(seq).layers[static_cast<size_t>(layer)];
  return static_cast<size_t>(ls.sink_count) + ls.pages.size() * static_cast<size_t>(config_.block_tokens) +
         static_cast<size_t>(ls.residual_count);
}

size_t KVCache::length(SeqId seq) const {
  const size_t n = length(seq, 0);
  for (int l = 1; l < config_.n_layers; ++l) {
    const size_t nl = length(seq, l);
    KVQ_CHECK(nl == n, "KVCache: sequence ", seq, " holds ", n, " tokens in layer 0 but ", nl, " in layer ", l,
              " (append every layer before asking for its length)");
  }
  return n;
}

LayerView KVCache::view(SeqId seq, int layer) const {
  check_layer(layer);
  if (cuda_) return cuda::detail::Backend::view(*this, seq, layer);
  const LayerState& ls = sequences_.at(seq).layers[static_cast<size_t>(layer)];
  const size_t head_stride = ls.window_slots * static_cast<size_t>(config_.head_dim);
  LayerView v;
  v.sink_count = ls.sink_count;
  if (!ls.sinks.empty()) {
    v.sink_stride = ls.sink_slots * static_cast<size_t>(config_.head_dim);
    v.sink_keys = ls.sinks.data();
    v.sink_values = ls.sinks.data() + static_cast<size_t>(config_.n_kv_heads) * v.sink_stride;
  }
  v.pages = ls.pages;
  v.block_tokens = config_.block_tokens;
  v.residual_count = ls.residual_count;
  // A window not allocated yet reads as empty at a valid address: copies of its zero tokens stay well-defined.
  static constexpr float kNoTokens[1] = {};
  v.residual_keys = ls.residual.empty() ? kNoTokens : ls.residual.data();
  v.residual_values = ls.residual.empty() ? kNoTokens
                                          : ls.residual.data() + static_cast<size_t>(config_.n_kv_heads) * head_stride;
  v.residual_stride = head_stride;
  if (!ls.key_offset.empty()) v.key_offset = ls.key_offset.data();
  return v;
}

void KVCache::read(SeqId seq, int layer, float* keys, float* values) const {
  if (cuda_) {
    check_layer(layer);
    return to_cpu(0, {&seq, 1}).read(seq, layer, keys, values);
  }
  const LayerView v = view(seq, layer);
  KVQ_CHECK((keys != nullptr && values != nullptr) || v.length() == 0, "KVCache::read: null keys or values");
  const size_t d = static_cast<size_t>(config_.head_dim), H = static_cast<size_t>(config_.n_kv_heads);
  const size_t T = static_cast<size_t>(v.block_tokens), row = H * d, S = v.first_page_token();
  std::vector<float> block(T * d);
  for (size_t h = 0; h < H; ++h) {
    for (size_t t = 0; t < S; ++t)
      for (size_t c = 0; c < d; ++c) {
        keys[t * row + h * d + c] = f16_to_f32(v.sink_keys[h * v.sink_stride + t * d + c]);
        values[t * row + h * d + c] = f16_to_f32(v.sink_values[h * v.sink_stride + t * d + c]);
      }
    // One head's tokens: decoded page by page into `block`, then the window, each row to its place in [t][H][d].
    const auto gather = [&](const Codec& codec, const uint8_t* (KVCache::*block_of)(PageId, int) const,
                            const float* window, float* all) {
      float* out = all + S * row;
      for (size_t j = 0; j < v.pages.size(); ++j) {
        codec.decode((this->*block_of)(v.pages[j], static_cast<int>(h)), static_cast<int>(T), block.data());
        for (size_t t = 0; t < T; ++t) std::memcpy(out + (j * T + t) * row + h * d, block.data() + t * d, d * 4);
      }
      for (size_t t = 0; t < static_cast<size_t>(v.residual_count); ++t)
        std::memcpy(out + (v.encoded_tokens() + t) * row + h * d, window + t * d, d * 4);
    };
    gather(key_codec(layer), &KVCache::key_block, v.residual_key(static_cast<int>(h)), keys);
    gather(value_codec(layer), &KVCache::value_block, v.residual_value(static_cast<int>(h)), values);
    if (v.key_offset != nullptr)
      for (size_t t = 0; t < v.length() - S; ++t)
        for (size_t c = 0; c < d; ++c) keys[(S + t) * row + h * d + c] += v.key_offset[h * d + c];
  }
}

CacheMemory KVCache::memory() const {
  CacheMemory m;
  m.page_bytes = layout_.page_bytes;
  m.pages_capacity = config_.capacity_pages;
  m.pages_in_use = config_.capacity_pages - free_pages();
  m.encoded_bytes = m.pages_in_use * layout_.page_bytes;
  m.pool_bytes = m.pages_capacity * layout_.page_bytes;
  for (const auto& [id, seq] : sequences_)
    for (const auto& layer : seq.layers) {
      m.residual_bytes += layer.residual.size() * sizeof(float);
      m.block_table_bytes += layer.pages.size() * sizeof(PageId);
      m.key_offset_bytes += layer.key_offset.size() * sizeof(float);
      m.sink_bytes += layer.sinks.size() * sizeof(uint16_t);
    }
  if (cuda_) cuda::detail::Backend::add_memory(*this, m);
  for (int l = 0; l < config_.n_layers; ++l)
    m.codec_state_bytes += key_codec(l).state().size() + value_codec(l).state().size();
  const size_t rest =
      m.residual_bytes + m.block_table_bytes + m.codec_state_bytes + m.key_offset_bytes + m.sink_bytes;
  m.used_bytes = m.encoded_bytes + rest;
  m.total_bytes = m.pool_bytes + rest;
  m.bits_per_element =
      8.0 * static_cast<double>(layout_.page_bytes) / (2.0 * config_.block_tokens * config_.n_kv_heads * config_.head_dim);
  return m;
}

KVCache KVCache::to_cpu(size_t capacity_pages, std::span<const SeqId> seqs) const {
  CacheConfig config = config_;
  if (capacity_pages != 0) config.capacity_pages = capacity_pages;
  const std::vector<SeqId> all = sequences();
  if (seqs.empty()) seqs = all;
  size_t needed = 0;
  for (const SeqId id : seqs)
    for (const LayerState& l : sequences_.at(id).layers) needed += l.pages.size();
  KVQ_CHECK(needed <= config.capacity_pages, "KVCache::to: the cache holds ", needed, " pages but the copy's pool has ",
            config.capacity_pages);
  if (cuda_) cuda::detail::Backend::synchronize(*this);
  detail::CacheBuilder builder(config);
  for (int l = 0; l < config_.n_layers; ++l) builder.load_codecs(l, key_codec(l), value_codec(l));
  std::vector<uint8_t> pages;
  for (const SeqId id : seqs) {
    builder.add_sequence(id);
    for (int l = 0; l < config_.n_layers; ++l) {
      const LayerState& ls = sequences_.at(id).layers[static_cast<size_t>(l)];
      // A CUDA cache's window and key offset, downloaded; a CPU cache's as they are.
      const LayerState downloaded = cuda_ ? cuda::detail::Backend::host_layer(*this, ls) : LayerState{};
      const LayerState& host = cuda_ ? downloaded : ls;
      pages.resize(ls.pages.size() * layout_.page_bytes);
      for (size_t j = 0; j < ls.pages.size(); ++j) {
        uint8_t* to = pages.data() + j * layout_.page_bytes;
        if (cuda_)
          cuda::detail::Backend::copy_to_host(*this, to, page(ls.pages[j]), layout_.page_bytes);
        else
          std::memcpy(to, page(ls.pages[j]), layout_.page_bytes);
      }
      builder.fill_layer(id, l, pages.data(), ls.pages.size(), host.residual.data(), host.window_slots,
                         host.residual_count, host.key_offset.empty() ? nullptr : host.key_offset.data());
      builder.fill_sinks(id, l, ls.sinks.data(), ls.sink_slots, ls.sink_count);
    }
  }
  builder.set_next_id(sequences_.next_id);
  return builder.finish();
}

KVCache KVCache::to(Device device, size_t capacity_pages) const {
  if (device.is_cpu()) return to_cpu(capacity_pages);
  if (cuda_) return to_cpu(0).to(device, capacity_pages);  // between CUDA devices through the host
  CacheConfig config = config_;
  if (capacity_pages != 0) config.capacity_pages = capacity_pages;
  KVCache copy(config, device);
  for (int l = 0; l < config_.n_layers; ++l) {
    const size_t i = static_cast<size_t>(l);
    for (const auto& [to, from] : {std::pair{copy.key_codecs_[i].get(), key_codecs_[i].get()},
                                   std::pair{copy.value_codecs_[i].get(), value_codecs_[i].get()}})
      if (from->trained()) to->load_state(from->state());  // an untrained codec (a layer not used yet) stays so
  }
  cuda::detail::Backend::upload(copy, *this);
  return copy;
}

}  // namespace kvq

// The compressed KV cache: per layer one key codec and one value codec, encoded blocks in fixed-size pages drawn
// from one shared pool (as in paged attention), and the newest tokens of every (sequence, layer) kept in fp32.
//
// Page layout. A page holds T consecutive tokens of ONE layer of one sequence, for all kv heads, keys and values:
//     [key block head 0 | key block head 1 | ... | value block head 0 | value block head 1 | ...]
// every block starting at a 64-byte aligned offset (key_block_offset / value_block_offset), padding zeroed; pages
// are 64-byte aligned in one pool allocation. All layers and sequences share one free list of pages.
//
// Residual window. The newest tokens stay in fp32 in a per-(sequence, layer) buffer; when R + T tokens are
// unencoded, the oldest T are encoded into a new page. The window so holds between R and R + T - 1 tokens once the
// sequence is long enough (R = 0: the < T tokens of the unfinished block). Pages are always full.
//
// Sink tokens (CacheConfig::sink_tokens = S, 0 by default). The first S tokens of every (sequence, layer) (the
// attention sink: BOS and the tokens every later query attends to most) are kept unencoded in f16, before the
// pages: pages and window hold the tokens from position S on, and attention reads the sinks exactly. S (16 - b) / n
// bits per element more for a sequence of n tokens at b bits; on SmolLM2 at 3 bits one sink token removes 8-31 % of
// the KLD, 30 % in a 3.0-bit calibrated cache (docs/quality.md, "Sink tokens").
//
// Centered keys (CacheConfig::center_keys, off by default; key codecs that quantize, not f32 / f16 / bf16). Pages
// and windows hold every key of a (sequence, layer, kv head) minus an offset: the mean of the sequence's first T
// keys, fixed when its first page is encoded (LayerView::key_offset; null before). Attention is unchanged by it
// (the scores of one query all move by the same amount, which softmax ignores); the codecs quantize keys without
// the part all tokens share. Add the offset back to read the keys themselves. Whether it pays depends on the
// model (docs/quality.md): Gemma 3's int4 keys lose 4x less, SmolLM2's 1.6x more (its later layers' keys rotate
// away from the first page's mean).
//
// Devices (device.hpp). The pages, fp32 windows and key offsets live on the CPU or on one CUDA device, the cache's
// device(); the bookkeeping (sequences, block tables, the free list, memory accounting, append planning) is the
// same host-side state for both. append from host memory works on either device; append_device(_batch) takes
// tokens in device memory (CUDA caches). A CUDA cache's appends encode on the device: every codec's append kernel
// (src/cuda/encode_*.cu) writes the same bytes as the CPU codecs (bit-exact for f32/f16/bf16, kivi and qjl, and for
// int8/int4, turbo_mse, turbo_prod, turbo_rvq and vecinfer under the Hadamard rotation, the default for a
// power-of-two d; other rotations use their dense matrix, within 1% of the CPU's reconstruction error). to()
// copies a cache to another device. Builds without the CUDA backend throw kvq::Error for a CUDA device, naming the
// reason (cuda::unavailable_reason()).
//
// Thread safety: const member functions may run concurrently; anything that modifies the cache must not overlap
// with any other call. Views and pointers stay valid until the next append, remove_sequence or train_layer. A CUDA
// cache's appends share its device scratch: appends on different streams must be ordered by the caller.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvq/codec.hpp"
#include "kvq/detail/page_table.hpp"
#include "kvq/device.hpp"

namespace kvq {
namespace detail {
class CacheBuilder;
}
namespace cuda {
class DecodeStep;
namespace detail {
struct Backend;      // what KVCache calls for a CUDA cache (src/cache/cuda_backend.hpp)
struct DeviceStore;  // a CUDA cache's pool, scratch and append kernels (src/cuda/device_store.hpp)
struct DeviceLayer;  // one (sequence, layer)'s device block table, fp32 window and key offset
struct DeviceDeleter {
  void operator()(DeviceStore* p) const noexcept;
  void operator()(DeviceLayer* p) const noexcept;
};
}  // namespace detail
}  // namespace cuda

struct CacheConfig {
  int n_layers = 1;
  int n_kv_heads = 1;
  int head_dim = 128;
  int block_tokens = 64;          ///< T: tokens per page, 64 or 128
  std::string key_codec = "f16";  ///< codec spec, e.g. "turbo_prod:3"
  std::string value_codec = "f16";
  int residual_tokens = 0;    ///< R: newest tokens kept in fp32, a multiple of T (0 allowed)
  size_t capacity_pages = 0;  ///< pages in the pool, shared by all layers and sequences
  uint64_t seed = 0;          ///< seeds every codec: layer l's key codec gets derive_seed(derive_seed(seed, l), 0)
  bool center_keys = false;   ///< store quantized keys minus their sequence's first-page mean (see above)
  int sink_tokens = 0;        ///< S: the first tokens of every sequence kept in f16, never encoded (see above)
};

/// The most sink tokens a cache may keep per sequence.
inline constexpr int kMaxSinkTokens = 4096;

/// Whether centered keys apply to a key codec spec: codecs that quantize. f32, f16 and bf16 keys are stored as they
/// are (their error is relative to each element, so centering would only add rounding).
bool centering_applies(const std::string& key_codec);

/// True bytes held by a cache. The pool is allocated whole at construction; in-use figures count taken pages.
struct CacheMemory {
  size_t page_bytes = 0;  ///< one page, block padding included
  size_t pages_in_use = 0;
  size_t pages_capacity = 0;
  size_t encoded_bytes = 0;      ///< pages_in_use * page_bytes
  size_t pool_bytes = 0;         ///< pages_capacity * page_bytes
  size_t residual_bytes = 0;     ///< fp32 windows as allocated: each grows with use, to 2 * kv heads * (R + T - 1) * d
                                 ///< * 4 bytes per (sequence, layer)
  size_t block_table_bytes = 0;  ///< block table entries * sizeof(PageId)
  size_t codec_state_bytes = 0;  ///< trained codec state (Codec::state()) of every layer
  size_t key_offset_bytes = 0;   ///< centered keys: one fp32 offset per (sequence, layer, kv head) that has pages
  size_t sink_bytes = 0;         ///< sink tokens (f16) as allocated: each grows with use, to 2 * kv heads * S * d
                                 ///< * 2 bytes per (sequence, layer)
  size_t used_bytes = 0;         ///< encoded + residual + block tables + codec state + key offsets + sinks
  size_t total_bytes = 0;        ///< pool + residual + block tables + codec state + key offsets + sinks
  /// Of the encoded part: 8 * page_bytes / (T * kv heads * d * 2), keys and values, padding included.
  double bits_per_element = 0;
};

/// What attention reads of one (sequence, layer). The pointers are in the cache's device memory (a CUDA cache's
/// window, key offset, sinks and device_pages on its device); `pages` is the host copy of the block table.
struct LayerView {
  int sink_count = 0;                     ///< f16 sink tokens, positions 0 .. sink_count - 1 (CacheConfig::sink_tokens)
  const uint16_t* sink_keys = nullptr;    ///< [kv head][sink_stride / d slots][d] f16, sink_count used; not centered
  const uint16_t* sink_values = nullptr;  ///< same layout
  size_t sink_stride = 0;                 ///< halves between the sinks of consecutive kv heads
  std::span<const PageId> pages;  ///< block table: tokens [sink_count + j*T, sink_count + (j+1)*T) live in pages[j]
  int block_tokens = 0;                    ///< T
  int residual_count = 0;                  ///< fp32 tokens after the encoded ones
  const float* residual_keys = nullptr;    ///< [kv head][residual_stride / d slots][d], residual_count slots used
  const float* residual_values = nullptr;  ///< same layout
  size_t residual_stride = 0;              ///< floats between the windows of consecutive kv heads
  const float* key_offset = nullptr;       ///< [kv head][d] subtracted from every stored key; null: none
  const PageId* device_pages = nullptr;    ///< a CUDA cache's block table on its device (pages.size() entries)

  size_t encoded_tokens() const { return pages.size() * static_cast<size_t>(block_tokens); }
  /// Position of the first token of pages[0]: the sinks come first.
  size_t first_page_token() const { return static_cast<size_t>(sink_count); }
  /// Position of the first window token.
  size_t window_start() const { return first_page_token() + encoded_tokens(); }
  size_t length() const { return window_start() + static_cast<size_t>(residual_count); }
  /// residual_count x d keys (values) of one kv head, oldest first.
  const float* residual_key(int head) const { return residual_keys + static_cast<size_t>(head) * residual_stride; }
  const float* residual_value(int head) const { return residual_values + static_cast<size_t>(head) * residual_stride; }
};

class KVCache {
 public:
  /// Builds the codecs and allocates the page pool on `device`; throws kvq::Error naming any bad field, or for a
  /// CUDA device this build or machine lacks.
  explicit KVCache(const CacheConfig& config, Device device = Device::cpu());
  ~KVCache();
  KVCache(KVCache&&) noexcept;
  KVCache& operator=(KVCache&&) noexcept;
  KVCache(const KVCache&) = delete;
  KVCache& operator=(const KVCache&) = delete;

  /// The configuration, codec specs in canonical form.
  const CacheConfig& config() const { return config_; }
  /// Where the pages, windows and key offsets live.
  Device device() const { return device_; }
  /// A copy on `device`: the same configuration, codecs (trained state included), sequences (ids, pages byte for
  /// byte, windows, key offsets) and next sequence id; page ids may differ. capacity_pages: the copy's pool (0:
  /// this cache's capacity). Waits for a CUDA cache's queued work.
  KVCache to(Device device, size_t capacity_pages = 0) const;

  // ---- codecs ----
  const Codec& key_codec(int layer) const;
  const Codec& value_codec(int layer) const;
  /// Whether both codecs of a layer can encode (trained, or needing no training).
  bool ready(int layer) const;
  /// Trains the layer's codecs on n x d example keys and values (original space; with center_keys the key codec
  /// learns from the keys minus their mean, as it will encode them). Only before the layer holds encoded tokens:
  /// retraining would invalidate them. keys, values: host memory, on either device.
  void train_layer(int layer, const float* keys, const float* values, size_t n);
  /// Restores the layer's codecs' trained state: Codec::state() of a key and a value codec of the same specs
  /// (kvq calibrate's, trained as this layer's), an empty state leaving its codec as it is. kvq::Error for a state
  /// the codec refuses (its size, non-finite numbers). The same conditions as train_layer.
  void load_layer_state(int layer, const std::vector<uint8_t>& key_state, const std::vector<uint8_t>& value_state);

  // ---- sequences ----
  SeqId add_sequence();
  /// Frees the sequence's pages and window.
  void remove_sequence(SeqId seq);
  bool has_sequence(SeqId seq) const;
  /// Live sequences in increasing id order.
  std::vector<SeqId> sequences() const;
  /// The id the next add_sequence returns: ids are never reused, also after the newest sequence is removed.
  SeqId next_sequence_id() const { return sequences_.next_id; }

  /// Appends n_tokens tokens to one layer of a sequence. keys and values: [n_tokens][n_kv_heads][head_dim].
  /// One token (decode) or a chunk (prefill). On any error (unknown sequence, non-finite input, untrained codec,
  /// pool exhausted) it throws kvq::Error before modifying anything. Host memory on either device (a CUDA cache
  /// uploads them and runs append_device, then synchronizes).
  void append(SeqId seq, int layer, const float* keys, const float* values, size_t n_tokens);
  /// CUDA caches: appends tokens already in the cache's device memory (16-byte aligned, [n_tokens][n_kv_heads]
  /// [head_dim] fp32 each), the batch of one sequence (append_device_batch). A CPU cache throws kvq::Error.
  void append_device(SeqId seq, int layer, const float* keys_dev, const float* values_dev, size_t n_tokens,
                     void* stream = nullptr);
  /// CUDA caches: appends one chunk to each of several sequences of one layer in one call, as one append per
  /// sequence would (the same pages, taken from the pool in the order of `seqs`, and windows). keys_dev and
  /// values_dev: the chunks concatenated in the order of `seqs`, [sum of n_tokens][n_kv_heads][head_dim] fp32 in
  /// device memory, 16-byte aligned: sequence seqs[i]'s n_tokens[i] tokens start at token n_tokens[0] + ... +
  /// n_tokens[i - 1] (a decode step: one token per sequence). Full pages of every sequence are encoded by the append
  /// kernels into the pool (one launch per encoder kind for the whole batch), the rest goes to the device windows.
  /// Throws kvq::Error before modifying any sequence: a CPU cache, an unknown or repeated sequence, a NaN or Inf
  /// (naming sequence, token, head and channel), a value the codec cannot store, an exhausted pool, or a codec
  /// without append kernels (naming it). Waits once for all the checks on `stream` (a cudaStream_t; null: the
  /// default stream); the commit (block table entries, window moves) is queued on it, so the inputs may be reused
  /// once the call returns.
  void append_device_batch(std::span<const SeqId> seqs, int layer, const float* keys_dev, const float* values_dev,
                           std::span<const size_t> n_tokens, void* stream = nullptr);
  /// Tokens of the sequence; throws if its layers hold different counts (append every layer first).
  size_t length(SeqId seq) const;
  size_t length(SeqId seq, int layer) const;

  /// The tokens of (seq, layer) as attention reads them: the f16 sinks, the pages decoded by the layer's codecs,
  /// then the fp32 window, the key offset added back to the pages and window (centered keys). keys and values:
  /// [length(seq, layer)][n_kv_heads][head_dim],
  /// host memory (a CUDA cache reads through a CPU copy of the sequence).
  void read(SeqId seq, int layer, float* keys, float* values) const;

  // ---- storage, for attention ----
  LayerView view(SeqId seq, int layer) const;
  size_t page_bytes() const { return layout_.page_bytes; }
  size_t key_block_offset(int head) const;
  size_t value_block_offset(int head) const;
  /// A page in the cache's pool, on its device.
  const uint8_t* page(PageId id) const;
  const uint8_t* key_block(PageId id, int head) const { return page(id) + key_block_offset(head); }
  const uint8_t* value_block(PageId id, int head) const { return page(id) + value_block_offset(head); }
  size_t free_pages() const { return free_.size(); }
  size_t capacity_pages() const { return config_.capacity_pages; }

  CacheMemory memory() const;

  // ---- files ----
  /// Writes the cache to `path` (through path + ".tmp" and a rename; a CUDA cache through a CPU copy). Format:
  /// src/cache/cache_file.cpp.
  void save(const std::string& path) const;
  /// Reads a file written by save() into a cache on `device`; throws kvq::Error for a damaged, truncated, foreign
  /// or newer file.
  static KVCache load(const std::string& path, Device device = Device::cpu());

 private:
  struct LayerState {
    std::vector<PageId> pages;
    int residual_count = 0;
    size_t window_slots = 0;        // tokens per head `residual` has room for: grows with use, up to R + T - 1
    std::vector<float> residual;    // keys [H][window_slots][d], then values [H][window_slots][d]
    std::vector<float> key_offset;  // [H][d] once the first page is encoded (center_keys), else empty
    int sink_count = 0;             // sink tokens held, at most sink_tokens
    size_t sink_slots = 0;          // tokens per head `sinks` has room for: grows with use, up to sink_tokens
    std::vector<uint16_t> sinks;    // f16 keys [H][sink_slots][d], then values (a CUDA cache's: the device's copy)
    // A CUDA cache's part: the device block table, window, key offset and sinks (the host vectors above stay empty,
    // but for the sinks, whose host copy appends, `to` and `save` read).
    std::unique_ptr<cuda::detail::DeviceLayer, cuda::detail::DeviceDeleter> device;
  };
  using Sequence = detail::SequenceTable<LayerState>::Sequence;
  struct PoolDeleter {
    size_t bytes;  // of the mapping (no initializer: it would keep the unique_ptr from default construction here)
    void operator()(uint8_t* p) const;
  };
  friend class CacheFile;
  friend class detail::CacheBuilder;
  friend struct cuda::detail::DeviceStore;
  friend class cuda::DecodeStep;
  friend struct cuda::detail::Backend;

  void check_layer(int layer) const;
  /// check_layer, and kvq::Error naming `what` when a sequence holds encoded tokens in the layer.
  void check_untouched(int layer, std::string_view what) const;
  size_t residual_slots() const;                                // R + T - 1
  void reserve_window(LayerState& layer, size_t tokens) const;  // room for `tokens` per head, the held ones kept
  void reserve_sinks(LayerState& layer, size_t tokens) const;   // the same for the sinks, up to sink_tokens
  // Sink tokens (CacheConfig::sink_tokens) of an append of n_tokens to `layer`: how many of its first tokens go to
  // the sinks; the check that f16 holds them ([n][H][d], finite already; `who` names the caller in the error); and
  // their store after the held ones, rounded to f16 (the room grown as reserve_sinks grows it).
  size_t sinks_taken(const LayerState& layer, size_t n_tokens) const;
  void check_sink_range(const std::string& who, const float* keys, const float* values, size_t n_sink) const;
  void store_sinks(LayerState& layer, const float* keys, const float* values, size_t n_sink) const;
  uint8_t* page_mut(PageId id);
  void zero_page_padding(uint8_t* page) const;
  // append's work on a layer's host state (a CPU cache's own, or a host copy of a CUDA cache's window and key
  // offset): the checks, the new pages encoded into page_at(j) (the j-th new page, zeroed padding), take(n) moving
  // the n pages off the free list into the block table, then the window and key offset advanced. Nothing changes
  // before take.
  void append_on_host(LayerState& ls, int layer, SeqId seq, const float* keys, const float* values, size_t n_tokens,
                      const std::function<uint8_t*(size_t)>& page_at, const std::function<void(size_t)>& take);

  // A CPU copy of `seqs` (every sequence when empty) with a pool of capacity_pages (0: this cache's).
  KVCache to_cpu(size_t capacity_pages, std::span<const SeqId> seqs = {}) const;

  CacheConfig config_;
  Device device_;
  std::vector<std::unique_ptr<Codec>> key_codecs_, value_codecs_;
  detail::PageLayout layout_;
  std::unique_ptr<uint8_t[], PoolDeleter> pool_;  // a CPU cache's pool
  std::unique_ptr<cuda::detail::DeviceStore, cuda::detail::DeviceDeleter> cuda_;  // a CUDA cache's
  detail::FreePages free_;
  detail::SequenceTable<LayerState> sequences_;
};

}  // namespace kvq

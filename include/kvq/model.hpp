// A Llama-family model on the CPU, in the manner of llama2.c: a config, weights that are views into the
// memory-mapped checkpoint (never copied or converted as a whole), and a runner holding the run state with one
// forward(token, pos) that reads like the model.
//
// One forward pass serves the Llama family; the architectures differ only in config fields and in which optional
// weights are present:
//   llama   RoPE on adjacent pairs (llama.cpp's converter permutes q/k rows for it), SwiGLU;
//   qwen2   q/k/v projection biases, RoPE on the two halves of each head (llama.cpp's "neox");
//   gemma3  heads wider than dim / n_heads (256), RMS norms of each q and k head, norms after attention and after
//           the feed-forward network, GeGLU (tanh GELU), token embeddings scaled by sqrt(dim), sliding-window layers
//           with their own RoPE base between global ones. Gemma's RMSNorm multiplies by (1 + w); llama.cpp's
//           converter stores 1 + w in the GGUF, so every norm here is the plain x / rms(x) * w.
//
// Checkpoints: GGUF (architectures llama, qwen2, gemma3; any computable ggml format, see detail/ggml_quants.hpp) and
// llama2.c's .bin (7 int32 {dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len}, a negative
// vocab_size meaning an unshared classifier, then fp32 weights in llama2.c's order).
//
// Text in and out: the Tokenizer (from the checkpoint or a tokenizer file) and the Sampler that picks each next
// token from the logits; generate() runs the three together.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "kvq/detail/ggml_quants.hpp"
#include "kvq/detail/gguf.hpp"
#include "kvq/detail/mapped_file.hpp"
#include "kvq/detail/random.hpp"

namespace kvq {

/// Which channels RoPE rotates together: (2i, 2i+1) (llama.cpp's "normal" mode) or (i, i + rope_dim/2) ("neox",
/// Hugging Face's rotate_half). Either way pair i turns by pos * theta^(-2i / rope_dim).
enum class RopeStyle { adjacent_pairs, halves };

/// The gate's nonlinearity in the gated feed-forward network: SiLU (SwiGLU) or GELU's tanh form (GeGLU).
enum class Activation { silu, gelu_tanh };

struct LlamaConfig {
  int dim = 0;           ///< residual stream width
  int hidden_dim = 0;    ///< feed-forward width
  int n_layers = 0;
  int n_heads = 0;       ///< query heads
  int n_kv_heads = 0;    ///< key/value heads (grouped-query attention: n_heads is a multiple)
  int vocab_size = 0;
  int max_seq_len = 0;   ///< the context the model was trained for
  int head_size = 0;     ///< width of each q/k/v head; 0: dim / n_heads
  int rope_dim = 0;      ///< leading dimensions of each head that RoPE rotates (= head_dim for Llama)
  RopeStyle rope_style = RopeStyle::adjacent_pairs;
  float rope_theta = 10000.0f;     ///< RoPE base (of the global layers where some layers slide)
  float rope_theta_sliding = 0;    ///< RoPE base of the sliding-window layers; 0: rope_theta
  int sliding_window = 0;          ///< positions a sliding-window layer sees, its own included; 0: no such layers
  int sliding_period = 0;          ///< with a window: the last layer of every period is global, the others slide
  Activation activation = Activation::silu;
  float embedding_scale = 1.0f;    ///< token embeddings are multiplied by this (Gemma: sqrt(dim))
  float norm_eps = 1e-5f;

  int head_dim() const { return head_size > 0 ? head_size : dim / n_heads; }
  int q_dim() const { return n_heads * head_dim(); }
  int kv_dim() const { return n_kv_heads * head_dim(); }
  /// Positions that `layer` attends to (its own included), or 0 for all of them.
  int window(int layer) const {
    return sliding_window > 0 && (sliding_period == 0 || layer % sliding_period != sliding_period - 1)
               ? sliding_window : 0;
  }
  float rope_base(int layer) const {
    return window(layer) > 0 && rope_theta_sliding > 0 ? rope_theta_sliding : rope_theta;
  }
  /// kvq::Error naming the first inconsistent field.
  void validate() const;
};

/// A matrix [rows][cols] stored row by row in a ggml format, viewed in place in the checkpoint.
struct WeightMatrix {
  GgmlType type = GgmlType::F32;
  const std::byte* data = nullptr;  ///< rows * row_bytes bytes
  int64_t rows = 0, cols = 0;
  size_t row_bytes = 0;

  const std::byte* row(int64_t r) const { return data + static_cast<size_t>(r) * row_bytes; }
};

/// A layer's weights; the optional ones are null where the architecture has none.
struct LlamaLayerWeights {
  const float* attn_norm = nullptr;       ///< [dim]
  WeightMatrix wq;                        ///< [q_dim][dim]
  WeightMatrix wk;                        ///< [kv_dim][dim]
  WeightMatrix wv;                        ///< [kv_dim][dim]
  const float* bq = nullptr;              ///< [q_dim]  optional bias of wq (Qwen2)
  const float* bk = nullptr;              ///< [kv_dim] optional
  const float* bv = nullptr;              ///< [kv_dim] optional
  const float* q_norm = nullptr;          ///< [head_dim] optional RMSNorm of every query head (Gemma 3)
  const float* k_norm = nullptr;          ///< [head_dim] optional, of every key head
  WeightMatrix wo;                        ///< [dim][q_dim]
  const float* post_attn_norm = nullptr;  ///< [dim] optional RMSNorm of the attention output (Gemma 3)
  const float* ffn_norm = nullptr;        ///< [dim]
  WeightMatrix w_gate;                    ///< [hidden_dim][dim]  (llama2.c: w1)
  WeightMatrix w_down;                    ///< [dim][hidden_dim]  (llama2.c: w2)
  WeightMatrix w_up;                      ///< [hidden_dim][dim]  (llama2.c: w3)
  const float* post_ffn_norm = nullptr;   ///< [dim] optional RMSNorm of the feed-forward output (Gemma 3)
};

struct LlamaWeights {
  WeightMatrix token_embedding;           ///< [vocab_size][dim]
  std::vector<LlamaLayerWeights> layers;  ///< [n_layers]
  const float* final_norm;                ///< [dim]
  WeightMatrix classifier;                ///< [vocab_size][dim]; the token embedding when tied
};

/// A loaded checkpoint: owns the mapping that the weights point into.
class LlamaModel {
 public:
  /// Loads a GGUF or llama2.c checkpoint, recognised by its first bytes.
  static LlamaModel load(const std::filesystem::path& path);

  const LlamaConfig& config() const { return config_; }
  const LlamaWeights& weights() const { return weights_; }
  /// The GGUF file (metadata, tokenizer), or nullptr for a llama2.c checkpoint.
  const GgufFile* gguf() const { return gguf_.get(); }
  /// Whether the weights were copied into memory (huge pages where the kernel has them), or stay mapped from a file
  /// too large for the memory available (kvq/detail/mapped_file.hpp).
  bool weights_copied() const;

 private:
  LlamaModel() = default;
  std::unique_ptr<GgufFile> gguf_;
  std::unique_ptr<MappedFile> bin_;
  LlamaConfig config_;
  LlamaWeights weights_;
};

/// Text <-> token ids. Two families:
///  - SentencePiece BPE (llama2.c tokenizer.bin; GGUF tokenizer.ggml.model = "llama"): a leading space is added
///    (unless the GGUF's add_space_prefix is false: Gemma), pieces are merged pairwise by highest score, characters
///    missing from the vocabulary fall back to <0xXX> byte tokens; after BOS the leading space of the first piece is
///    dropped when decoding. From GGUF, control and user-defined tokens written in the text are recognised first.
///  - Byte-level BPE (GGUF tokenizer.ggml.model = "gpt2"): text is split by the pre-tokenizer named in
///    tokenizer.ggml.pre, each piece's bytes are mapped to printable characters (GPT-2's byte-to-unicode map) and
///    merged by merge rank; control tokens written in the text (e.g. <|im_start|>) are recognised as themselves.
class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  /// The tokens of `text`, without BOS or EOS.
  virtual std::vector<int> encode(std::string_view text) const = 0;
  /// The bytes that `token` adds to a text whose previous token is `prev` (-1 at the start).
  virtual std::string decode(int prev, int token) const = 0;
  /// The text of a whole token sequence.
  std::string decode(std::span<const int> tokens) const;

  virtual int vocab_size() const = 0;
  /// The stored text of a token (for diagnostics); kvq::Error outside [0, vocab_size).
  virtual std::string_view piece(int token) const = 0;
  int bos() const { return bos_; }
  int eos() const { return eos_; }
  /// Whether a sequence starts with BOS (the model was trained so).
  bool add_bos() const { return add_bos_; }

 protected:
  int bos_ = -1, eos_ = -1;
  bool add_bos_ = true;
};

/// A llama2.c tokenizer.bin: int32 max_token_length, then per token {float score, int32 length, bytes}; BOS 1,
/// EOS 2.
std::unique_ptr<Tokenizer> load_llama2c_tokenizer(const std::filesystem::path& path);
/// The tokenizer stored in GGUF metadata (tokenizer.ggml.*).
std::unique_ptr<Tokenizer> load_gguf_tokenizer(const GgufFile& gguf);

/// The tokenizer of a model: `tokenizer_file` (llama2.c tokenizer.bin, or a GGUF file) when given, else the one
/// in the model's GGUF metadata (kvq::Error for a llama2.c checkpoint without a tokenizer file).
std::unique_ptr<Tokenizer> load_tokenizer(const LlamaModel& model, const std::filesystem::path& tokenizer_file);

/// The key and value codec specs of one layer, and whether its keys are stored centered (CacheConfig::center_keys
/// for this layer alone; it applies to key codecs that quantize, centering_applies in cache.hpp).
struct LayerCodecs {
  std::string key, value;
  bool center_keys = false;
  /// Trained state (Codec::state()) the layer's key / value codec starts with, e.g. from kvq calibrate: a cache
  /// built with it needs no training text. Empty: none (a codec that needs no training, or one trained later).
  std::vector<uint8_t> key_state, value_state;
  bool operator==(const LayerCodecs&) const = default;
  /// Whether two layers store alike (codecs and centering; their trained states may differ).
  bool same_codecs(const LayerCodecs& o) const {
    return key == o.key && value == o.value && center_keys == o.center_keys;
  }
};

/// The key/value cache of a runner. Both codec specs empty: the fp32 store with exact attention (no KVCache, the
/// reference); otherwise a kvq::KVCache holding one sequence, with these codecs (codec.hpp specs, e.g. "int4",
/// "turbo_prod:3") for keys and values, T tokens per page and R newest tokens in fp32.
struct KVCacheSpec {
  std::string key_codec;
  std::string value_codec;
  int block_tokens = 64;    ///< T
  int residual_tokens = 0;  ///< R, a multiple of T
  uint64_t seed = 0;        ///< seeds the codecs' rotations and sketches
  bool center_keys = false;  ///< CacheConfig::center_keys in every layer: keys stored minus their first-page mean
  int sink_tokens = 0;       ///< CacheConfig::sink_tokens: the first tokens of the sequence kept in f16, every layer
  /// Layers whose keys and values use these codecs, the others f16 (a diagnostic: which layers a codec hurts);
  /// empty: every layer.
  std::vector<int> layers;
  /// Codecs and key centering chosen per layer (kvq calibrate): [n_layers], replacing key_codec / value_codec and
  /// `layers`; empty: those. center_keys above centers every layer's keys whatever these say.
  std::vector<LayerCodecs> layer_codecs;

  bool compressed() const { return !key_codec.empty() || !value_codec.empty() || !layer_codecs.empty(); }
  /// "k/v" (e.g. "int4/int4", "int4/f16@layers 0,3", "per layer: int8/int4 x2, centered int4/int4 x1, ..."), or
  /// "fp32 (no cache)".
  std::string label() const;
};

/// Keys and values captured from a model: [layer][token][kv head][head_dim] per layer.
struct KVSample {
  std::vector<std::vector<float>> keys, values;
  size_t tokens = 0;
};

class KVStore;
class KVCache;
class ThreadPool;
namespace detail {
enum class Isa;
class Q8Rows;
}  // namespace detail

/// Where a runner's time went, in seconds, summed over its forward passes. The clock is read at stage boundaries
/// only (a few times per layer), so the split costs microseconds per forward pass.
struct StageTimes {
  double weights = 0;    ///< matrix products with the weights: projections, feed-forward network, classifier
  double attention = 0;  ///< attention over the cache; in a chunk of several positions, their cache append too
  double append = 0;     ///< appending one position's keys and values to the cache (one-position forwards)
  double total = 0;      ///< whole forward passes
  /// total minus the stages: norms, RoPE, activations, embeddings, checks.
  double rest() const { return total - weights - attention - append; }
  StageTimes operator-(const StageTimes& o) const {
    return {weights - o.weights, attention - o.attention, append - o.append, total - o.total};
  }
};

/// What the matrix products with quantized weights (Q4_0, Q4_1, Q8_0, Q4_K, Q6_K) take as their input.
enum class ProductInput {
  q8,   ///< activations quantized to 8 bits per block of 32, integer dot products (as llama.cpp): the default,
        ///< where the CPU has vector kernels for them (AVX2, AVX-512); fp32 elsewhere
  f32,  ///< the fp32 activations, weights dequantized on the fly: slower; the forward pass against fp32 references
};

/// Whether a runner's context may go beyond the positions the model was trained for.
enum class ContextLimit {
  trained,  ///< at most the model's max_seq_len
  any,      ///< any length: RoPE extrapolates, the output is meaningless past max_seq_len; for speed measurements
};

/// The run state of one sequence: activations, the key/value cache, the logits. One runner per sequence; the
/// model must outlive it.
class LlamaRunner {
 public:
  /// context: positions this runner can hold (<= the model's max_seq_len unless limit is ContextLimit::any);
  /// threads: 0 = all hardware threads.
  LlamaRunner(const LlamaModel& model, int context, int threads = 0, const KVCacheSpec& cache = {},
              ContextLimit limit = ContextLimit::trained);
  ~LlamaRunner();
  LlamaRunner(const LlamaRunner&) = delete;
  LlamaRunner& operator=(const LlamaRunner&) = delete;

  /// Runs `token` at position `pos` (pos = the number of tokens run since construction or reset) and returns the
  /// logits of the next token: [vocab_size], valid until the next call.
  std::span<const float> forward(int token, int pos);
  /// Runs tokens at positions pos .. pos + n - 1 as one chunk: matrix-matrix products over the weights, the
  /// chunk's keys and values appended to the cache, then causal attention over the cache. Returns the logits of
  /// every position, [n][vocab_size], or with all_logits = false those of the last one only, [vocab_size]; valid
  /// until the next call. A chunk of one token is forward(token, pos).
  std::span<const float> forward_chunk(std::span<const int> tokens, int pos, bool all_logits = true);
  /// forward_chunk that also writes the residual stream of the chunk's positions as it enters each layer and as it
  /// leaves the last one (before the final norm) to `residuals`: [n_layers + 1][n][dim], the input of
  /// forward_chunk_from.
  std::span<const float> forward_chunk_residuals(std::span<const int> tokens, int pos, std::span<float> residuals,
                                                 bool all_logits = true);
  /// Runs positions pos .. pos + n - 1 from `layer` on: x is their residual stream entering that layer, [n][dim]
  /// (forward_chunk_residuals' rows for `layer`); layer n_layers runs only the final norm and the classifier. The
  /// layers before `layer` are not run and their caches stay empty, so the logits are those of forward_chunk
  /// wherever those layers would have produced x (kvq calibrate: a cache that differs from the reference only from
  /// `layer` on starts from the reference's residual stream). Positions are counted in `layer`'s cache.
  std::span<const float> forward_chunk_from(int layer, std::span<const float> x, int pos, bool all_logits = true);
  /// Runs only `layer` (< n_layers) on x, the residual stream entering it, [n][dim], as forward_chunk_from does;
  /// returns the stream leaving it, [n][dim], valid until the next call.
  std::span<const float> forward_layer(int layer, std::span<const float> x, int pos);
  /// Floats of forward_chunk_residuals' buffer for n positions.
  size_t residual_floats(int n) const;
  /// Forgets the context: the next forward is at position 0.
  void reset();
  /// Positions run so far.
  int position() const;
  int context() const { return context_; }
  int threads() const;
  /// What the matrix products take as input from the next forward on (ProductInput::q8 at construction).
  void set_product_input(ProductInput input) { product_input_ = input; }
  /// The time of every forward pass since construction, by stage.
  const StageTimes& stage_times() const { return stage_times_; }

  /// The cache's configuration.
  const KVCacheSpec& cache_spec() const { return cache_spec_; }
  /// The compressed cache, or nullptr for the fp32 store.
  const KVCache* cache() const;
  /// Bytes the key/value cache holds now.
  size_t cache_bytes() const;
  /// Whether the cache's codecs must be trained (calibrate) before the first forward.
  bool needs_calibration() const;
  /// The model's own keys and values (after RoPE) for `tokens`, run through an f16 cache in windows of context()
  /// positions (each from position 0) and chunks of `chunk`: [layer][token][kv head][head_dim]. Only at position
  /// 0; the runner stays there.
  KVSample capture_kv(std::span<const int> tokens, int chunk = 64);
  /// Trains every layer's key and value codecs on the sample's vectors (every token and kv head of the layer).
  /// Codecs that need training (vecinfer) must get this before the first forward; others may use it (int8/int4
  /// set per-channel scales) or ignore it. Only at position 0.
  void train_cache(const KVSample& sample);
  /// train_cache(capture_kv(tokens, chunk)).
  void calibrate(std::span<const int> tokens, int chunk = 64);

 private:
  using Product = std::pair<const WeightMatrix*, float*>;
  /// out_k[i] = W_k x[i] for the n rows of x (out_k: [n][W_k.rows]); all products share x and their column count.
  /// Timed as StageTimes::weights.
  void project(std::initializer_list<Product> products, const float* x, int n);
  /// project's products, untimed.
  void multiply(std::initializer_list<Product> products, const float* x, int n);
  /// multiply where every weight format has an integer kernel: x quantized to 8 bits per block of 32 once.
  void multiply_q8(std::initializer_list<Product> products, const float* x, int n);
  /// Checks a residual stream entering `layer` at `pos` and copies it into x_; returns its positions.
  int load_residual(int layer, std::span<const float> x, int pos);
  /// kvq::Error unless positions pos .. pos + n - 1 come next in `layer`'s cache and fit in the context.
  void check_chunk(int layer, int pos, int n) const;
  /// Layers first_layer.. on the residual stream in x_, then the final norm and the classifier (untimed).
  std::span<const float> run_layers(int first_layer, int pos, int n, std::span<float> residuals, bool all_logits);
  void attention_block(const LlamaLayerWeights& w, int layer, int pos, int n);
  void ffn_block(const LlamaLayerWeights& w, int layer, int n);
  void reserve_chunk(int n);

  const LlamaModel& model_;
  StageTimes stage_times_;
  int context_;
  KVCacheSpec cache_spec_;
  std::unique_ptr<ThreadPool> pool_;
  detail::Isa isa_;                      // the instruction set of the weight kernels, chosen at construction
  ProductInput product_input_ = ProductInput::q8;
  std::unique_ptr<detail::Q8Rows> x_q8_;  // the input of the current product, quantized
  std::unique_ptr<KVStore> kv_;
  std::vector<std::vector<float>> scratch_;  // [worker] dequantized weight tiles
  // Per RoPE base: [context][rope_dim / 2][2], cos and sin of pos * theta^(-2i / rope_dim); layer l uses table
  // rope_table_[l].
  std::vector<std::vector<float>> rope_cos_sin_;
  std::vector<int> rope_table_;
  KVSample* capture_ = nullptr;  // where attention blocks copy their keys and values during capture_kv
  // Activations of the current chunk, one row per position, sized for chunk_capacity_ positions.
  int chunk_capacity_ = 0;
  std::vector<float> x_;       // [n][dim] residual stream
  std::vector<float> xb_;      // [n][dim] normalized input of a block
  std::vector<float> q_;       // [n][q_dim]
  std::vector<float> k_;       // [n][kv_dim]
  std::vector<float> v_;       // [n][kv_dim]
  std::vector<float> att_;     // [n][q_dim] attention output before wo
  std::vector<float> proj_;    // [n][dim] output of wo or w_down
  std::vector<float> gate_;    // [n][hidden_dim]
  std::vector<float> up_;      // [n][hidden_dim]
  std::vector<float> logits_;  // [n][vocab_size]
};

/// Picks the next token from logits: the most likely one (temperature 0) or a draw from softmax(logits / T).
class Sampler {
 public:
  /// temperature >= 0; the seed makes draws repeatable.
  Sampler(float temperature, uint64_t seed);
  int sample(std::span<const float> logits);

 private:
  float temperature_;
  Rng rng_;
  std::vector<double> probs_;
};

/// The index of the largest logit (the first on ties).
int argmax(std::span<const float> logits);

/// What generate() did: the new tokens and the time of the prompt and of the decode steps.
struct Generation {
  std::vector<int> tokens;      ///< the new tokens, the end token (EOS or BOS) that stopped it excluded
  size_t prompt_tokens = 0;
  double prefill_seconds = 0;   ///< the prompt but its last token, in chunks of kPrefillChunk
  double decode_seconds = 0;    ///< from the first new token to the last
  StageTimes decode_stages;     ///< decode_seconds by stage: the runner's forward passes in that time
  /// The prefill's tokens/s (0 for a prompt of one token).
  double prefill_tokens_per_second() const;
  /// Decode tokens/s: the tokens after the first over the time since the first came (the first step also runs the
  /// prompt's last token); 0 below two new tokens. The one definition the demo, generate and benchmarks print.
  double decode_tokens_per_second() const;
};

/// Positions per forward_chunk when generate() runs a prompt: every weight is read once per chunk, and the
/// activations of a chunk stay small (a whole long prompt at once would hold [n][vocab_size] logits).
inline constexpr int kPrefillChunk = 512;

/// Continues `prompt` (its tokens, BOS included where the tokenizer adds one) by up to `steps` tokens: the prompt
/// but its last token in chunks of kPrefillChunk from the runner's position 0, then one token at a time, each
/// drawn by `sampler`; stops early at the tokenizer's EOS or BOS. on_token(previous, next), when set, sees each new
/// token as it comes.
Generation generate(LlamaRunner& runner, const Tokenizer& tokenizer, std::span<const int> prompt, int steps,
                    Sampler& sampler, const std::function<void(int, int)>& on_token = {});

}  // namespace kvq

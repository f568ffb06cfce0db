// A Llama-family model on the CPU, in the manner of llama2.c: a config, weights that are views into the
// memory-mapped checkpoint (never copied or converted as a whole), and a runner holding the run state with one
// forward(token, pos) that reads like the model.
//
// Checkpoints: GGUF (architecture "llama"; any computable ggml format, see ggml_quants.hpp) and llama2.c's .bin
// (7 int32 {dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len}, a negative vocab_size meaning an
// unshared classifier, then fp32 weights in llama2.c's order).
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <initializer_list>
#include <memory>
#include <span>
#include <utility>
#include <vector>

#include "kvq/ggml_quants.hpp"
#include "kvq/gguf.hpp"
#include "kvq/mapped_file.hpp"
#include "kvq/tokenizer.hpp"

namespace kvq {

struct LlamaConfig {
  int dim = 0;           ///< residual stream width
  int hidden_dim = 0;    ///< feed-forward width
  int n_layers = 0;
  int n_heads = 0;       ///< query heads
  int n_kv_heads = 0;    ///< key/value heads (grouped-query attention: n_heads is a multiple)
  int vocab_size = 0;
  int max_seq_len = 0;   ///< the context the model was trained for
  int rope_dim = 0;      ///< leading dimensions of each head that RoPE rotates (= head_dim for Llama)
  float rope_theta = 10000.0f;
  float norm_eps = 1e-5f;

  int head_dim() const { return dim / n_heads; }
  int q_dim() const { return n_heads * head_dim(); }
  int kv_dim() const { return n_kv_heads * head_dim(); }
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

struct LlamaLayerWeights {
  const float* attn_norm;  ///< [dim]
  WeightMatrix wq;         ///< [q_dim][dim]
  WeightMatrix wk;         ///< [kv_dim][dim]
  WeightMatrix wv;         ///< [kv_dim][dim]
  WeightMatrix wo;         ///< [dim][q_dim]
  const float* ffn_norm;   ///< [dim]
  WeightMatrix w_gate;     ///< [hidden_dim][dim]  (llama2.c: w1)
  WeightMatrix w_down;     ///< [dim][hidden_dim]  (llama2.c: w2)
  WeightMatrix w_up;       ///< [hidden_dim][dim]  (llama2.c: w3)
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

 private:
  LlamaModel() = default;
  std::unique_ptr<GgufFile> gguf_;
  std::unique_ptr<MappedFile> bin_;
  LlamaConfig config_;
  LlamaWeights weights_;
};

/// The tokenizer of a model: `tokenizer_file` (llama2.c tokenizer.bin, or a GGUF file) when given, else the one
/// in the model's GGUF metadata (kvq::Error for a llama2.c checkpoint without a tokenizer file).
std::unique_ptr<Tokenizer> load_tokenizer(const LlamaModel& model, const std::filesystem::path& tokenizer_file);

class KvStore;
class ThreadPool;

/// The run state of one sequence: activations, the key/value store, the logits. One runner per sequence; the
/// model must outlive it.
class LlamaRunner {
 public:
  /// context: positions this runner can hold (<= the model's max_seq_len); threads: 0 = all hardware threads.
  LlamaRunner(const LlamaModel& model, int context, int threads = 0);
  ~LlamaRunner();
  LlamaRunner(const LlamaRunner&) = delete;
  LlamaRunner& operator=(const LlamaRunner&) = delete;

  /// Runs `token` at position `pos` (pos = the number of tokens run since construction or reset) and returns the
  /// logits of the next token: [vocab_size], valid until the next call.
  std::span<const float> forward(int token, int pos);
  /// Forgets the context: the next forward is at position 0.
  void reset();
  /// Positions run so far.
  int position() const;
  int context() const { return context_; }
  int threads() const;

 private:
  void matvec(std::initializer_list<std::pair<const WeightMatrix*, float*>> products, const float* x);
  void attention_block(const LlamaLayerWeights& w, int layer);
  void ffn_block(const LlamaLayerWeights& w);

  const LlamaModel& model_;
  int context_;
  std::unique_ptr<ThreadPool> pool_;
  std::unique_ptr<KvStore> kv_;
  std::vector<float> rope_freq_;     // [rope_dim / 2]: theta^(-2i / rope_dim)
  std::vector<float> rope_cos_sin_;  // [rope_dim / 2][2]: cos, sin of pos * rope_freq_[i] at the current position
  // Activations of the current position.
  std::vector<float> x_;       // [dim] residual stream
  std::vector<float> xb_;      // [dim] normalized input of a block
  std::vector<float> q_;       // [q_dim]
  std::vector<float> k_;       // [kv_dim]
  std::vector<float> v_;       // [kv_dim]
  std::vector<float> att_;     // [q_dim] attention output before wo
  std::vector<float> proj_;    // [dim] output of wo or w_down
  std::vector<float> gate_;    // [hidden_dim]
  std::vector<float> up_;      // [hidden_dim]
  std::vector<float> logits_;  // [vocab_size]
};

}  // namespace kvq

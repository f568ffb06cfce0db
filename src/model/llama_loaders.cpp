// Checkpoint loading: the config from the file's header or metadata, the weights as views into the mapping.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

#include "kvq/error.hpp"
#include "kvq/model.hpp"

namespace kvq {

void LlamaConfig::validate() const {
  const auto positive = [](int v, const char* name) { KVQ_CHECK(v > 0, "model config: ", name, " = ", v); };
  positive(dim, "dim");
  positive(hidden_dim, "hidden_dim");
  positive(n_layers, "n_layers");
  positive(n_heads, "n_heads");
  positive(n_kv_heads, "n_kv_heads");
  positive(vocab_size, "vocab_size");
  positive(max_seq_len, "max_seq_len");
  KVQ_CHECK(head_size > 0 || dim % n_heads == 0, "model config: dim ", dim, " is not a multiple of n_heads ",
            n_heads);
  KVQ_CHECK(head_size >= 0 && head_size <= 4096, "model config: head_size ", head_size);
  KVQ_CHECK(n_heads % n_kv_heads == 0, "model config: n_heads ", n_heads, " is not a multiple of n_kv_heads ",
            n_kv_heads);
  KVQ_CHECK(rope_dim > 0 && rope_dim % 2 == 0 && rope_dim <= head_dim(), "model config: rope_dim ", rope_dim,
            " must be even and at most head_dim ", head_dim());
  KVQ_CHECK(rope_theta > 0 && rope_theta_sliding >= 0 && norm_eps > 0, "model config: rope_theta ", rope_theta,
            ", rope_theta_sliding ", rope_theta_sliding, ", norm_eps ", norm_eps);
  KVQ_CHECK(sliding_window >= 0 && sliding_period >= 0, "model config: sliding_window ", sliding_window,
            ", sliding_period ", sliding_period);
  KVQ_CHECK(embedding_scale > 0 && std::isfinite(embedding_scale), "model config: embedding_scale ",
            embedding_scale);
}

namespace {

// --- llama2.c ----------------------------------------------------------------------------------------------

WeightMatrix f32_matrix(const float* data, int64_t rows, int64_t cols) {
  return {GgmlType::F32, reinterpret_cast<const std::byte*>(data), rows, cols, static_cast<size_t>(cols) * 4};
}

void load_llama2c(const MappedFile& file, LlamaConfig& c, LlamaWeights& w) {
  const std::span<const std::byte> b = file.bytes();
  const std::string where = file.path().string();
  int32_t h[7];
  KVQ_CHECK(b.size() >= sizeof h, where, ": too short for a llama2.c header (", b.size(), " bytes)");
  std::memcpy(h, b.data(), sizeof h);
  c.dim = h[0], c.hidden_dim = h[1], c.n_layers = h[2], c.n_heads = h[3], c.n_kv_heads = h[4];
  const bool shared_classifier = h[5] > 0;
  // A negative vocab_size says the classifier is stored apart; widened so that INT_MIN cannot overflow.
  const int64_t vocab_size = h[5] > 0 ? int64_t{h[5]} : -int64_t{h[5]};
  c.vocab_size = static_cast<int>(std::min<int64_t>(vocab_size, std::numeric_limits<int>::max()));
  c.max_seq_len = h[6];
  c.rope_theta = 10000.0f;
  c.norm_eps = 1e-5f;
  KVQ_CHECK(c.dim > 0 && c.dim <= 1 << 16 && c.hidden_dim > 0 && c.hidden_dim <= 1 << 18 && c.n_layers > 0 &&
                c.n_layers <= 1024 && c.n_heads > 0 && c.n_kv_heads > 0 && c.vocab_size > 0 &&
                c.vocab_size <= 1 << 22 && c.max_seq_len > 0 && c.max_seq_len <= 1 << 22,
            where, ": implausible llama2.c header {dim ", h[0], ", hidden_dim ", h[1], ", n_layers ", h[2],
            ", n_heads ", h[3], ", n_kv_heads ", h[4], ", vocab_size ", h[5], ", seq_len ", h[6], "}");
  c.rope_dim = c.dim / c.n_heads;
  c.validate();

  const size_t L = c.n_layers, dim = c.dim, hidden = c.hidden_dim, q_dim = c.q_dim(), kv_dim = c.kv_dim();
  const size_t head = c.head_dim(), vocab = c.vocab_size, seq = c.max_seq_len;
  const size_t floats = vocab * dim + L * dim + L * dim * q_dim + 2 * L * dim * kv_dim + L * q_dim * dim +
                        L * dim + 3 * L * dim * hidden + dim + seq * head + (shared_classifier ? 0 : vocab * dim);
  const size_t available = (b.size() - sizeof h) / 4;
  KVQ_CHECK(available >= floats, where, ": a llama2.c checkpoint with this header needs ", floats,
            " floats of weights, the file has ", available);

  const float* p = reinterpret_cast<const float*>(b.data() + sizeof h);  // the mapping is page-aligned
  const auto take = [&p](size_t n) {
    const float* at = p;
    p += n;
    return at;
  };
  w.token_embedding = f32_matrix(take(vocab * dim), c.vocab_size, c.dim);
  w.layers.resize(L);
  // llama2.c stores each kind of weight for all layers together.
  for (auto& l : w.layers) l.attn_norm = take(dim);
  for (auto& l : w.layers) l.wq = f32_matrix(take(q_dim * dim), static_cast<int64_t>(q_dim), c.dim);
  for (auto& l : w.layers) l.wk = f32_matrix(take(kv_dim * dim), static_cast<int64_t>(kv_dim), c.dim);
  for (auto& l : w.layers) l.wv = f32_matrix(take(kv_dim * dim), static_cast<int64_t>(kv_dim), c.dim);
  for (auto& l : w.layers) l.wo = f32_matrix(take(dim * q_dim), c.dim, static_cast<int64_t>(q_dim));
  for (auto& l : w.layers) l.ffn_norm = take(dim);
  for (auto& l : w.layers) l.w_gate = f32_matrix(take(hidden * dim), c.hidden_dim, c.dim);
  for (auto& l : w.layers) l.w_down = f32_matrix(take(dim * hidden), c.dim, c.hidden_dim);
  for (auto& l : w.layers) l.w_up = f32_matrix(take(hidden * dim), c.hidden_dim, c.dim);
  w.final_norm = take(dim);
  take(seq * head);  // freq_cis_real and freq_cis_imag, [seq_len][head_dim / 2] each: RoPE is recomputed
  w.classifier = shared_classifier ? w.token_embedding : f32_matrix(take(vocab * dim), c.vocab_size, c.dim);
}

// --- GGUF --------------------------------------------------------------------------------------------------

// The architectures kvq runs (model.hpp says how they differ).
enum class Arch { llama, qwen2, gemma3 };

Arch arch_from_name(const GgufFile& g, std::string_view name) {
  if (name == "llama") return Arch::llama;
  if (name == "qwen2") return Arch::qwen2;
  if (name == "gemma3") return Arch::gemma3;
  throw Error(detail::concat(g.path().string(), ": architecture \"", name,
                             "\" is not supported (kvq runs llama, qwen2 and gemma3)"));
}

class GgufLlamaReader {
 public:
  explicit GgufLlamaReader(const GgufFile& g) : g_(g), arch_(g.at("general.architecture").as_string()) {}

  const std::string& arch() const { return arch_; }
  bool has(std::string_view key) const { return g_.find(detail::concat(arch_, '.', key)) != nullptr; }
  int count(std::string_view key) const {
    const uint64_t v = g_.at(detail::concat(arch_, '.', key)).as_uint();
    KVQ_CHECK(v > 0 && v <= (1u << 24), g_.path().string(), ": ", arch_, '.', key, " = ", v, " is implausible");
    return static_cast<int>(v);
  }
  float real(std::string_view key, float fallback) const {
    const GgufValue* v = g_.find(detail::concat(arch_, '.', key));
    return v ? static_cast<float>(v->as_float()) : fallback;
  }

  WeightMatrix matrix(std::string_view name, int64_t rows, int64_t cols) const {
    const GgufTensorInfo& t = g_.tensor(name);
    KVQ_CHECK(t.shape == (std::vector<int64_t>{cols, rows}), g_.path().string(), ": tensor ", name, " has shape ",
              shape_text(t), ", expected [", cols, ", ", rows, "]");
    KVQ_CHECK(ggml_traits(t.type).computable, g_.path().string(), ": tensor ", name, " is ",
              ggml_traits(t.type).name, ", which kvq cannot compute with");
    return {t.type, t.data, rows, cols, ggml_row_bytes(t.type, cols)};
  }

  const float* vector(std::string_view name, int64_t n) const {
    const GgufTensorInfo& t = g_.tensor(name);
    KVQ_CHECK(t.shape == std::vector<int64_t>{n} && t.type == GgmlType::F32, g_.path().string(), ": tensor ", name,
              " is ", ggml_traits(t.type).name, " ", shape_text(t), ", expected F32 [", n, "]");
    KVQ_CHECK(reinterpret_cast<uintptr_t>(t.data) % alignof(float) == 0, g_.path().string(), ": tensor ", name,
              " is not aligned for fp32 access");
    return reinterpret_cast<const float*>(t.data);
  }
  /// vector(name, n) where the file has the tensor, else null.
  const float* optional_vector(const std::string& name, int64_t n) const {
    return g_.find_tensor(name) ? vector(name, n) : nullptr;
  }

 private:
  static std::string shape_text(const GgufTensorInfo& t) {
    std::string s = "[";
    for (size_t i = 0; i < t.shape.size(); ++i) s += (i ? ", " : "") + std::to_string(t.shape[i]);
    return s + "]";
  }

  const GgufFile& g_;
  std::string arch_;
};

// llama.cpp's values for Gemma 3, which its GGUF files do not carry: the local layers' RoPE base (unless
// rope.freq_base_swa gives it) and the period of global layers (every sixth).
constexpr float kGemma3SlidingRopeBase = 10000.0f;
constexpr int kGemma3SlidingPeriod = 6;

void load_gguf_llama(const GgufFile& g, LlamaConfig& c, LlamaWeights& w) {
  const GgufLlamaReader r(g);
  const Arch arch = arch_from_name(g, r.arch());
  c.dim = r.count("embedding_length");
  c.hidden_dim = r.count("feed_forward_length");
  c.n_layers = r.count("block_count");
  c.n_heads = r.count("attention.head_count");
  c.n_kv_heads = r.has("attention.head_count_kv") ? r.count("attention.head_count_kv") : c.n_heads;
  c.max_seq_len = r.count("context_length");
  if (r.has("attention.key_length")) {
    c.head_size = r.count("attention.key_length");
    const int value_length = r.has("attention.value_length") ? r.count("attention.value_length") : c.head_size;
    KVQ_CHECK(value_length == c.head_size, g.path().string(), ": attention.key_length ", c.head_size,
              " and value_length ", value_length, " differ, which kvq does not support");
  }
  KVQ_CHECK(c.head_size > 0 || c.dim % c.n_heads == 0, g.path().string(), ": embedding_length ", c.dim,
            " is not a multiple of head_count ", c.n_heads);
  c.rope_dim = r.has("rope.dimension_count") ? r.count("rope.dimension_count") : c.head_dim();
  c.rope_theta = r.real("rope.freq_base", 10000.0f);
  if (const GgufValue* scaling = g.find(detail::concat(r.arch(), ".rope.scaling.type"))) {
    KVQ_CHECK(scaling->as_string() == "none", g.path().string(), ": RoPE scaling \"", scaling->as_string(),
              "\" is not supported");
  }
  c.norm_eps = r.real("attention.layer_norm_rms_epsilon", 1e-5f);
  // llama.cpp's converter permutes the rows of llama's q and k so that RoPE rotates adjacent pairs; the other
  // architectures keep Hugging Face's order, whose RoPE rotates the two halves of each head.
  c.rope_style = arch == Arch::llama ? RopeStyle::adjacent_pairs : RopeStyle::halves;
  if (arch == Arch::gemma3) {
    c.sliding_window = r.count("attention.sliding_window");
    c.sliding_period = kGemma3SlidingPeriod;
    c.rope_theta_sliding = r.real("rope.freq_base_swa", kGemma3SlidingRopeBase);
    c.activation = Activation::gelu_tanh;
    c.embedding_scale = std::sqrt(static_cast<float>(c.dim));
  }
  const GgufTensorInfo& embedding = g.tensor("token_embd.weight");
  KVQ_CHECK(embedding.shape.size() == 2, g.path().string(), ": token_embd.weight is not a matrix");
  c.vocab_size = static_cast<int>(embedding.shape[1]);
  c.validate();

  w.token_embedding = r.matrix("token_embd.weight", c.vocab_size, c.dim);
  // Every layer has tensors of its own: checked before the layers are allocated (a missing one is named below).
  KVQ_CHECK(static_cast<size_t>(c.n_layers) <= g.tensors().size(), g.path().string(), ": ", r.arch(),
            ".block_count = ", c.n_layers, " but the file holds only ", g.tensors().size(), " tensors");
  w.layers.resize(c.n_layers);
  for (int i = 0; i < c.n_layers; ++i) {
    const auto name = [i](const char* what, const char* kind = "weight") {
      return detail::concat("blk.", i, '.', what, '.', kind);
    };
    LlamaLayerWeights& l = w.layers[i];
    l.attn_norm = r.vector(name("attn_norm"), c.dim);
    l.wq = r.matrix(name("attn_q"), c.q_dim(), c.dim);
    l.wk = r.matrix(name("attn_k"), c.kv_dim(), c.dim);
    l.wv = r.matrix(name("attn_v"), c.kv_dim(), c.dim);
    l.wo = r.matrix(name("attn_output"), c.dim, c.q_dim());
    l.ffn_norm = r.vector(name("ffn_norm"), c.dim);
    l.w_gate = r.matrix(name("ffn_gate"), c.hidden_dim, c.dim);
    l.w_down = r.matrix(name("ffn_down"), c.dim, c.hidden_dim);
    l.w_up = r.matrix(name("ffn_up"), c.hidden_dim, c.dim);
    if (arch == Arch::qwen2) {
      l.bq = r.vector(name("attn_q", "bias"), c.q_dim());
      l.bk = r.vector(name("attn_k", "bias"), c.kv_dim());
      l.bv = r.vector(name("attn_v", "bias"), c.kv_dim());
    } else {
      l.bq = r.optional_vector(name("attn_q", "bias"), c.q_dim());
      l.bk = r.optional_vector(name("attn_k", "bias"), c.kv_dim());
      l.bv = r.optional_vector(name("attn_v", "bias"), c.kv_dim());
    }
    if (arch == Arch::gemma3) {
      l.q_norm = r.vector(name("attn_q_norm"), c.head_dim());
      l.k_norm = r.vector(name("attn_k_norm"), c.head_dim());
      l.post_attn_norm = r.vector(name("post_attention_norm"), c.dim);
      l.post_ffn_norm = r.vector(name("post_ffw_norm"), c.dim);
    }
  }
  w.final_norm = r.vector("output_norm.weight", c.dim);
  w.classifier = g.find_tensor("output.weight") ? r.matrix("output.weight", c.vocab_size, c.dim) : w.token_embedding;
}

bool starts_with_gguf_magic(const std::filesystem::path& path) {
  const MappedFile f(path);
  return f.bytes().size() >= 4 && std::memcmp(f.bytes().data(), "GGUF", 4) == 0;
}

}  // namespace

LlamaModel LlamaModel::load(const std::filesystem::path& path) {
  LlamaModel m;
  // The weights are copied into memory (huge pages where the kernel has them): every decode step streams them all.
  // A file too large for the memory available stays mapped (weights_copied()).
  if (starts_with_gguf_magic(path)) {
    m.gguf_ = std::make_unique<GgufFile>(path, FileResidency::copied);
    load_gguf_llama(*m.gguf_, m.config_, m.weights_);
  } else {
    m.bin_ = std::make_unique<MappedFile>(path, FileResidency::copied);
    load_llama2c(*m.bin_, m.config_, m.weights_);
  }
  return m;
}

bool LlamaModel::weights_copied() const {
  return (gguf_ ? gguf_->residency() : bin_->residency()) == FileResidency::copied;
}

std::unique_ptr<Tokenizer> load_tokenizer(const LlamaModel& model, const std::filesystem::path& tokenizer_file) {
  std::unique_ptr<Tokenizer> t;
  if (!tokenizer_file.empty()) {
    t = starts_with_gguf_magic(tokenizer_file) ? load_gguf_tokenizer(GgufFile(tokenizer_file))
                                               : load_llama2c_tokenizer(tokenizer_file);
  } else {
    KVQ_CHECK(model.gguf() != nullptr, "a llama2.c checkpoint has no tokenizer inside: give a tokenizer file");
    t = load_gguf_tokenizer(*model.gguf());
  }
  KVQ_CHECK(t->vocab_size() == model.config().vocab_size, "the tokenizer has ", t->vocab_size(),
            " tokens, the model ", model.config().vocab_size);
  return t;
}

}  // namespace kvq

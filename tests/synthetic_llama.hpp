// A small random Llama in GGUF for tests of the runner with key/value caches: heads of dimension 64 (which every
// codec holds), grouped-query attention, F16 / Q8_0 / Q4_1 weights, key channels 5 and 40 of every head 8x larger
// (the outlier channels of real keys); and a byte tokenizer with BOS for it.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstring>
#include <optional>
#include <string>
#include <vector>

#include "core/half.hpp"
#include "gguf_writer.hpp"
#include "kvq/detail/ggml_quants.hpp"
#include "kvq/detail/random.hpp"
#include "kvq/model.hpp"
#include "temp_file.hpp"

namespace kvq::test {

class SyntheticLlama {
 public:
  static constexpr int kDim = 256, kHidden = 384, kLayers = 2, kHeads = 4, kKvHeads = 2, kVocab = 64;
  static constexpr int kHeadDim = kDim / kHeads;

  /// poisoned: the name of a tensor whose bytes are all 0xFF (NaN in every F16 entry and block scale), or empty.
  explicit SyntheticLlama(uint64_t seed, int context = 512, const std::string& poisoned = "")
      : file_("synthetic_cache_llama.gguf") {
    Rng rng(seed);
    GgufWriter w;
    w.kv_string("general.architecture", "llama");
    w.kv<uint32_t>("llama.embedding_length", GgufType::u32, kDim);
    w.kv<uint32_t>("llama.feed_forward_length", GgufType::u32, kHidden);
    w.kv<uint32_t>("llama.block_count", GgufType::u32, kLayers);
    w.kv<uint32_t>("llama.attention.head_count", GgufType::u32, kHeads);
    w.kv<uint32_t>("llama.attention.head_count_kv", GgufType::u32, kKvHeads);
    w.kv<uint32_t>("llama.context_length", GgufType::u32, static_cast<uint32_t>(context));
    w.kv<float>("llama.rope.freq_base", GgufType::f32, 10000.0f);
    w.kv<float>("llama.attention.layer_norm_rms_epsilon", GgufType::f32, 1e-5f);
    const auto add = [&](const std::string& name, GgmlType type, int rows, int cols, double scale,
                         bool outlier_keys = false) {
      std::vector<uint64_t> shape = {static_cast<uint64_t>(cols)};
      if (rows > 0) shape.push_back(static_cast<uint64_t>(rows));
      std::vector<uint8_t> data = tensor(rng, type, std::max(rows, 1), cols, scale, outlier_keys);
      if (name == poisoned) std::fill(data.begin(), data.end(), uint8_t{0xFF});
      w.tensor(name, shape, type, std::move(data));
    };
    add("token_embd.weight", GgmlType::F16, kVocab, kDim, 1.0);
    add("output.weight", GgmlType::F16, kVocab, kDim, 3.0 / std::sqrt(kDim));
    add("output_norm.weight", GgmlType::F32, 0, kDim, 1.0);
    const double s = 1.0 / std::sqrt(kDim);
    for (int l = 0; l < kLayers; ++l) {
      const std::string p = "blk." + std::to_string(l) + ".";
      add(p + "attn_norm.weight", GgmlType::F32, 0, kDim, 1.0);
      add(p + "ffn_norm.weight", GgmlType::F32, 0, kDim, 1.0);
      add(p + "attn_q.weight", GgmlType::Q8_0, kDim, kDim, 2 * s);
      add(p + "attn_k.weight", GgmlType::Q8_0, kKvHeads * kHeadDim, kDim, 2 * s, true);
      add(p + "attn_v.weight", GgmlType::Q4_1, kKvHeads * kHeadDim, kDim, s);
      add(p + "attn_output.weight", GgmlType::F16, kDim, kDim, s);
      add(p + "ffn_gate.weight", GgmlType::Q8_0, kHidden, kDim, s);
      add(p + "ffn_up.weight", GgmlType::F16, kHidden, kDim, s);
      add(p + "ffn_down.weight", GgmlType::Q8_0, kDim, kHidden, 1.0 / std::sqrt(kHidden));
    }
    model_.emplace(LlamaModel::load(file_.write(w.bytes())));
  }

  const LlamaModel& model() const { return *model_; }

 private:
  // Random rows of `type` (F32: norm weights about 1; F16, Q8_0 or Q4_1: entries of about `scale`);
  // outlier_keys: rows 5 and 40 of every 64 eight times larger.
  static std::vector<uint8_t> tensor(Rng& rng, GgmlType type, int rows, int cols, double scale, bool outlier_keys) {
    const size_t row_bytes = ggml_row_bytes(type, cols);
    std::vector<uint8_t> data(row_bytes * static_cast<size_t>(rows));
    for (int r = 0; r < rows; ++r) {
      const double sr = outlier_keys && (r % 64 == 5 || r % 64 == 40) ? 8 * scale : scale;
      uint8_t* row = data.data() + row_bytes * static_cast<size_t>(r);
      for (int c = 0; c < cols; c += 32) {
        if (type == GgmlType::F32 || type == GgmlType::F16) {
          for (int j = c; j < std::min(cols, c + 32); ++j) {
            // F32 tensors are the norms' weights: about 1.
            const float v = static_cast<float>(type == GgmlType::F32 ? 1.0 + 0.1 * rng.normal() : sr * rng.normal());
            if (type == GgmlType::F32) {
              std::memcpy(row + 4 * j, &v, 4);
            } else {
              const uint16_t h = f32_to_f16(v);
              std::memcpy(row + 2 * j, &h, 2);
            }
          }
          continue;
        }
        uint8_t* block = row + static_cast<size_t>(c / 32) * ggml_traits(type).block_bytes;
        const uint16_t d = f32_to_f16(static_cast<float>(type == GgmlType::Q8_0 ? sr / 64 : sr / 4));
        std::memcpy(block, &d, 2);
        if (type == GgmlType::Q8_0) {
          for (int j = 0; j < 32; ++j)
            block[2 + j] = static_cast<uint8_t>(static_cast<int8_t>(rng.normal() * 64 / 1.5));
        } else {  // Q4_1: d, m = -8 d, 4-bit codes around 8
          const uint16_t m = f32_to_f16(static_cast<float>(-8 * sr / 4));
          std::memcpy(block + 2, &m, 2);
          for (int j = 0; j < 16; ++j) block[4 + j] = static_cast<uint8_t>(rng.next_u64());
        }
      }
    }
    return data;
  }

  TempFile file_;
  std::optional<LlamaModel> model_;
};

/// One token per byte (ids 3..63), BOS 1, EOS 2.
class ByteTokenizer final : public Tokenizer {
 public:
  ByteTokenizer() { bos_ = 1, eos_ = 2, add_bos_ = true; }
  std::vector<int> encode(std::string_view text) const override {
    std::vector<int> ids;
    for (unsigned char ch : text) ids.push_back(3 + ch % 61);
    return ids;
  }
  std::string decode(int, int token) const override { return std::string(1, static_cast<char>('!' + token)); }
  int vocab_size() const override { return SyntheticLlama::kVocab; }
  std::string_view piece(int) const override { return "?"; }
};

/// n random token ids in [3, kVocab).
inline std::vector<int> random_tokens(Rng& rng, size_t n) {
  std::vector<int> ids(n);
  for (int& t : ids) t = 3 + static_cast<int>(rng.next_u64() % (SyntheticLlama::kVocab - 3));
  return ids;
}

}  // namespace kvq::test

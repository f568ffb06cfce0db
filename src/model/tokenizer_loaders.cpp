// Builds tokenizers from llama2.c tokenizer.bin files and from GGUF metadata.
#include <cstring>

#include "kvq/detail/gguf.hpp"
#include "kvq/detail/mapped_file.hpp"
#include "kvq/error.hpp"
#include "model/tokenizers.hpp"

namespace kvq {
namespace {

bool looks_like_byte_token(std::string_view p) {
  const auto hex = [](char c) { return (c >= '0' && c <= '9') || (c >= 'A' && c <= 'F'); };
  return p.size() == 6 && p.starts_with("<0x") && p.back() == '>' && hex(p[3]) && hex(p[4]);
}

std::string replace_all(std::string_view s, std::string_view from, std::string_view to) {
  std::string out;
  for (size_t pos = 0;;) {
    const size_t at = s.find(from, pos);
    out.append(s.substr(pos, at - pos));
    if (at == std::string_view::npos) return out;
    out.append(to);
    pos = at + from.size();
  }
}

int optional_id(const GgufFile& g, std::string_view key, int fallback, size_t vocab) {
  const GgufValue* v = g.find(key);
  if (!v) return fallback;
  const uint64_t id = v->as_uint();
  KVQ_CHECK(id < vocab, g.path().string(), ": ", key, " = ", id, " is outside the vocabulary of ", vocab);
  return static_cast<int>(id);
}

bool optional_bool(const GgufFile& g, std::string_view key, bool fallback) {
  const GgufValue* v = g.find(key);
  return v ? v->as_bool() : fallback;
}

std::vector<TokenType> gguf_token_types(const GgufFile& g, size_t n) {
  std::vector<TokenType> types(n, TokenType::normal);
  if (const GgufValue* v = g.find("tokenizer.ggml.token_type")) {
    const std::vector<int64_t> t = v->as_ints();
    KVQ_CHECK(t.size() == n, g.path().string(), ": tokenizer.ggml.token_type has ", t.size(), " entries for ", n,
              " tokens");
    for (size_t i = 0; i < n; ++i) {
      KVQ_CHECK(t[i] >= 0 && t[i] <= 6, g.path().string(), ": token ", i, " has unknown type ", t[i]);
      types[i] = static_cast<TokenType>(t[i]);
    }
  }
  return types;
}

}  // namespace

std::string Tokenizer::decode(std::span<const int> tokens) const {
  std::string out;
  int prev = -1;
  for (int t : tokens) {
    out += decode(prev, t);
    prev = t;
  }
  return out;
}

std::unique_ptr<Tokenizer> load_llama2c_tokenizer(const std::filesystem::path& path) {
  const MappedFile file(path);
  const std::span<const std::byte> b = file.bytes();
  size_t pos = 0;
  const auto read_i32 = [&](const char* what) {
    KVQ_CHECK(b.size() - pos >= 4, path.string(), ": truncated at byte ", pos, " reading ", what);
    int32_t v;
    std::memcpy(&v, b.data() + pos, 4);
    pos += 4;
    return v;
  };
  const int32_t max_len = read_i32("max_token_length");
  KVQ_CHECK(max_len > 0 && max_len <= 1 << 16, path.string(), ": max_token_length ", max_len,
            " is implausible (not a llama2.c tokenizer?)");
  SentencePieceVocab v;
  while (pos < b.size()) {
    const size_t id = v.pieces.size();
    float score;
    KVQ_CHECK(b.size() - pos >= 4, path.string(), ": truncated in the score of token ", id);
    std::memcpy(&score, b.data() + pos, 4);
    pos += 4;
    const int32_t len = read_i32("a token length");
    KVQ_CHECK(len >= 0 && len <= max_len && static_cast<size_t>(len) <= b.size() - pos, path.string(), ": token ",
              id, " has length ", len, " (max_token_length ", max_len, ", ", b.size() - pos, " bytes left)");
    v.pieces.emplace_back(reinterpret_cast<const char*>(b.data() + pos), static_cast<size_t>(len));
    v.scores.push_back(score);
    pos += static_cast<size_t>(len);
  }
  KVQ_CHECK(v.pieces.size() > 2, path.string(), ": only ", v.pieces.size(), " tokens");
  // llama2.c's fixed ids: 0 <unk>, 1 BOS, 2 EOS; byte tokens are recognised by their text.
  for (size_t id = 0; id < v.pieces.size(); ++id)
    v.types.push_back(id == 0 ? TokenType::unknown
                      : id <= 2 ? TokenType::control
                      : looks_like_byte_token(v.pieces[id]) ? TokenType::byte
                                                            : TokenType::normal);
  return make_sentencepiece_tokenizer(std::move(v));
}

std::unique_ptr<Tokenizer> load_gguf_tokenizer(const GgufFile& g) {
  const std::string_view model = g.at("tokenizer.ggml.model").as_string();
  const std::vector<std::string_view> tokens = g.at("tokenizer.ggml.tokens").as_strings();
  const size_t n = tokens.size();
  KVQ_CHECK(n > 0, g.path().string(), ": tokenizer.ggml.tokens is empty");
  if (model == "llama") {
    SentencePieceVocab v;
    for (std::string_view t : tokens) v.pieces.push_back(replace_all(t, "\xE2\x96\x81", " "));  // U+2581 -> ' '
    v.types = gguf_token_types(g, n);
    if (!g.find("tokenizer.ggml.token_type"))
      for (size_t i = 0; i < n; ++i)
        if (looks_like_byte_token(v.pieces[i])) v.types[i] = TokenType::byte;
    if (const GgufValue* s = g.find("tokenizer.ggml.scores")) v.scores = s->as_floats();
    else v.scores.assign(n, 0.0f);
    KVQ_CHECK(v.scores.size() == n, g.path().string(), ": tokenizer.ggml.scores has ", v.scores.size(),
              " entries for ", n, " tokens");
    v.bos = optional_id(g, "tokenizer.ggml.bos_token_id", 1, n);
    v.eos = optional_id(g, "tokenizer.ggml.eos_token_id", 2, n);
    v.unk = optional_id(g, "tokenizer.ggml.unknown_token_id", 0, n);
    v.add_bos = optional_bool(g, "tokenizer.ggml.add_bos_token", true);
    v.add_space_prefix = optional_bool(g, "tokenizer.ggml.add_space_prefix", true);
    v.literal_specials = true;
    return make_sentencepiece_tokenizer(std::move(v));
  }
  if (model == "gpt2") {
    ByteLevelBpeVocab v;
    v.tokens.assign(tokens.begin(), tokens.end());
    v.types = gguf_token_types(g, n);
    for (std::string_view m : g.at("tokenizer.ggml.merges").as_strings()) v.merges.emplace_back(m);
    const GgufValue* pre = g.find("tokenizer.ggml.pre");
    v.pre = pre_tokenizer_from_name(pre ? pre->as_string() : "gpt2");
    v.bos = optional_id(g, "tokenizer.ggml.bos_token_id", -1, n);
    v.eos = optional_id(g, "tokenizer.ggml.eos_token_id", -1, n);
    v.add_bos = optional_bool(g, "tokenizer.ggml.add_bos_token", false) && v.bos >= 0;
    return make_byte_level_bpe_tokenizer(std::move(v));
  }
  throw Error(detail::concat(g.path().string(), ": unsupported tokenizer.ggml.model \"", model,
                             "\" (kvq supports llama and gpt2)"));
}

}  // namespace kvq

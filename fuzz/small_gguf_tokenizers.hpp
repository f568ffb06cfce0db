// Two small tokenizers written as GGUF files, the shape of real ones: a SentencePiece vocabulary (llama) with all 256
// byte tokens, merges and special tokens, and a byte-level BPE vocabulary (gpt2) with all 256 byte characters,
// merges and control tokens. tokenizer_text_fuzzer runs them; make_seeds writes them into the GGUF corpora.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "gguf_writer.hpp"
#include "kvq/detail/gguf.hpp"

namespace kvq::fuzz {

/// The text of a SentencePiece vocabulary with a space written as GGUF writes it (U+2581).
inline std::string spm_piece(std::string_view text) {
  std::string out;
  for (char ch : text) out += ch == ' ' ? std::string("\xE2\x96\x81") : std::string(1, ch);
  return out;
}

/// tokenizer.ggml.model "llama": <unk>, <s>, </s>, the byte tokens of bytes below `byte_tokens` (all 256 spell
/// every text; seeds take fewer, to stay small), letters and a few merged pieces (the longer, the higher the
/// score), a user-defined "\t\t" and a control <start_of_turn>.
inline std::vector<uint8_t> sentencepiece_gguf(int byte_tokens = 256) {
  std::vector<std::string> tokens = {"<unk>", "<s>", "</s>"};
  std::vector<float> scores = {0, 0, 0};
  std::vector<int32_t> types = {2, 3, 3};
  for (int b = 0; b < byte_tokens; ++b) {
    constexpr char kHex[] = "0123456789ABCDEF";
    tokens.push_back(std::string("<0x") + kHex[b >> 4] + kHex[b & 15] + ">");
    scores.push_back(0);
    types.push_back(6);
  }
  std::vector<std::string> pieces = {" ", ",", ".", "1", "2", "3"};
  for (char ch = 'a'; ch <= 'z'; ++ch) pieces.emplace_back(1, ch);
  for (const char* merged : {"th", "he", " t", " the", "in", " a", "an", "er", "on", " o", "nc", "nce", " on",
                             "ce", "up", " up", "ti", "me", "time", " time", "12", "123", " 1"})
    pieces.emplace_back(merged);
  for (const std::string& p : pieces) {
    tokens.push_back(spm_piece(p));
    scores.push_back(-100.0f + static_cast<float>(p.size()));
    types.push_back(1);
  }
  tokens.emplace_back("\t\t");
  scores.push_back(0);
  types.push_back(4);
  tokens.emplace_back("<start_of_turn>");
  scores.push_back(0);
  types.push_back(3);

  test::GgufWriter w;
  w.kv_string("tokenizer.ggml.model", "llama");
  w.kv_strings("tokenizer.ggml.tokens", tokens);
  w.kv_array<float>("tokenizer.ggml.scores", GgufType::f32, scores);
  w.kv_array<int32_t>("tokenizer.ggml.token_type", GgufType::i32, types);
  w.kv<uint32_t>("tokenizer.ggml.bos_token_id", GgufType::u32, 1);
  w.kv<uint32_t>("tokenizer.ggml.eos_token_id", GgufType::u32, 2);
  w.kv<uint32_t>("tokenizer.ggml.unknown_token_id", GgufType::u32, 0);
  w.kv<uint8_t>("tokenizer.ggml.add_bos_token", GgufType::boolean, 1);
  w.kv<uint8_t>("tokenizer.ggml.add_space_prefix", GgufType::boolean, 1);
  return w.bytes();
}

/// GPT-2's printable stand-in (UTF-8) for byte b: itself where printable, else U+0100 + its rank among the others.
inline std::string gpt2_byte_char(int b) {
  const auto printable = [](int c) { return (c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || c >= 0xAE; };
  char32_t cp = static_cast<char32_t>(b);
  if (!printable(b)) {
    cp = 256;
    for (int c = 0; c < b; ++c) cp += printable(c) ? 0 : 1;
  }
  std::string out;
  if (cp < 0x80) {
    out += static_cast<char>(cp);
  } else {
    out += static_cast<char>(0xC0 | (cp >> 6));
    out += static_cast<char>(0x80 | (cp & 0x3F));
  }
  return out;
}

/// tokenizer.ggml.model "gpt2" with pre-tokenizer `pre`: the 256 byte characters, merges of a few common pairs (by
/// rank), control tokens <|im_start|>, <|im_end|> and <|endoftext|>.
inline std::vector<uint8_t> byte_level_bpe_gguf(std::string_view pre) {
  std::vector<std::string> tokens;
  for (int b = 0; b < 256; ++b) tokens.push_back(gpt2_byte_char(b));
  const std::string space = gpt2_byte_char(' ');
  const std::vector<std::pair<std::string, std::string>> pairs = {
      {space, "t"}, {"h", "e"}, {space + "t", "he"}, {"i", "n"}, {space, "a"}, {"o", "n"},   {"e", "r"},
      {space, "o"}, {"1", "2"}, {"12", "3"},         {space, space}, {"\xC4\x8A", "\xC4\x8A"}, {"a", "n"}};
  std::vector<std::string> merges;
  for (const auto& [left, right] : pairs) {
    merges.push_back(left + " " + right);
    tokens.push_back(left + right);
  }
  std::vector<int32_t> types(tokens.size(), 1);
  for (const char* control : {"<|im_start|>", "<|im_end|>", "<|endoftext|>"}) {
    tokens.emplace_back(control);
    types.push_back(3);
  }
  test::GgufWriter w;
  w.kv_string("tokenizer.ggml.model", "gpt2");
  w.kv_string("tokenizer.ggml.pre", pre);
  w.kv_strings("tokenizer.ggml.tokens", tokens);
  w.kv_array<int32_t>("tokenizer.ggml.token_type", GgufType::i32, types);
  w.kv_strings("tokenizer.ggml.merges", merges);
  w.kv<uint32_t>("tokenizer.ggml.bos_token_id", GgufType::u32, static_cast<uint32_t>(tokens.size() - 3));
  w.kv<uint32_t>("tokenizer.ggml.eos_token_id", GgufType::u32, static_cast<uint32_t>(tokens.size() - 2));
  return w.bytes();
}

}  // namespace kvq::fuzz

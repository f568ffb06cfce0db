// Text <-> token ids. Two families:
//  - SentencePiece BPE (llama2.c tokenizer.bin; GGUF tokenizer.ggml.model = "llama"): a leading space is added
//    (unless the GGUF's add_space_prefix is false: Gemma), pieces are merged pairwise by highest score, characters
//    missing from the vocabulary fall back to <0xXX> byte tokens; after BOS the leading space of the first piece is
//    dropped when decoding. From GGUF, control and user-defined tokens written in the text are recognised first.
//  - Byte-level BPE (GGUF tokenizer.ggml.model = "gpt2"): text is split by the pre-tokenizer named in
//    tokenizer.ggml.pre, each piece's bytes are mapped to printable characters (GPT-2's byte-to-unicode map) and
//    merged by merge rank; control tokens written in the text (e.g. <|im_start|>) are recognised as themselves.
#pragma once

#include <filesystem>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace kvq {

class GgufFile;

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

}  // namespace kvq

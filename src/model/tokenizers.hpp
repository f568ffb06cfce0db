// The tokenizer implementations and what they are built from (the loaders in tokenizer_loaders.cpp fill these).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "kvq/model.hpp"
#include "model/pretokenizer.hpp"

namespace kvq {

/// GGUF token types (tokenizer.ggml.token_type), as llama.cpp numbers them.
enum class TokenType : int { undefined = 0, normal = 1, unknown = 2, control = 3, user_defined = 4, unused = 5,
                             byte = 6 };

struct SentencePieceVocab {
  std::vector<std::string> pieces;  ///< with spaces as ' ' (GGUF's U+2581 replaced)
  std::vector<float> scores;
  std::vector<TokenType> types;     ///< byte tokens (<0xXX>) typed `byte`
  int bos = 1, eos = 2, unk = 0;
  bool add_bos = true;
  bool add_space_prefix = true;
  /// Control and user-defined tokens written in a text are recognised as themselves (GGUF; llama2.c does not).
  bool literal_specials = false;
};

struct ByteLevelBpeVocab {
  std::vector<std::string> tokens;  ///< in GPT-2's byte-to-unicode alphabet
  std::vector<TokenType> types;
  std::vector<std::string> merges;  ///< "left right", by rank
  PreTokenizer pre = PreTokenizer::gpt2;
  int bos = -1, eos = -1;
  bool add_bos = false;
};

std::unique_ptr<Tokenizer> make_sentencepiece_tokenizer(SentencePieceVocab vocab);
std::unique_ptr<Tokenizer> make_byte_level_bpe_tokenizer(ByteLevelBpeVocab vocab);

}  // namespace kvq

// What every tokenizer must do with any text, loaded from any vocabulary: the ids of an encoding lie in the
// vocabulary, and each of them decodes after the one before it.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "fuzz_check.hpp"
#include "kvq/model.hpp"

namespace kvq::fuzz {

/// A text with what tokenizers treat specially: a leading space, runs of spaces, tabs and newlines, digits,
/// multi-byte characters, control tokens written out, an invalid UTF-8 byte.
inline constexpr std::string_view kSampleText =
    " Once upon a time,  <s>na\xC3\xAFve caf\xC3\xA9\t\t\xE6\x97\xA5\xE6\x9C\xAC 123\n\n<|im_start|>"
    "\xF0\x9F\x99\x82\xFF</s>";

/// encode(text), checked: every id in [0, vocab_size), the whole sequence decodable; returns the decoded text.
inline std::string encode_decode(const Tokenizer& tok, std::string_view text) {
  const std::vector<int> ids = tok.encode(text);
  for (int id : ids) KVQ_FUZZ_CHECK(id >= 0 && id < tok.vocab_size(), "encode gives ids inside the vocabulary");
  return tok.decode(ids);
}

/// The checks of a freshly loaded tokenizer: its special ids lie in the vocabulary (or are -1, none), every piece
/// can be read, and the sample text encodes and decodes.
inline void check_loaded(const Tokenizer& tok) {
  KVQ_FUZZ_CHECK(tok.vocab_size() > 0, "a loaded vocabulary is not empty");
  for (int id : {tok.bos(), tok.eos()})
    KVQ_FUZZ_CHECK(id >= -1 && id < tok.vocab_size(), "BOS and EOS lie in the vocabulary");
  for (int id = 0; id < tok.vocab_size(); ++id) (void)tok.piece(id);
  (void)encode_decode(tok, kSampleText);
}

}  // namespace kvq::fuzz

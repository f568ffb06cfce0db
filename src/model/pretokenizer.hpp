// Pre-tokenizers of byte-level BPE: the split of text into pieces that merges never cross, hand-written after
// the regexes that llama.cpp and Hugging Face tokenizers use.
#pragma once

#include <string_view>
#include <vector>

namespace kvq {

enum class PreTokenizer {
  /// GPT-2: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
  gpt2,
  /// Every \p{N} code point alone, then GPT-2 on the rest (tokenizer.ggml.pre "smollm", "starcoder", ...).
  digits_then_gpt2,
};

/// The pre-tokenizer for a tokenizer.ggml.pre value (kvq::Error naming the supported ones otherwise).
PreTokenizer pre_tokenizer_from_name(std::string_view name);

/// Splits text into consecutive non-empty pieces that together are the whole text. Bytes that are not valid
/// UTF-8 count as characters of no class (like punctuation).
std::vector<std::string_view> pre_tokenize(PreTokenizer pre, std::string_view text);

}  // namespace kvq

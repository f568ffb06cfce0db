// The little Unicode that tokenizers need: UTF-8 decoding that never fails, and the character classes of the
// pre-tokenizer regexes (\p{L}, \p{N}, \s).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string>
#include <string_view>

namespace kvq::unicode {

struct CodepointRange {
  char32_t first, last;  // inclusive
};
extern const std::span<const CodepointRange> letter_ranges;  // general category L*
extern const std::span<const CodepointRange> number_ranges;  // general category N*

/// The code point starting at text[pos] and its length in bytes. A byte that does not start a valid UTF-8
/// sequence (stray continuation, overlong form, surrogate, truncated sequence) decodes as itself, length 1,
/// with code point kInvalid.
struct Decoded {
  char32_t cp;
  size_t len;
};
constexpr char32_t kInvalid = 0xFFFFFFFF;
Decoded decode_utf8(std::string_view text, size_t pos);

/// Appends the UTF-8 encoding of cp (a valid scalar value).
void append_utf8(std::string& out, char32_t cp);

bool is_letter(char32_t cp);
bool is_number(char32_t cp);
/// Unicode White_Space (what \s matches in the tokenizers' regex engines).
bool is_whitespace(char32_t cp);

}  // namespace kvq::unicode

#include "model/pretokenizer.hpp"

#include <array>

#include "kvq/error.hpp"
#include "model/unicode.hpp"

namespace kvq {
namespace {

enum class CharClass { letter, number, space, other };

struct Char {
  char32_t cp;
  size_t begin, end;  // bytes
  CharClass cls;
};

std::vector<Char> decode_chars(std::string_view text) {
  std::vector<Char> chars;
  for (size_t pos = 0; pos < text.size();) {
    const auto [cp, len] = unicode::decode_utf8(text, pos);
    const CharClass cls = unicode::is_letter(cp)       ? CharClass::letter
                          : unicode::is_number(cp)     ? CharClass::number
                          : unicode::is_whitespace(cp) ? CharClass::space
                                                       : CharClass::other;
    chars.push_back({cp, pos, pos + len, cls});
    pos += len;
  }
  return chars;
}

// The length (in characters) of the GPT-2 regex match at chars[i], within the fragment chars[.. end).
size_t gpt2_match(const std::vector<Char>& c, size_t i, size_t end) {
  const auto cp_at = [&](size_t k) { return k < end ? c[k].cp : char32_t{0}; };
  // 's|'t|'re|'ve|'m|'ll|'d
  if (c[i].cp == U'\'') {
    const char32_t a = cp_at(i + 1), b = cp_at(i + 2);
    if (a == U's' || a == U't' || a == U'm' || a == U'd') return 2;
    if ((a == U'r' && b == U'e') || (a == U'v' && b == U'e') || (a == U'l' && b == U'l')) return 3;
  }
  // ' ?\p{L}+', ' ?\p{N}+', ' ?[^\s\p{L}\p{N}]+': an optional space, then a run of one class
  const size_t start = (c[i].cp == U' ' && i + 1 < end && c[i + 1].cls != CharClass::space) ? i + 1 : i;
  if (c[start].cls != CharClass::space) {
    size_t k = start;
    while (k < end && c[k].cls == c[start].cls) ++k;
    return k - i;
  }
  // \s+(?!\S): a whitespace run, leaving its last character to the word that follows; else \s+
  size_t k = i;
  while (k < end && c[k].cls == CharClass::space) ++k;
  if (k < end && k - i > 1) return k - i - 1;
  return k - i;
}

void split_gpt2(std::string_view text, const std::vector<Char>& c, size_t begin, size_t end,
                std::vector<std::string_view>& out) {
  for (size_t i = begin; i < end;) {
    const size_t n = gpt2_match(c, i, end);
    out.push_back(text.substr(c[i].begin, c[i + n - 1].end - c[i].begin));
    i += n;
  }
}

}  // namespace

PreTokenizer pre_tokenizer_from_name(std::string_view name) {
  if (name == "gpt2" || name == "gpt-2") return PreTokenizer::gpt2;
  constexpr std::array digit_splitters = {"smollm", "starcoder", "refact", "command-r", "codeshell", "exaone",
                                          "minerva-7b"};
  for (std::string_view n : digit_splitters)
    if (name == n) return PreTokenizer::digits_then_gpt2;
  throw Error(detail::concat("unsupported byte-level BPE pre-tokenizer \"", name,
                             "\" (kvq supports gpt2, smollm, starcoder, refact, command-r, codeshell, exaone, "
                             "minerva-7b)"));
}

std::vector<std::string_view> pre_tokenize(PreTokenizer pre, std::string_view text) {
  const std::vector<Char> c = decode_chars(text);
  std::vector<std::string_view> out;
  if (pre == PreTokenizer::gpt2) {
    split_gpt2(text, c, 0, c.size(), out);
    return out;
  }
  size_t begin = 0;  // start of the current fragment without numbers
  for (size_t i = 0; i < c.size(); ++i) {
    if (c[i].cls != CharClass::number) continue;
    split_gpt2(text, c, begin, i, out);
    out.push_back(text.substr(c[i].begin, c[i].end - c[i].begin));
    begin = i + 1;
  }
  split_gpt2(text, c, begin, c.size(), out);
  return out;
}

}  // namespace kvq

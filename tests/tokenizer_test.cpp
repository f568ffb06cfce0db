// Tokenizers: llama2.c's SentencePiece BPE against a literal transcription of llama2.c's encoder, SmolLM2's
// byte-level BPE against ids from the Hugging Face `tokenizers` package (tests/reference/smollm2_reference.py),
// the GPT-2 pre-tokenizer split, GGUF tokenizer metadata, and the UTF-8 decoder.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>

#include "gguf_writer.hpp"
#include "kvq/detail/gguf.hpp"
#include "kvq/detail/random.hpp"
#include "kvq/error.hpp"
#include "kvq/model.hpp"
#include "model/pretokenizer.hpp"
#include "model/unicode.hpp"
#include "temp_file.hpp"
#include "test_data.hpp"
#include "test_seed.hpp"

namespace kvq {
namespace {

using test::shared_data;

// llama2.c's encode(), transcribed: the dummy prefix " ", one token per UTF-8 code point (bytes + 3 when the
// code point is not in the vocabulary), then repeatedly merge the adjacent pair whose concatenation scores best
// (the first such pair on ties) until none is in the vocabulary.
class Llama2cReference {
 public:
  explicit Llama2cReference(const std::filesystem::path& path) {
    std::ifstream f(path, std::ios::binary);
    int32_t max_len;
    f.read(reinterpret_cast<char*>(&max_len), 4);
    float score;
    int32_t len;
    while (f.read(reinterpret_cast<char*>(&score), 4) && f.read(reinterpret_cast<char*>(&len), 4)) {
      std::string s(static_cast<size_t>(len), '\0');
      f.read(s.data(), len);
      lookup_.emplace(s, static_cast<int>(vocab_.size()));  // first occurrence
      vocab_.push_back(s);
      scores_.push_back(score);
    }
  }

  std::vector<int> encode(const std::string& text) const {
    std::vector<int> tokens;
    if (!text.empty()) tokens.push_back(id(" "));
    for (size_t i = 0; i < text.size();) {
      size_t n = 1;
      while (i + n < text.size() && (static_cast<uint8_t>(text[i + n]) & 0xC0) == 0x80 && n < 4) ++n;
      const int t = id(text.substr(i, n));
      if (t >= 0) {
        tokens.push_back(t);
      } else {
        for (size_t k = 0; k < n; ++k) tokens.push_back(static_cast<uint8_t>(text[i + k]) + 3);
      }
      i += n;
    }
    for (;;) {
      float best = -1e10f;
      int best_id = -1, best_at = -1;
      for (size_t i = 0; i + 1 < tokens.size(); ++i) {
        const int t = id(vocab_[tokens[i]] + vocab_[tokens[i + 1]]);
        if (t >= 0 && scores_[t] > best) best = scores_[t], best_id = t, best_at = static_cast<int>(i);
      }
      if (best_at < 0) return tokens;
      tokens[best_at] = best_id;
      tokens.erase(tokens.begin() + best_at + 1);
    }
  }

  const std::vector<std::string>& vocab() const { return vocab_; }

 private:
  int id(const std::string& s) const {
    const auto it = lookup_.find(s);
    return it == lookup_.end() ? -1 : it->second;
  }
  std::vector<std::string> vocab_;
  std::vector<float> scores_;
  std::map<std::string, int> lookup_;
};

std::string read_text(const std::filesystem::path& p) {
  std::ifstream f(p);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

class TokenizerLlama2c : public testing::Test {
 protected:
  void SetUp() override { KVQ_REQUIRE_FILE(shared_data("models/tok512.bin"), "the shared data folder"); }
};

TEST_F(TokenizerLlama2c, MatchesLlama2cEncoder) {
  KVQ_FRESH_SEED();
  Rng rng(seed);
  const auto tok = load_llama2c_tokenizer(shared_data("models/tok512.bin"));
  const Llama2cReference ref(shared_data("models/tok512.bin"));
  EXPECT_EQ(tok->vocab_size(), 512);
  EXPECT_EQ(tok->bos(), 1);
  EXPECT_EQ(tok->eos(), 2);
  std::vector<std::string> texts = {"Once upon a time", "", " ", "a", "  two  spaces ", "Hello, World! 123",
                                    "naïve café – “quotes” 日本語 🙂", "\n\nnew\nlines\n"};
  const std::string story = read_text(shared_data("text/tinystories_val.txt"));
  for (int i = 0; i < 5; ++i) texts.push_back(story.substr(rng.next_u64() % (story.size() - 300), 300));
  // Random strings over vocabulary pieces, ASCII and multi-byte characters.
  const std::vector<std::string> extra = {"é", "ß", "€", "😀", "\t", "'", "-"};
  for (int i = 0; i < 20; ++i) {
    std::string s;
    for (int k = 0; k < 30; ++k) {
      const uint64_t r = rng.next_u64();
      s += r % 3 == 0 ? extra[r / 3 % extra.size()] : ref.vocab()[259 + r / 3 % 253];  // normal pieces
    }
    texts.push_back(s);
  }
  for (const auto& t : texts) {
    const std::vector<int> ids = tok->encode(t);
    EXPECT_EQ(ids, ref.encode(t)) << "text: \"" << t << "\"";
    EXPECT_EQ(tok->decode(ids), t);
  }
}

TEST_F(TokenizerLlama2c, DecodingFollowsLlama2c) {
  const auto tok = load_llama2c_tokenizer(shared_data("models/tok512.bin"));
  const std::vector<int> ids = tok->encode("Once");
  ASSERT_FALSE(ids.empty());
  EXPECT_EQ(tok->piece(ids[0])[0], ' ');                    // pieces keep the leading space
  EXPECT_EQ(tok->decode(tok->bos(), ids[0])[0], 'O');        // dropped after BOS
  EXPECT_EQ(tok->decode(ids[0], ids[0])[0], ' ');            // kept elsewhere
  EXPECT_EQ(tok->decode(-1, 3 + 0xE2), "\xE2");              // <0xE2>: the raw byte
  EXPECT_EQ(tok->decode(-1, tok->bos()), "");
  EXPECT_THROW(tok->decode(-1, 512), Error);
}

TEST(TokenizerFiles, Llama2cTokenizerCorruptionIsAnError) {
  test::TempFile file("tok_bad.bin");
  std::vector<uint8_t> b(4 + 8 + 3);
  const int32_t max_len = 5, len = 100;
  std::memcpy(b.data(), &max_len, 4);
  std::memcpy(b.data() + 8, &len, 4);
  try {
    load_llama2c_tokenizer(file.write(b));
    FAIL() << "expected kvq::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("token 0 has length 100"), std::string::npos) << e.what();
  }
  EXPECT_THROW(load_llama2c_tokenizer(file.write({1, 2})), Error);
}

// --- byte-level BPE (SmolLM2) ------------------------------------------------------------------------------

struct HfCase {
  std::string text;
  std::vector<int> ids;
};

// Ids from the `tokenizers` package (tests/reference/smollm2_reference.py).
const std::vector<HfCase> kHuggingFaceCases = {
    {"Hello world",
     {19556, 905}},
    {"  leading spaces and trailing   ",
     {216, 2899, 5600, 284, 35079, 333}},
    {"Numbers: 3.14159, 2024-06-01 and 1,000,000!",
     {39006, 42, 216, 35, 30, 33, 36, 33, 37, 41, 28, 216, 34, 32, 34, 36, 29, 32, 38, 29, 32, 33, 284, 216, 33, 28, 32, 32, 32, 28, 32, 32, 32, 17}},
    {"It's we're they've I'm you'll he'd",
     {1589, 506, 392, 2316, 502, 3543, 339, 5248, 346, 3060, 384, 6737}},
    {"Punctuation... (brackets) [x] {y} <z> \"quotes\" 'single' @#$%^&*",
     {64, 8859, 6584, 2026, 365, 6838, 936, 1175, 25, 933, 104, 77, 1662, 105, 109, 2067, 106, 46, 476, 385, 2346, 18, 637, 18536, 23, 3394, 19, 20, 21, 78, 22, 26}},
    {"Tabs\tand\nnewlines\n\nand\r\nCRLF",
     {68, 7366, 197, 397, 198, 2241, 5110, 198, 198, 397, 201, 198, 9088, 60, 54}},
    {"Ünïcödé: naïve café, Straße, Ελληνικά, русский, 日本語のテキスト, 한국어",
     {142, 246, 94, 25972, 83, 7466, 84, 2756, 42, 15486, 46494, 37366, 28, 19144, 34878, 85, 28, 5664, 239, 17162, 17162, 25723, 11517, 12001, 21118, 26112, 28, 216, 9175, 14714, 9382, 39511, 7872, 24958, 28, 17097, 241, 115, 40993, 179, 120, 248, 26453, 11100, 224, 10391, 251, 10391, 134, 11100, 226, 28, 216, 33085, 246, 181, 130, 251, 183, 240, 129}},
    {"Emoji 🙂🚀 and flags 🇫🇷 and a family 👨‍👩‍👧",
     {10809, 33777, 47526, 10813, 244, 218, 284, 13198, 15107, 225, 121, 10813, 225, 132, 284, 253, 1564, 15107, 235, 118, 321, 231, 10813, 235, 119, 321, 231, 10813, 235, 117}},
    {"Arabic digits ٣٤٥ and fullwidth １２３",
     {44970, 18638, 216, 164, 113, 164, 114, 164, 115, 284, 2073, 6930, 216, 8083, 235, 8083, 236, 8083, 237}},
    {"<|im_start|>user\nHi there<|im_end|>",
     {1, 4093, 198, 26843, 665, 2}},
};

TEST(TokenizerSmolLM2, MatchesHuggingFaceTokenizers) {
  KVQ_REQUIRE_FILE(test::smollm2_path(), "run scripts/fetch-models.sh");
  const GgufFile gguf(test::smollm2_path());
  const auto tok = load_gguf_tokenizer(gguf);
  EXPECT_EQ(tok->vocab_size(), 49152);
  EXPECT_EQ(tok->bos(), 1);
  EXPECT_EQ(tok->eos(), 2);
  EXPECT_FALSE(tok->add_bos());
  for (const auto& c : kHuggingFaceCases) {
    const std::vector<int> ids = tok->encode(c.text);
    EXPECT_EQ(ids, c.ids) << "text: \"" << c.text << "\"";
    if (c.text.find("<|") == std::string::npos) {
      EXPECT_EQ(tok->decode(ids), c.text);
    } else {
      EXPECT_EQ(tok->decode(ids), "user\nHi there");  // control tokens have no text
    }
  }
}

TEST(TokenizerPreTokenizer, Gpt2RegexSplits) {
  using V = std::vector<std::string_view>;
  const auto gpt2 = [](std::string_view t) { return pre_tokenize(PreTokenizer::gpt2, t); };
  EXPECT_EQ(gpt2("Hello world"), (V{"Hello", " world"}));
  EXPECT_EQ(gpt2("Hello  world"), (V{"Hello", " ", " world"}));  // \s+(?!\S) leaves the last space
  EXPECT_EQ(gpt2("a\n\nb"), (V{"a", "\n", "\n", "b"}));
  EXPECT_EQ(gpt2("end   "), (V{"end", "   "}));
  EXPECT_EQ(gpt2("it's I'M we'll"), (V{"it", "'s", " I", "'", "M", " we", "'ll"}));  // case-sensitive
  EXPECT_EQ(gpt2("x=42.5!"), (V{"x", "=", "42", ".", "5", "!"}));
  EXPECT_EQ(gpt2(" (ok)"), (V{" (", "ok", ")"}));
  EXPECT_EQ(gpt2("über straße"), (V{"über", " straße"}));
  EXPECT_EQ(gpt2("a 🙂🙂 b"), (V{"a", " 🙂🙂", " b"}));
  EXPECT_EQ(gpt2("\xFF\xFEz"), (V{"\xFF\xFE", "z"}));  // invalid UTF-8: characters of no class
  EXPECT_EQ(pre_tokenize(PreTokenizer::digits_then_gpt2, "ab 123x"), (V{"ab", " ", "1", "2", "3", "x"}));
  EXPECT_EQ(pre_tokenize(PreTokenizer::digits_then_gpt2, "٣٤"), (V{"٣", "٤"}));
  EXPECT_TRUE(gpt2("").empty());
  EXPECT_THROW(pre_tokenizer_from_name("llama3"), Error);
}

// --- GGUF tokenizer metadata -------------------------------------------------------------------------------

TEST(TokenizerGguf, SentencePieceFromMetadata) {
  test::GgufWriter w;
  w.kv_string("tokenizer.ggml.model", "llama");
  // U+2581 stands for a space in GGUF SentencePiece vocabularies.
  const std::vector<std::string> tokens = {"<unk>", "<s>", "</s>", "<0x63>", "\u2581", "a", "b",
                                           "\u2581a", "ab", "\u2581ab"};
  w.kv_strings("tokenizer.ggml.tokens", tokens);
  w.kv_array<float>("tokenizer.ggml.scores", GgufType::f32, {0, 0, 0, 0, -1, -2, -2, -3, -1, -0.5f});
  w.kv_array<int32_t>("tokenizer.ggml.token_type", GgufType::i32, {2, 3, 3, 6, 1, 1, 1, 1, 1, 1});
  w.kv<uint32_t>("tokenizer.ggml.bos_token_id", GgufType::u32, 1);
  w.kv<uint32_t>("tokenizer.ggml.eos_token_id", GgufType::u32, 2);
  test::TempFile file("spm_tokenizer.gguf");
  const auto tok = load_gguf_tokenizer(GgufFile(file.write(w.bytes())));
  EXPECT_TRUE(tok->add_bos());
  // " ab ab c": "ab" (-1) merges before " a" (-3); then " ab" (-0.5); 'c' falls back to <0x63>; 'd' to <unk>.
  EXPECT_EQ(tok->encode("ab abc"), (std::vector<int>{9, 9, 3}));
  EXPECT_EQ(tok->encode("ba"), (std::vector<int>{4, 6, 5}));
  EXPECT_EQ(tok->encode("d"), (std::vector<int>{4, 0}));
  EXPECT_EQ(tok->decode(tok->encode("ab abc")), "ab abc");
}

TEST(TokenizerGguf, UnsupportedModelsAreNamed) {
  test::GgufWriter w;
  w.kv_string("tokenizer.ggml.model", "bert");
  w.kv_strings("tokenizer.ggml.tokens", {"a"});
  test::TempFile file("bad_tokenizer.gguf");
  try {
    load_gguf_tokenizer(GgufFile(file.write(w.bytes())));
    FAIL() << "expected kvq::Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unsupported tokenizer.ggml.model \"bert\""), std::string::npos) << e.what();
  }
}

TEST(TokenizerUnicode, Utf8DecoderAndClasses) {
  using unicode::decode_utf8;
  EXPECT_EQ(decode_utf8("\xC3\xA9", 0).cp, U'é');
  EXPECT_EQ(decode_utf8("\xF0\x9F\x99\x82", 0).len, 4u);
  EXPECT_EQ(decode_utf8("\xC0\x80", 0).cp, unicode::kInvalid);      // overlong
  EXPECT_EQ(decode_utf8("\xED\xA0\x80", 0).cp, unicode::kInvalid);  // surrogate
  EXPECT_EQ(decode_utf8("\xE2\x82", 0).cp, unicode::kInvalid);      // truncated
  EXPECT_EQ(decode_utf8("\x80", 0).len, 1u);                        // stray continuation
  EXPECT_TRUE(unicode::is_letter(U'ß') && unicode::is_letter(U'語') && unicode::is_letter(U'한'));
  EXPECT_FALSE(unicode::is_letter(U'1') || unicode::is_letter(U'🙂') || unicode::is_letter(U'_'));
  EXPECT_TRUE(unicode::is_number(U'٣') && unicode::is_number(U'Ⅻ') && unicode::is_number(U'½'));
  EXPECT_TRUE(unicode::is_whitespace(U'\u3000') && !unicode::is_whitespace(U'\u200B'));
  std::string s;
  unicode::append_utf8(s, U'🙂');
  EXPECT_EQ(s, "\xF0\x9F\x99\x82");
}

}  // namespace
}  // namespace kvq

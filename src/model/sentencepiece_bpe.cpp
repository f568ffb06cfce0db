// SentencePiece BPE: control and user-defined tokens written in the text are cut out first (the longest at the
// leftmost position, as Hugging Face's added tokens and llama.cpp do: Gemma's newlines, runs of spaces and tabs,
// HTML tags and <start_of_turn> are such tokens); in the rest, merge the adjacent pair whose concatenation is the
// highest-scoring vocabulary piece (the leftmost on ties), until no pair is in the vocabulary. A priority queue of
// candidate pairs makes this O(n log n); the result is that of llama2.c's repeated full scan.
#include <algorithm>
#include <array>
#include <bitset>
#include <charconv>
#include <queue>
#include <unordered_map>

#include "kvq/error.hpp"
#include "model/tokenizers.hpp"
#include "model/unicode.hpp"

namespace kvq {
namespace {

class SentencePieceBpe final : public Tokenizer {
 public:
  explicit SentencePieceBpe(SentencePieceVocab v) : v_(std::move(v)) {
    const size_t n = v_.pieces.size();
    KVQ_CHECK(n > 0 && v_.scores.size() == n && v_.types.size() == n, "SentencePiece vocabulary: ", n,
              " pieces, ", v_.scores.size(), " scores, ", v_.types.size(), " types");
    bos_ = v_.bos, eos_ = v_.eos, add_bos_ = v_.add_bos;
    for (int id = 0; id < static_cast<int>(n); ++id) {
      const std::string& p = v_.pieces[id];
      if (v_.types[id] == TokenType::byte) {
        KVQ_CHECK(p.size() == 6 && p.starts_with("<0x") && p.ends_with(">"), "byte token ", id, " is \"", p, "\"");
        unsigned value = 0;
        std::from_chars(p.data() + 3, p.data() + 5, value, 16);
        byte_token_[value] = id;
      } else if (v_.types[id] == TokenType::normal || v_.types[id] == TokenType::user_defined) {
        piece_id_.emplace(p, id);  // the first of duplicate pieces wins
      }
      if (v_.literal_specials && !p.empty() &&
          (v_.types[id] == TokenType::control || v_.types[id] == TokenType::user_defined) &&
          literal_id_.emplace(p, id).second) {
        literal_first_byte_.set(static_cast<uint8_t>(p[0]));
        literal_lengths_.push_back(p.size());
      }
    }
    std::sort(literal_lengths_.begin(), literal_lengths_.end(), std::greater<>());
    literal_lengths_.erase(std::unique(literal_lengths_.begin(), literal_lengths_.end()), literal_lengths_.end());
  }

  std::vector<int> encode(std::string_view text) const override {
    std::vector<int> ids;
    size_t done = 0;  // text before it is encoded
    for (size_t pos = 0; pos < text.size(); ++pos) {
      const int literal = literal_at(text, pos);
      if (literal < 0) continue;
      encode_fragment(text.substr(done, pos - done), done == 0, ids);
      ids.push_back(literal);
      done = pos + v_.pieces[literal].size();
      pos = done - 1;
    }
    encode_fragment(text.substr(done), done == 0, ids);
    return ids;
  }

  std::string decode(int prev, int token) const override {
    check(token);
    switch (v_.types[token]) {
      case TokenType::byte: return std::string(1, static_cast<char>(byte_value(token)));
      case TokenType::normal: case TokenType::user_defined: break;
      default: return {};  // control, unknown, unused: no text
    }
    std::string_view p = v_.pieces[token];
    // The space that encode added in front of the text is not part of it.
    if (v_.add_space_prefix && (prev < 0 || prev == bos_) && p.starts_with(' ')) p.remove_prefix(1);
    return std::string(p);
  }

  int vocab_size() const override { return static_cast<int>(v_.pieces.size()); }
  std::string_view piece(int token) const override {
    check(token);
    return v_.pieces[token];
  }

 private:
  // The control or user-defined token written at text[pos], the longest if several; -1 if none.
  int literal_at(std::string_view text, size_t pos) const {
    if (!literal_first_byte_.test(static_cast<uint8_t>(text[pos]))) return -1;
    for (size_t len : literal_lengths_) {
      if (len > text.size() - pos) continue;
      const auto it = literal_id_.find(text.substr(pos, len));
      if (it != literal_id_.end()) return it->second;
    }
    return -1;
  }

  // Appends the tokens of a piece of text without control or user-defined tokens; the space prefix goes only in
  // front of the text's beginning.
  void encode_fragment(std::string_view text, bool at_start, std::vector<int>& ids) const {
    if (text.empty()) return;
    std::string s;
    if (v_.add_space_prefix && at_start) s = " ";
    s += text;
    // One symbol per UTF-8 character; characters outside the vocabulary become byte tokens, which never merge.
    struct Symbol {
      size_t begin, len;
      int prev, next;
      int byte_fallback;  // 0: a text symbol
    };
    std::vector<Symbol> sym;
    for (size_t pos = 0; pos < s.size();) {
      const size_t len = unicode::decode_utf8(s, pos).len;
      const bool known = piece_id_.contains(std::string_view(s).substr(pos, len));
      const int i = static_cast<int>(sym.size());
      sym.push_back({pos, len, i - 1, i + 1, known ? 0 : 1});
      pos += len;
    }
    if (!sym.empty()) sym.back().next = -1;

    struct Candidate {
      float score;
      int left, right;
      size_t len;  // of the merged text: a stale candidate's symbols have changed length
      bool operator<(const Candidate& o) const {  // max-heap: highest score, then leftmost
        return score != o.score ? score < o.score : left > o.left;
      }
    };
    std::priority_queue<Candidate> queue;
    const auto consider = [&](int left, int right) {
      if (left < 0 || right < 0 || sym[left].byte_fallback || sym[right].byte_fallback) return;
      const auto it = piece_id_.find(std::string_view(s).substr(sym[left].begin, sym[left].len + sym[right].len));
      if (it != piece_id_.end())
        queue.push({v_.scores[it->second], left, right, sym[left].len + sym[right].len});
    };
    for (int i = 0; i + 1 < static_cast<int>(sym.size()); ++i) consider(i, i + 1);
    while (!queue.empty()) {
      const Candidate c = queue.top();
      queue.pop();
      Symbol &l = sym[c.left], &r = sym[c.right];
      if (l.len == 0 || r.len == 0 || l.next != c.right || l.len + r.len != c.len) continue;  // stale
      l.len += r.len;
      r.len = 0;
      l.next = r.next;
      if (r.next >= 0) sym[r.next].prev = c.left;
      consider(l.prev, c.left);
      consider(c.left, l.next);
    }

    for (int i = sym.empty() ? -1 : 0; i >= 0; i = sym[i].next) {
      const std::string_view piece = std::string_view(s).substr(sym[i].begin, sym[i].len);
      if (!sym[i].byte_fallback) {
        ids.push_back(piece_id_.at(piece));
        continue;
      }
      for (char ch : piece) {
        const int id = byte_token_[static_cast<uint8_t>(ch)];
        ids.push_back(id >= 0 ? id : v_.unk);
      }
    }
  }

  void check(int token) const {
    KVQ_CHECK(token >= 0 && token < vocab_size(), "token id ", token, " is outside the vocabulary of ",
              vocab_size());
  }
  unsigned byte_value(int token) const {
    unsigned value = 0;
    std::from_chars(v_.pieces[token].data() + 3, v_.pieces[token].data() + 5, value, 16);
    return value;
  }

  SentencePieceVocab v_;
  std::unordered_map<std::string_view, int> piece_id_;  // views into v_.pieces
  // Control and user-defined tokens as written in a text: by text, their first bytes, their lengths (longest first).
  std::unordered_map<std::string_view, int> literal_id_;
  std::bitset<256> literal_first_byte_;
  std::vector<size_t> literal_lengths_;
  std::array<int, 256> byte_token_ = make_no_bytes();
  static std::array<int, 256> make_no_bytes() {
    std::array<int, 256> a;
    a.fill(-1);
    return a;
  }
};

}  // namespace

std::unique_ptr<Tokenizer> make_sentencepiece_tokenizer(SentencePieceVocab vocab) {
  return std::make_unique<SentencePieceBpe>(std::move(vocab));
}

}  // namespace kvq

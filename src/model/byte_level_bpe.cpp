// Byte-level BPE (GPT-2 family): control tokens are cut out of the text first, the rest is pre-tokenized, each
// piece's bytes are written in GPT-2's printable alphabet and merged pairwise by lowest merge rank (leftmost on
// ties), the way Hugging Face tokenizers and llama.cpp do.
#include <array>
#include <queue>
#include <unordered_map>

#include "kvq/error.hpp"
#include "model/tokenizers.hpp"
#include "model/unicode.hpp"

namespace kvq {
namespace {

// GPT-2's byte-to-unicode map: printable Latin-1 bytes ('!'..'~', '¡'..'¬', '®'..'ÿ') stand for themselves, the
// other 68 bytes are mapped in order to U+0100, U+0101, ...
std::array<char32_t, 256> make_byte_to_unicode() {
  std::array<char32_t, 256> map{};
  char32_t next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    map[b] = printable ? static_cast<char32_t>(b) : next++;
  }
  return map;
}

class ByteLevelBpe final : public Tokenizer {
 public:
  explicit ByteLevelBpe(ByteLevelBpeVocab v) : v_(std::move(v)) {
    const size_t n = v_.tokens.size();
    KVQ_CHECK(n > 0 && v_.types.size() == n, "byte-level BPE vocabulary: ", n, " tokens, ", v_.types.size(),
              " types");
    bos_ = v_.bos, eos_ = v_.eos, add_bos_ = v_.add_bos;
    const auto byte_to_unicode = make_byte_to_unicode();
    for (int b = 0; b < 256; ++b) {
      unicode::append_utf8(byte_char_[b], byte_to_unicode[b]);
      unicode_to_byte_.emplace(byte_to_unicode[b], static_cast<uint8_t>(b));
    }
    for (int id = 0; id < static_cast<int>(n); ++id) {
      token_id_.emplace(v_.tokens[id], id);
      if (v_.types[id] == TokenType::control || v_.types[id] == TokenType::user_defined)
        specials_.push_back(id);
    }
    for (int rank = 0; rank < static_cast<int>(v_.merges.size()); ++rank) {
      KVQ_CHECK(v_.merges[rank].find(' ') != std::string::npos, "merge ", rank, " \"", v_.merges[rank],
                "\" has no space between its two parts");
      merge_rank_.emplace(v_.merges[rank], rank);
    }
  }

  std::vector<int> encode(std::string_view text) const override {
    std::vector<int> ids;
    std::unordered_map<std::string_view, std::vector<int>> cache;  // pieces repeat a lot in running text
    size_t done = 0;
    while (done < text.size()) {
      const auto [at, special] = next_special(text, done);
      for (std::string_view piece : pre_tokenize(v_.pre, text.substr(done, at - done))) {
        auto it = cache.find(piece);
        if (it == cache.end()) it = cache.emplace(piece, merge_piece(piece)).first;
        ids.insert(ids.end(), it->second.begin(), it->second.end());
      }
      if (special < 0) break;
      ids.push_back(special);
      done = at + v_.tokens[special].size();
    }
    return ids;
  }

  std::string decode(int, int token) const override {
    check(token);
    const std::string& t = v_.tokens[token];
    if (v_.types[token] == TokenType::control) return {};
    if (v_.types[token] == TokenType::user_defined) return t;
    std::string out;
    for (size_t pos = 0; pos < t.size();) {
      const auto [cp, len] = unicode::decode_utf8(t, pos);
      const auto it = unicode_to_byte_.find(cp);
      if (it != unicode_to_byte_.end())
        out += static_cast<char>(it->second);
      else
        out.append(t, pos, len);  // not in the byte alphabet: kept as written
      pos += len;
    }
    return out;
  }

  int vocab_size() const override { return static_cast<int>(v_.tokens.size()); }
  std::string_view piece(int token) const override {
    check(token);
    return v_.tokens[token];
  }

 private:
  void check(int token) const {
    KVQ_CHECK(token >= 0 && token < vocab_size(), "token id ", token, " is outside the vocabulary of ",
              vocab_size());
  }

  // The first special token in text at or after `from` (the longest one where several start at the same byte):
  // its byte position and id, or {text.size(), -1}.
  std::pair<size_t, int> next_special(std::string_view text, size_t from) const {
    size_t best_at = text.size();
    int best = -1;
    for (int id : specials_) {
      const std::string& t = v_.tokens[id];
      if (t.empty()) continue;
      const size_t at = text.find(t, from);
      if (at == std::string_view::npos) continue;
      if (at < best_at || (at == best_at && t.size() > v_.tokens[best].size())) best_at = at, best = id;
    }
    return {best_at, best};
  }

  std::vector<int> merge_piece(std::string_view piece) const {
    std::vector<std::string> parts;  // in the byte alphabet, one per byte to begin with
    parts.reserve(piece.size());
    for (char ch : piece) parts.push_back(byte_char_[static_cast<uint8_t>(ch)]);
    std::vector<int> next(parts.size()), prev(parts.size());
    for (size_t i = 0; i < parts.size(); ++i) {
      next[i] = i + 1 < parts.size() ? static_cast<int>(i + 1) : -1;
      prev[i] = static_cast<int>(i) - 1;
    }
    struct Candidate {
      int rank, left, right;
      size_t len;  // of the merged text: a stale candidate's parts have changed
      bool operator<(const Candidate& o) const {  // max-heap on priority: lowest rank, then leftmost
        return rank != o.rank ? rank > o.rank : left > o.left;
      }
    };
    std::priority_queue<Candidate> queue;
    std::string key;
    const auto consider = [&](int left, int right) {
      if (left < 0 || right < 0) return;
      key.assign(parts[left]).append(" ").append(parts[right]);
      const auto it = merge_rank_.find(key);
      if (it != merge_rank_.end()) queue.push({it->second, left, right, parts[left].size() + parts[right].size()});
    };
    for (int i = 0; i + 1 < static_cast<int>(parts.size()); ++i) consider(i, i + 1);
    while (!queue.empty()) {
      const Candidate c = queue.top();
      queue.pop();
      if (parts[c.left].empty() || parts[c.right].empty() || next[c.left] != c.right ||
          parts[c.left].size() + parts[c.right].size() != c.len)
        continue;  // stale
      parts[c.left] += parts[c.right];
      parts[c.right].clear();
      next[c.left] = next[c.right];
      if (next[c.right] >= 0) prev[next[c.right]] = c.left;
      consider(prev[c.left], c.left);
      consider(c.left, next[c.left]);
    }
    std::vector<int> ids;
    for (int i = parts.empty() ? -1 : 0; i >= 0; i = next[i]) {
      const auto it = token_id_.find(parts[i]);
      KVQ_CHECK(it != token_id_.end(), "byte-level BPE: merged piece \"", parts[i], "\" is not in the vocabulary");
      ids.push_back(it->second);
    }
    return ids;
  }

  ByteLevelBpeVocab v_;
  std::array<std::string, 256> byte_char_;  // UTF-8 of each byte's stand-in character
  std::unordered_map<char32_t, uint8_t> unicode_to_byte_;
  std::unordered_map<std::string_view, int> token_id_;  // views into v_.tokens
  std::unordered_map<std::string, int> merge_rank_;
  std::vector<int> specials_;  // control and user-defined tokens, matched literally in text
};

}  // namespace

std::unique_ptr<Tokenizer> make_byte_level_bpe_tokenizer(ByteLevelBpeVocab vocab) {
  return std::make_unique<ByteLevelBpe>(std::move(vocab));
}

}  // namespace kvq

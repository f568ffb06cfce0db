// Structure-aware: the input decodes into a small cache configuration and a script of operations on a
// kvq::KVCache of one layer, checked as the tests check them.
//   config: codec pair (from kPairs; G in a spec stands for the group size, 16, 32 or 64), kv heads 1..4, query
//           heads per kv head 1..4, head_dim 64 or 128, block tokens 64 or 128, residual tokens 0 or T, pool of
//           2 or 16 pages, centered keys, calibration, seed
//   script: up to kMaxOps operations: add a sequence; remove one; append 1..256/H tokens (at most 256 rows of
//           tokens x kv heads) of Gaussian or key-like data scaled by 2^-6..2^3, with sometimes a NaN or an infinity
//           at a chosen element (up to kMaxTokens per sequence); decode attention over every sequence (split-K slices 0..3, sometimes a sliding window), at
//           most kMaxAttentions times with the one that always ends the script.
// Properties: an append that throws kvq::Error leaves the cache exactly as it was (block tables, page bytes,
// windows, key offsets, free pages); one with a non-finite element always throws; one that succeeds adds its
// tokens. Decode attention matches the double-precision reference over the decoded cache within the bound of
// tests/attention_test_util.hpp (vs_reference): per output row, the error's norm is at most
// (1e-5 + sqrt(d) 2^-24 max_t scale sum_j |q_j k_tj|) sum_t p_t |v_t|; a row that sees no token is exactly zero.
// The exact kernels run (KVQ_ATTENTION=exact). What repeats from input to input is done once per process: drawing the
// tokens (draw), training the codecs (trained), reading a sequence's state for the reference (read_sequence) and the
// reference's answer for a query over such a state (expected).
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <limits>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <tuple>
#include <vector>

#include "byte_reader.hpp"
#include "cache/cache_builder.hpp"
#include "cache_test_util.hpp"
#include "fuzz_check.hpp"
#include "kvq/attention.hpp"
#include "kvq/cache.hpp"
#include "kvq/detail/synthetic.hpp"
#include "kvq/error.hpp"

namespace {

using kvq::KVCache;
using kvq::SeqId;

struct Pair {
  const char* key;
  const char* value;
};
constexpr std::array kPairs{
    Pair{"f32", "f32"},          Pair{"f16", "f16"},           Pair{"bf16", "f16"},
    Pair{"int8:G", "int8:G"},    Pair{"int4:G", "int4:G"},     Pair{"int4:G", "f16"},
    Pair{"kivi:2", "kivi:4,g=G"}, Pair{"kivi:4", "kivi:2"},    Pair{"turbo_mse:3", "turbo_mse:2"},
    Pair{"turbo_mse:4", "f16"},  Pair{"turbo_prod:3", "turbo_mse:4"}, Pair{"turbo_prod:2", "turbo_prod:4"},
    Pair{"qjl:256", "f16"},      Pair{"qjl", "int4:G"},        Pair{"turbo_rvq:2", "turbo_rvq:1"},
    Pair{"vecinfer:8/4", "f16"}, Pair{"vecinfer:8/4,norm=1", "int8:G"},
};
// What bounds the time of one input: the reference decodes every sequence in full for each attention.
constexpr int kMaxOps = 24, kMaxSequences = 4, kMaxAttentions = 3;
constexpr size_t kMaxTokens = 320;  // per sequence: up to 5 pages of 64 tokens, or 2 of 128 and a window

std::string with_group(std::string_view spec, int group) {
  const size_t at = spec.find('G');
  if (at == std::string_view::npos) return std::string(spec);
  return std::string(spec.substr(0, at)) + std::to_string(group) + std::string(spec.substr(at + 1));
}

// The tokens and queries: Gaussian (key_like false) or key-like rows, a pure function of (d, the profile's seed, the
// sample's seed) and the row count, fewer rows being a prefix of more (one Rng stream). Each stream is drawn once per
// process, at the most rows asked of it so far, and copied from there: drawing them took a sixth of the target's
// time. The seeds are small (the script's draws, the config's seed), so the streams are few. Writes them times scale
// to x, whose allocation is kept from call to call (the callers' buffers are static, reserved at the most rows an
// input asks for: fresh ones of up to 512 KB cost page faults and ASan's poisoning at every append).
void draw(std::vector<float>& x, bool key_like, int d, uint64_t profile_seed, uint64_t seed, size_t rows,
          float scale = 1) {
  static std::map<std::tuple<bool, int, uint64_t, uint64_t>, std::vector<float>> streams;
  std::vector<float>& s = streams[{key_like, d, profile_seed, seed}];
  const size_t n = rows * static_cast<size_t>(d);
  if (s.size() < n) {
    const size_t more = std::max(rows, 2 * s.size() / static_cast<size_t>(d));
    s = key_like ? kvq::sample_profile(kvq::key_like_profile(d, profile_seed), more, seed)
                 : kvq::gaussian_vectors(more, d, seed);
  }
  x.resize(n);
  for (size_t i = 0; i < n; ++i) x[i] = s[i] * scale;
}

// A buffer reserved once per process for `floats` floats (draw's outputs).
std::vector<float>& buffer(int which, size_t floats) {
  static std::array<std::vector<float>, 3> buffers;
  std::vector<float>& b = buffers[static_cast<size_t>(which)];
  if (b.capacity() < floats) b.reserve(floats);
  return b;
}

// The codecs of configuration c as KVCache::train_layer leaves them after 64 key-like keys and Gaussian values drawn
// from the seed, where training learned a state (Codec::state(); else null); throws what training throws. Training
// is a pure function of the codecs' specs, d, T and seed and of centering, so each is trained once per process
// (vecinfer's k-means took a tenth of the target's time) and the inputs' caches take the state as a loaded cache
// does (CacheBuilder::load_codecs). At most kMaxTrained, each a few KB.
struct Taught {
  std::unique_ptr<kvq::Codec> key, value;
};
const Taught& trained(const kvq::CacheConfig& c) {
  constexpr size_t kMaxTrained = 4096;
  using Key = std::tuple<std::string, std::string, int, int, uint64_t, bool>;
  static std::map<Key, std::optional<Taught>> taught;  // nullopt: training threw
  const Key key{c.key_codec, c.value_codec, c.head_dim, c.block_tokens, c.seed, c.center_keys};
  auto it = taught.find(key);
  if (it == taught.end()) {
    if (taught.size() == kMaxTrained) taught.clear();
    it = taught.emplace(key, std::nullopt).first;
    kvq::CacheConfig one = c;
    one.n_kv_heads = 1;
    one.capacity_pages = 0;
    KVCache cache(one);
    constexpr size_t kTrain = 64;
    const auto keys = kvq::sample_profile(kvq::key_like_profile(c.head_dim, c.seed), kTrain, c.seed + 1);
    const auto values = kvq::gaussian_vectors(kTrain, c.head_dim, c.seed + 2);
    cache.train_layer(0, keys.data(), values.data(), kTrain);
    const auto learned = [&](const kvq::Codec& codec, kvq::Role role) -> std::unique_ptr<kvq::Codec> {
      const std::vector<uint8_t> state = codec.state();
      if (state.empty()) return nullptr;
      auto copy = kvq::make_codec(codec.spec().str(), kvq::CodecParams{c.head_dim, c.block_tokens, c.seed, role});
      copy->load_state(state);
      return copy;
    };
    it->second.emplace(
        Taught{learned(cache.key_codec(0), kvq::Role::key), learned(cache.value_codec(0), kvq::Role::value)});
  }
  if (!it->second) throw kvq::Error("training refused this configuration before");
  return *it->second;
}


// A 64-bit hash of n bytes folded into h.
uint64_t fold(uint64_t h, const void* bytes, size_t n) {
  const uint64_t part = std::hash<std::string_view>{}(std::string_view(static_cast<const char*>(bytes), n));
  return (h ^ part) * 0x9e3779b97f4a7c15u + n;
}

// Everything an append may change: the sequences, their block tables and the free page count exactly, and a 64-bit
// hash of each sequence's page bytes, window and key offset (copying them took megabytes per append of f32 caches).
struct Snapshot {
  std::vector<SeqId> seqs;
  std::vector<std::vector<kvq::PageId>> pages;
  std::vector<uint64_t> contents;
  size_t free_pages = 0;

  Snapshot() = default;
  explicit Snapshot(const KVCache& cache) { take(cache); }

  // Refills the buffers, keeping what they hold allocated (the script takes one before every append; one kept from
  // input to input allocates nothing once it has held the most sequences and pages).
  void take(const KVCache& cache) {
    const size_t d = static_cast<size_t>(cache.config().head_dim), H = static_cast<size_t>(cache.config().n_kv_heads);
    seqs = cache.sequences();
    free_pages = cache.free_pages();
    pages.resize(kMaxSequences);
    contents.assign(kMaxSequences, 0);
    for (size_t i = seqs.size(); i < kMaxSequences; ++i) pages[i].clear();
    for (size_t i = 0; i < seqs.size(); ++i) {
      const kvq::LayerView v = cache.view(seqs[i], 0);
      pages[i].assign(v.pages.begin(), v.pages.end());
      uint64_t h = 0;
      for (kvq::PageId p : v.pages) h = fold(h, cache.page(p), cache.page_bytes());
      const size_t r = static_cast<size_t>(v.residual_count);
      for (size_t head = 0; head < H; ++head) {
        h = fold(h, v.residual_key(static_cast<int>(head)), r * d * sizeof(float));
        h = fold(h, v.residual_value(static_cast<int>(head)), r * d * sizeof(float));
      }
      if (v.key_offset) h = fold(h, v.key_offset, H * d * sizeof(float));
      contents[i] = fold(h, &r, sizeof r);
    }
  }
  bool operator==(const Snapshot&) const = default;
};

// What decides how a cache's codecs decode: the configuration and the trained state.
uint64_t codecs_hash(const KVCache& cache) {
  const kvq::CacheConfig& c = cache.config();
  uint64_t h = fold(0, c.key_codec.data(), c.key_codec.size());
  h = fold(h, c.value_codec.data(), c.value_codec.size());
  const uint64_t fields[] = {static_cast<uint64_t>(c.n_kv_heads), static_cast<uint64_t>(c.head_dim),
                             static_cast<uint64_t>(c.block_tokens), static_cast<uint64_t>(c.residual_tokens),
                             c.seed, c.center_keys};
  h = fold(h, fields, sizeof fields);
  for (const kvq::Codec* codec : {&cache.key_codec(0), &cache.value_codec(0)}) {
    const std::vector<uint8_t> state = codec->state();
    h = fold(h, state.data(), state.size());
  }
  return h;
}

// A sequence as KVCache::read gives it, each kv head's keys and values apart ([n][d], kvq::test::original_head).
struct ReadSequence {
  uint64_t key = 0;  // read_sequence's hash of the codecs and of what read() read
  size_t tokens = 0;
  std::array<kvq::test::Tokens, 4> heads;  // at most 4 kv heads
};

// KVCache::read of a sequence, remembered across inputs: a mutated input replays its parent's appends, so about 70%
// of what the attention checks read was read before (of the same codecs, the same bytes), and reading (the QJL
// codecs' S^T y above all) took a quarter of the target's time. An entry is keyed by a 64-bit hash of the codecs
// (codecs_hash) and of everything read() reads: the pages' bytes, the window and the key offset. The buffers are
// allocated once at the most a sequence holds, so an input allocates no more than it frees (libFuzzer runs an
// input that does a second time, looking for leaks).
const ReadSequence& read_sequence(const KVCache& cache, uint64_t codecs, SeqId seq) {
  struct Slot {
    uint64_t key = 0;
    bool used = false;
    ReadSequence read;
  };
  constexpr size_t kSlots = 64, kMaxFloats = kMaxTokens * 128;  // per kv head; d at most 128
  const auto reserved = [](kvq::test::Tokens& t, size_t floats) {
    t.keys.reserve(floats);
    t.values.reserve(floats);
  };
  static kvq::test::Tokens all = [&] {  // read()'s [n][H][d]
    kvq::test::Tokens t;
    reserved(t, 4 * kMaxFloats);
    return t;
  }();
  static std::vector<Slot> slots = [&] {
    std::vector<Slot> s(kSlots);
    for (Slot& slot : s)
      for (kvq::test::Tokens& head : slot.read.heads) reserved(head, kMaxFloats);
    return s;
  }();
  static size_t next = 0;

  const kvq::LayerView v = cache.view(seq, 0);
  const size_t d = static_cast<size_t>(cache.config().head_dim), r = static_cast<size_t>(v.residual_count);
  const size_t H = static_cast<size_t>(cache.config().n_kv_heads), n = v.length();
  uint64_t key = codecs;
  for (kvq::PageId p : v.pages) key = fold(key, cache.page(p), cache.page_bytes());
  key = fold(key, &r, sizeof r);
  for (int h = 0; h < static_cast<int>(H); ++h) {
    key = fold(key, v.residual_key(h), r * d * sizeof(float));
    key = fold(key, v.residual_value(h), r * d * sizeof(float));
  }
  if (v.key_offset) key = fold(key, v.key_offset, H * d * sizeof(float));
  for (const Slot& slot : slots)
    if (slot.used && slot.key == key) return slot.read;

  Slot& slot = slots[next];
  next = (next + 1) % kSlots;
  slot.used = true;
  slot.key = key;
  slot.read.key = key;
  all.keys.resize(n * H * d);
  all.values.resize(all.keys.size());
  cache.read(seq, 0, all.keys.data(), all.values.data());
  slot.read.tokens = n;
  for (size_t h = 0; h < H; ++h) {
    kvq::test::Tokens& head = slot.read.heads[h];
    head.keys.resize(n * d);
    head.values.resize(n * d);
    for (size_t t = 0; t < n; ++t) {
      std::memcpy(head.keys.data() + t * d, all.keys.data() + (t * H + h) * d, d * sizeof(float));
      std::memcpy(head.values.data() + t * d, all.values.data() + (t * H + h) * d, d * sizeof(float));
    }
  }
  return slot.read;
}

// The reference's answer for one query row: decode attention's expected output over the decoded tokens [first, n)
// of one kv head, the magnitude sum_t p_t |v_t| and the condition max_t scale sum_j |q_j k_tj| of the bound. A pure
// function of the sequence as read (ReadSequence::key), the head, the window's first token and the query, so it is
// remembered across inputs like the reads it is computed from (mutated inputs replay their parent's queries over the
// same states): one direct-mapped slot per 64-bit hash of those, allocated once.
struct Expected {
  uint64_t key = 0;
  bool used = false;
  double magnitude = 0, condition = 0;
  std::array<float, 128> want;  // d at most 128
};
const Expected& expected(const ReadSequence& read, size_t h, size_t first, const float* q, size_t d) {
  static std::vector<Expected> slots(1 << 14);
  uint64_t key = fold(read.key, &h, sizeof h);
  key = fold(key, &first, sizeof first);
  key = fold(key, q, d * sizeof(float));
  Expected& e = slots[key % slots.size()];
  if (e.used && e.key == key) return e;
  e.used = true;
  e.key = key;
  const kvq::test::Tokens& kv = read.heads[h];
  const size_t n = read.tokens;
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  kvq::reference_attention(q, 1, kv.keys.data() + first * d, kv.values.data() + first * d, n - first,
                           static_cast<int>(d), n - first, scale, e.want.data(), &e.magnitude);
  e.condition = 0;
  for (size_t t = first; t < n; ++t) {
    double sum = 0;
    for (size_t i = 0; i < d; ++i) sum += std::fabs(static_cast<double>(q[i]) * kv.keys[t * d + i]);
    e.condition = std::max(e.condition, scale * sum);
  }
  return e;
}

class Script {
 public:
  Script(KVCache& cache, int queries_per_head, kvq::fuzz::ByteReader& in)
      : cache_(cache), codecs_(codecs_hash(cache)), G_(queries_per_head), in_(in) {}

  void run() {
    for (int op = 0; op < kMaxOps && !in_.empty(); ++op) {
      switch (in_.pick(4)) {
        case 0:
          if (cache_.sequences().size() < kMaxSequences) cache_.add_sequence();
          break;
        case 1:
          if (!cache_.sequences().empty()) cache_.remove_sequence(pick_sequence());
          break;
        case 2:
          if (!cache_.sequences().empty()) append(pick_sequence());
          break;
        default:
          if (attentions_ + 1 < kMaxAttentions) attend();
      }
    }
    attend();
  }

 private:
  SeqId pick_sequence() {
    const std::vector<SeqId> seqs = cache_.sequences();
    return seqs[in_.pick(seqs.size())];
  }

  void append(SeqId seq) {
    const kvq::CacheConfig& c = cache_.config();
    // 1..256 rows of tokens x kv heads: 1..256 tokens of one head, 1..64 of four. The work of an input is its rows (the
    // target's time went with tokens x heads x d); a page of any configuration, several in one append and the token
    // limit stay in reach (one head's pages are the same code as four's).
    const size_t H = static_cast<size_t>(c.n_kv_heads), n = 1 + in_.take<uint8_t>() % (256 / H);
    if (cache_.length(seq, 0) + n > kMaxTokens) return;
    const float scale = std::ldexp(1.0f, static_cast<int>(in_.pick(10)) - 6);
    const uint8_t shape = in_.take<uint8_t>();
    const uint64_t seed = ++draws_;
    constexpr size_t kMostFloats = 256 * 4 * 128;  // an append's tokens x kv heads x d
    std::vector<float>& keys = buffer(0, kMostFloats);
    std::vector<float>& values = buffer(1, kMostFloats);
    draw(keys, shape & 1, c.head_dim, seed, seed, n * H, scale);
    draw(values, false, c.head_dim, 0, seed + 1, n * H, scale);
    const bool poisoned = (shape >> 1) % 4 == 0;
    if (poisoned) {
      const size_t at = in_.take<uint16_t>() % (2 * keys.size());
      float& x = at < keys.size() ? keys[at] : values[at - keys.size()];
      constexpr std::array kNonFinite{std::numeric_limits<float>::quiet_NaN(), std::numeric_limits<float>::infinity(),
                                      -std::numeric_limits<float>::infinity()};
      x = kNonFinite[(shape >> 3) % kNonFinite.size()];
    }
    const size_t before = cache_.length(seq, 0);
    static Snapshot snapshot = [] {  // its buffers reserved once
      Snapshot empty;
      empty.seqs.reserve(kMaxSequences);
      empty.pages.resize(kMaxSequences);
      for (std::vector<kvq::PageId>& p : empty.pages) p.reserve(16);
      return empty;
    }();
    snapshot.take(cache_);
    try {
      cache_.append(seq, 0, keys.data(), values.data(), n);
    } catch (const kvq::Error&) {
      KVQ_FUZZ_CHECK(Snapshot(cache_) == snapshot, "an append that throws leaves the cache as it was");
      return;
    }
    KVQ_FUZZ_CHECK(!poisoned, "an append with NaN or Inf throws kvq::Error");
    KVQ_FUZZ_CHECK(cache_.length(seq, 0) == before + n, "an append adds its tokens");
  }

  void attend() {
    ++attentions_;
    const kvq::CacheConfig& c = cache_.config();
    const size_t d = static_cast<size_t>(c.head_dim), H = static_cast<size_t>(c.n_kv_heads);
    const size_t G = static_cast<size_t>(G_);
    const std::vector<SeqId> seqs = cache_.sequences();
    kvq::AttentionOptions options;
    options.splits = static_cast<int>(in_.pick(4));
    if (in_.pick(4) == 0) options.window = 1 + in_.take<uint8_t>();
    std::vector<float>& q = buffer(2, kMaxSequences * 4 * 4 * 128);  // sequences x kv heads x G x d
    draw(q, false, c.head_dim, 0, ++draws_, seqs.size() * H * G);
    std::vector<float> out(q.size(), std::numeric_limits<float>::quiet_NaN());
    kvq::decode_attention(cache_, 0, seqs, q, out, options);

    for (size_t s = 0; s < seqs.size(); ++s) {
      const ReadSequence& read = read_sequence(cache_, codecs_, seqs[s]);
      const size_t n = read.tokens;
      const size_t first = options.window > 0 && options.window < n ? n - options.window : 0;
      for (size_t h = 0; h < H; ++h) {
        for (size_t j = 0; j < G; ++j) {
          const size_t row = (s * H + h) * G + j;
          const float* got = out.data() + row * d;
          const Expected& e = expected(read, h, first, q.data() + row * d, d);
          const float* want = e.want.data();
          const double condition = e.condition, magnitude = e.magnitude;
          double err = 0;
          for (size_t i = 0; i < d; ++i) {
            const double diff = static_cast<double>(got[i]) - want[i];
            err += diff * diff;
          }
          const double bound = (1e-5 + std::sqrt(static_cast<double>(d)) * 0x1p-24 * condition) * magnitude;
          KVQ_FUZZ_CHECK(n > first ? std::sqrt(err) <= bound : err == 0,
                         "decode attention matches the reference over the decoded cache");
        }
      }
    }
  }

  KVCache& cache_;
  uint64_t codecs_;
  int G_;
  kvq::fuzz::ByteReader& in_;
  uint64_t draws_ = 0;
  int attentions_ = 0;
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // The bound above is the exact kernels' (the fast ones have their own contract: fast_attention_kernels_test.cpp).
  static const bool exact_kernels = setenv("KVQ_ATTENTION", "exact", 1) == 0;
  KVQ_FUZZ_CHECK(exact_kernels, "KVQ_ATTENTION=exact is set");
  kvq::fuzz::ByteReader in(data, size);
  const Pair pair = kPairs[in.pick(kPairs.size())];
  const int group = 16 << in.pick(3);
  kvq::CacheConfig c;
  c.n_layers = 1;
  c.key_codec = with_group(pair.key, group);
  c.value_codec = with_group(pair.value, group);
  c.n_kv_heads = 1 + static_cast<int>(in.pick(4));
  const int queries_per_head = 1 + static_cast<int>(in.pick(4));
  c.head_dim = in.pick(2) ? 128 : 64;
  c.block_tokens = in.pick(2) ? 128 : 64;
  c.residual_tokens = c.block_tokens * static_cast<int>(in.pick(2));
  c.capacity_pages = in.pick(2) ? 16 : 2;
  const uint8_t flags = in.take<uint8_t>();
  c.center_keys = flags & 1;
  c.seed = flags >> 2;
  std::optional<KVCache> cache;
  try {
    cache.emplace(c);
    if (!cache->ready(0) || (flags & 2)) {  // vecinfer must learn its codebook; int4/int8 may calibrate scales
      const Taught& taught = trained(c);
      if (taught.key || taught.value) {
        kvq::detail::CacheBuilder builder(c);
        builder.load_codecs(0, taught.key ? *taught.key : cache->key_codec(0),
                            taught.value ? *taught.value : cache->value_codec(0));
        cache = builder.finish();
      }
    }
  } catch (const kvq::Error&) {
    return 0;  // a configuration a codec refuses (a group size against d)
  }
  Script(*cache, queries_per_head, in).run();  // the script's only expected errors are those of append
  return 0;
}

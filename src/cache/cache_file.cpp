// KVCache::save / KVCache::load. File format, version 5 (a cache without sink tokens is written as version 4, which
// lacks the fields marked v5, so that earlier builds still read it), all integers little-endian:
//
//   header (24 bytes): char[8] "KVQCACHE" | u32 version | u32 CRC-32C of the payload | u64 payload bytes
//   payload:
//     u32 n_layers, n_kv_heads, head_dim, block_tokens, residual_tokens | u64 capacity_pages, seed | u8 center_keys
//     | u32 sink_tokens (v5)
//     str key codec spec | str value codec spec                           (str: u32 length, then the bytes)
//     u64 key block bytes, value block bytes, page bytes                   (must match this build's codecs)
//     per layer: key codec, then value codec: u8 trained | u64 n | n bytes of Codec::state()
//     u64 next sequence id | u64 number of sequences
//     per sequence: u64 id; per layer: u64 n_pages | u32 residual tokens r | n_pages pages (page bytes each, in
//       block-table order) | residual keys [kv head][r][d] f32 | residual values [kv head][r][d] f32 |
//       u8 has key offset | key offset [kv head][d] f32 if it has one | (v5:) u32 sink tokens s | sink keys
//       [kv head][s][d] f16 | sink values [kv head][s][d] f16
//
// Pages are written in block-table order, so a loaded cache holds its pages compacted at the front of its pool.
// Load checks the header, the size and the CRC before parsing, then validates every count against the bytes left
// before reading or allocating: a damaged file raises kvq::Error, never a crash.
#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <string>

#include "cache/key_offset.hpp"
#include "core/crc32c.hpp"
#include "kvq/cache.hpp"
#include "kvq/codec.hpp"
#include "kvq/error.hpp"

namespace kvq {
namespace {

static_assert(std::endian::native == std::endian::little, "cache files are written in the host's byte order");

constexpr std::array<char, 8> kMagic{'K', 'V', 'Q', 'C', 'A', 'C', 'H', 'E'};
// Version 2: kivi, turbo_mse and turbo_prod blocks in lane tiles (block_layout.hpp); version 1 files hold them in
// the older token-major layout and are not read. Version 3 adds centered keys (the u8 center_keys and the key
// offsets); a version 2 file is read as a cache without them. Version 4: qjl signs, and turbo_prod value signs, in
// sign tiles (layout::SignTiles); older files with qjl keys or values or turbo_prod values are not read, the others
// are. Version 5 adds sink tokens (sink_tokens and each layer's f16 sinks); older files are read as caches without.
constexpr uint32_t kVersion = 5, kOldestVersion = 2, kSignTilesVersion = 4, kSinksVersion = 5;
constexpr size_t kHeaderBytes = 24;
constexpr uint32_t kMaxSpecBytes = 1024;

class Writer {
 public:
  explicit Writer(std::ofstream& out) : out_(out) {}
  void bytes(const void* p, size_t n) {
    out_.write(static_cast<const char*>(p), static_cast<std::streamsize>(n));
    crc_ = crc32c(p, n, crc_);
    count_ += n;
  }
  template <class Int>
  void num(Int v) {
    bytes(&v, sizeof v);
  }
  void str(const std::string& s) {
    num(static_cast<uint32_t>(s.size()));
    bytes(s.data(), s.size());
  }
  uint32_t crc() const { return crc_; }
  uint64_t count() const { return count_; }

 private:
  std::ofstream& out_;
  uint32_t crc_ = 0;
  uint64_t count_ = 0;
};

// Reads the payload; every read first checks that the bytes are there.
class Reader {
 public:
  Reader(std::ifstream& in, uint64_t remaining) : in_(in), left_(remaining) {}
  void need(uint64_t n, const char* what) const {
    KVQ_CHECK(n <= left_, "corrupt cache file: ", what, " needs ", n, " bytes, only ", left_, " left");
  }
  void bytes(void* p, size_t n, const char* what) {
    need(n, what);
    in_.read(static_cast<char*>(p), static_cast<std::streamsize>(n));
    KVQ_CHECK(in_.good(), "read error in ", what);
    left_ -= n;
  }
  template <class Int>
  Int num(const char* what) {
    Int v;
    bytes(&v, sizeof v, what);
    return v;
  }
  std::string str(const char* what) {
    const uint32_t n = num<uint32_t>(what);
    KVQ_CHECK(n <= kMaxSpecBytes, "corrupt cache file: ", what, " of ", n, " bytes");
    std::string s(n, '\0');
    bytes(s.data(), n, what);
    return s;
  }
  uint64_t left() const { return left_; }

 private:
  std::ifstream& in_;
  uint64_t left_;
};

// The least a layer's codec takes in the payload: u8 trained flag, u64 state size.
constexpr uint64_t kMinCodecBytes = 1 + 8;

void check_finite(const float* x, size_t n, const char* what, SeqId seq, int layer) {
  for (size_t i = 0; i < n; ++i)
    KVQ_CHECK(std::isfinite(x[i]), "corrupt cache file: sequence ", seq, " layer ", layer, " holds ", x[i], " in its ",
              what, " (NaN and Inf are rejected)");
}

int to_int(uint32_t v, const char* what) {
  KVQ_CHECK(v <= static_cast<uint32_t>(std::numeric_limits<int>::max()), "corrupt cache file: ", what, " = ", v);
  return static_cast<int>(v);
}

// Decodes every block of a loaded page: bytes that decode to NaN or Inf (a crafted scale, say) would poison every
// attention over them, so load refuses them. A decode per block costs about what encoding it did.
class PageChecker {
 public:
  explicit PageChecker(const KVCache& cache)
      : cache_(cache),
        tokens_(static_cast<size_t>(cache.config().block_tokens)),
        decoded_(tokens_ * static_cast<size_t>(cache.config().head_dim)) {}

  void check(PageId page, int layer, SeqId seq) {
    for (int h = 0; h < cache_.config().n_kv_heads; ++h) {
      check_block(cache_.key_codec(layer), cache_.key_block(page, h), "key", h, layer, seq);
      check_block(cache_.value_codec(layer), cache_.value_block(page, h), "value", h, layer, seq);
    }
  }

 private:
  void check_block(const Codec& codec, const uint8_t* block, const char* what, int head, int layer, SeqId seq) {
    codec.decode(block, static_cast<int>(tokens_), decoded_.data());
    for (const float x : decoded_)
      KVQ_CHECK(std::isfinite(x), "corrupt cache file: sequence ", seq, " layer ", layer, " kv head ", head,
                " has a ", what, " block that decodes to ", x, " (NaN and Inf are rejected)");
  }

  const KVCache& cache_;
  size_t tokens_;
  std::vector<float> decoded_;
};

}  // namespace

// Friend of KVCache: reads and writes its private state.
class CacheFile {
 public:
  static void write(const KVCache& cache, std::ofstream& out);
  static KVCache read(std::ifstream& in, uint64_t payload_bytes, uint32_t version);
};

void CacheFile::write(const KVCache& cache, std::ofstream& out) {
  const CacheConfig& c = cache.config_;
  const size_t H = static_cast<size_t>(c.n_kv_heads), d = static_cast<size_t>(c.head_dim);
  out.write(std::string(kHeaderBytes, '\0').data(), kHeaderBytes);  // filled in at the end
  const uint32_t version = c.sink_tokens > 0 ? kSinksVersion : kSinksVersion - 1;
  Writer w(out);
  for (int v : {c.n_layers, c.n_kv_heads, c.head_dim, c.block_tokens, c.residual_tokens})
    w.num(static_cast<uint32_t>(v));
  w.num(static_cast<uint64_t>(c.capacity_pages));
  w.num(c.seed);
  w.num(static_cast<uint8_t>(c.center_keys));
  if (version >= kSinksVersion) w.num(static_cast<uint32_t>(c.sink_tokens));
  w.str(c.key_codec);
  w.str(c.value_codec);
  w.num(static_cast<uint64_t>(cache.key_codecs_[0]->block_bytes()));
  w.num(static_cast<uint64_t>(cache.value_codecs_[0]->block_bytes()));
  w.num(static_cast<uint64_t>(cache.page_bytes()));
  for (int l = 0; l < c.n_layers; ++l)
    for (const Codec* codec : {&cache.key_codec(l), &cache.value_codec(l)}) {
      const std::vector<uint8_t> state = codec->trained() ? codec->state() : std::vector<uint8_t>{};
      w.num(static_cast<uint8_t>(codec->trained()));
      w.num(static_cast<uint64_t>(state.size()));
      w.bytes(state.data(), state.size());
    }
  w.num(static_cast<uint64_t>(cache.sequences_.next_id));
  w.num(static_cast<uint64_t>(cache.sequences_.size()));
  for (const auto& [id, seq] : cache.sequences_) {
    w.num(static_cast<uint64_t>(id));
    for (const auto& layer : seq.layers) {
      w.num(static_cast<uint64_t>(layer.pages.size()));
      w.num(static_cast<uint32_t>(layer.residual_count));
      for (PageId p : layer.pages) w.bytes(cache.page(p), cache.page_bytes());
      const size_t r = static_cast<size_t>(layer.residual_count), slots = layer.window_slots;
      for (size_t row = 0; row < 2 * H && r > 0; ++row) w.bytes(layer.residual.data() + row * slots * d, r * d * 4);
      w.num(static_cast<uint8_t>(!layer.key_offset.empty()));
      if (!layer.key_offset.empty()) w.bytes(layer.key_offset.data(), layer.key_offset.size() * 4);
      const size_t s = static_cast<size_t>(layer.sink_count), sink_slots = layer.sink_slots;
      if (version >= kSinksVersion) w.num(static_cast<uint32_t>(s));
      for (size_t row = 0; row < 2 * H && s > 0; ++row) w.bytes(layer.sinks.data() + row * sink_slots * d, s * d * 2);
    }
  }
  const uint32_t crc = w.crc();
  const uint64_t payload = w.count();
  out.seekp(0);
  out.write(kMagic.data(), kMagic.size());
  out.write(reinterpret_cast<const char*>(&version), 4);
  out.write(reinterpret_cast<const char*>(&crc), 4);
  out.write(reinterpret_cast<const char*>(&payload), 8);
}

KVCache CacheFile::read(std::ifstream& in, uint64_t payload_bytes, uint32_t version) {
  Reader r(in, payload_bytes);
  CacheConfig c;
  c.n_layers = to_int(r.num<uint32_t>("n_layers"), "n_layers");
  c.n_kv_heads = to_int(r.num<uint32_t>("n_kv_heads"), "n_kv_heads");
  c.head_dim = to_int(r.num<uint32_t>("head_dim"), "head_dim");
  c.block_tokens = to_int(r.num<uint32_t>("block_tokens"), "block_tokens");
  c.residual_tokens = to_int(r.num<uint32_t>("residual_tokens"), "residual_tokens");
  c.capacity_pages = r.num<uint64_t>("capacity_pages");
  c.seed = r.num<uint64_t>("seed");
  c.center_keys = version >= 3 && r.num<uint8_t>("center_keys flag") != 0;
  if (version >= kSinksVersion) {
    const uint32_t sinks = r.num<uint32_t>("sink_tokens");
    KVQ_CHECK(sinks <= static_cast<uint32_t>(kMaxSinkTokens), "corrupt cache file: sink_tokens = ", sinks);
    c.sink_tokens = static_cast<int>(sinks);
  }
  c.key_codec = r.str("key codec spec");
  c.value_codec = r.str("value codec spec");
  if (version < kSignTilesVersion) {
    const std::string k = CodecSpec::parse(c.key_codec).name, v = CodecSpec::parse(c.value_codec).name;
    KVQ_CHECK(k != "qjl" && v != "qjl" && v != "turbo_prod", "format version ", version, " holds ",
              k == "qjl" ? "qjl key" : v == "qjl" ? "qjl value" : "turbo_prod value",
              " blocks in an earlier sign layout (version ", kSignTilesVersion,
              " moved their signs to sign tiles): write it again");
  }
  const auto key_block = r.num<uint64_t>("key block bytes"), value_block = r.num<uint64_t>("value block bytes");
  const auto page_bytes = r.num<uint64_t>("page bytes");
  // Every layer takes at least the flag and size of its two codecs' states: a file that claims more layers than
  // its bytes can describe is refused before the codecs of each layer are built.
  r.need(static_cast<uint64_t>(c.n_layers) * 2 * kMinCodecBytes, "the layers' codec states");

  KVCache cache(c);
  KVQ_CHECK(key_block == cache.key_codecs_[0]->block_bytes() && value_block == cache.value_codecs_[0]->block_bytes() &&
                page_bytes == cache.page_bytes(),
            "blocks of ", key_block, " / ", value_block, " bytes in pages of ", page_bytes,
            " bytes were saved, but this build's codecs '", c.key_codec, "' / '", c.value_codec, "' use ",
            cache.key_codecs_[0]->block_bytes(), " / ", cache.value_codecs_[0]->block_bytes(), " in pages of ",
            cache.page_bytes(), " (file written by an incompatible kvq version)");
  for (int l = 0; l < c.n_layers; ++l)
    for (Codec* codec :
         {cache.key_codecs_[static_cast<size_t>(l)].get(), cache.value_codecs_[static_cast<size_t>(l)].get()}) {
      const bool trained = r.num<uint8_t>("codec trained flag") != 0;
      const uint64_t n = r.num<uint64_t>("codec state size");
      r.need(n, "codec state");
      std::vector<uint8_t> state(static_cast<size_t>(n));
      r.bytes(state.data(), state.size(), "codec state");
      if (trained) {
        codec->load_state(state);
      } else {
        KVQ_CHECK(state.empty(), "corrupt cache file: an untrained codec with ", n, " bytes of state");
      }
    }

  const size_t H = static_cast<size_t>(c.n_kv_heads), d = static_cast<size_t>(c.head_dim);
  const size_t slots = cache.residual_slots();
  cache.sequences_.next_id = r.num<uint64_t>("next sequence id");
  const uint64_t n_seqs = r.num<uint64_t>("sequence count");
  KVQ_CHECK(n_seqs <= cache.sequences_.next_id, "corrupt cache file: ", n_seqs, " sequences but next id ",
            cache.sequences_.next_id);
  // page count, window count, key offset flag, sink count
  const uint64_t layer_bytes = 8 + 4 + (version >= 3 ? 1 : 0) + (version >= kSinksVersion ? 4 : 0);
  r.need(n_seqs * (8 + static_cast<uint64_t>(c.n_layers) * layer_bytes), "the sequences");
  PageChecker checker(cache);
  for (uint64_t s = 0; s < n_seqs; ++s) {
    const SeqId id = r.num<uint64_t>("sequence id");
    KVQ_CHECK(id < cache.sequences_.next_id && !cache.has_sequence(id), "corrupt cache file: sequence id ", id,
              " repeated or not below the next id ", cache.sequences_.next_id);
    KVCache::Sequence& seq = cache.sequences_.insert(id, c.n_layers);
    for (int l = 0; l < c.n_layers; ++l) {
      KVCache::LayerState& layer = seq.layers[static_cast<size_t>(l)];
      const uint64_t n_pages = r.num<uint64_t>("page count");
      const uint32_t count = r.num<uint32_t>("residual token count");
      KVQ_CHECK(count <= slots, "corrupt cache file: a residual window of ", count, " tokens (at most ", slots, ")");
      KVQ_CHECK(n_pages <= cache.free_pages(), "corrupt cache file: sequence ", id, " layer ", l, " holds ", n_pages,
                " pages, only ", cache.free_pages(), " of the pool's ", c.capacity_pages, " are left");
      KVQ_CHECK(n_pages == 0 || cache.ready(l), "corrupt cache file: sequence ", id, " layer ", l,
                " holds pages but its codecs were never trained");
      r.need(n_pages * cache.page_bytes(), "pages");
      layer.pages.reserve(static_cast<size_t>(n_pages));
      cache.free_.take(static_cast<size_t>(n_pages), layer.pages);
      for (const PageId p : layer.pages) {
        r.bytes(cache.page_mut(p), cache.page_bytes(), "page");
        checker.check(p, l, id);
      }
      const size_t window_floats = count * d;
      r.need(2 * H * window_floats * 4, "residual tokens");
      cache.reserve_window(layer, count);
      layer.residual_count = static_cast<int>(count);
      for (size_t row = 0; row < 2 * H && count > 0; ++row) {  // keys, then values
        float* window = layer.residual.data() + row * layer.window_slots * d;
        r.bytes(window, window_floats * 4, "residual tokens");
        check_finite(window, window_floats, row < H ? "residual keys" : "residual values", id, l);
      }
      if (version >= 3 && r.num<uint8_t>("key offset flag") != 0) {
        KVQ_CHECK(detail::centers_keys(c) && n_pages > 0, "corrupt cache file: sequence ", id, " layer ", l,
                  " has a key offset without centered keys and pages");
        r.need(H * d * 4, "key offset");
        layer.key_offset.resize(H * d);
        r.bytes(layer.key_offset.data(), H * d * 4, "key offset");
        check_finite(layer.key_offset.data(), H * d, "key offset", id, l);
      } else {
        KVQ_CHECK(!detail::centers_keys(c) || n_pages == 0, "corrupt cache file: sequence ", id, " layer ", l,
                  " has centered keys in pages but no key offset");
      }
      const uint32_t sinks = version >= kSinksVersion ? r.num<uint32_t>("sink token count") : 0;
      KVQ_CHECK(sinks <= static_cast<uint32_t>(c.sink_tokens), "corrupt cache file: ", sinks,
                " sink tokens (at most ", c.sink_tokens, ")");
      KVQ_CHECK(sinks == static_cast<uint32_t>(c.sink_tokens) || (n_pages == 0 && count == 0),
                "corrupt cache file: sequence ", id, " layer ", l, " holds tokens after ", sinks, " of its ",
                c.sink_tokens, " sink tokens");
      if (sinks > 0) {
        const size_t s16 = sinks * d;
        r.need(2 * H * s16 * 2, "sink tokens");
        cache.reserve_sinks(layer, sinks);  // as many slots as the file holds tokens: memory follows the file
        for (size_t row = 0; row < 2 * H; ++row) {  // keys, then values
          uint16_t* at = layer.sinks.data() + row * layer.sink_slots * d;
          r.bytes(at, s16 * 2, "sink tokens");
          for (size_t i = 0; i < s16; ++i)
            KVQ_CHECK((at[i] & 0x7c00u) != 0x7c00u, "corrupt cache file: sequence ", id, " layer ", l,
                      " holds a NaN or Inf in its sink ", row < H ? "keys" : "values");
        }
        layer.sink_count = static_cast<int>(sinks);
      }
    }
  }
  KVQ_CHECK(r.left() == 0, "corrupt cache file: ", r.left(), " unread bytes at the end");
  return cache;
}

void KVCache::save(const std::string& path) const {
  if (cuda_) return to_cpu(0).save(path);
  const std::string tmp = path + ".tmp";
  try {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    KVQ_CHECK(out.is_open(), "KVCache::save: cannot open '", tmp, "' for writing");
    CacheFile::write(*this, out);
    out.close();
    KVQ_CHECK(out.good(), "KVCache::save: writing '", tmp, "' failed (disk full?)");
  } catch (...) {
    std::error_code ignored;
    std::filesystem::remove(tmp, ignored);
    throw;
  }
  std::error_code ec;
  std::filesystem::rename(tmp, path, ec);
  KVQ_CHECK(!ec, "KVCache::save: cannot rename '", tmp, "' to '", path, "': ", ec.message());
}

KVCache KVCache::load(const std::string& path, Device device) {
  if (device.is_cuda()) return load(path).to(device);
  std::error_code ec;
  const std::filesystem::file_status status = std::filesystem::status(path, ec);
  KVQ_CHECK(!ec, "KVCache::load: cannot read '", path, "': ", ec.message());
  // Before opening: a FIFO would block the open, a device would never end.
  KVQ_CHECK(std::filesystem::is_regular_file(status), "KVCache::load: '", path, "' is not a regular file");
  const uint64_t size = std::filesystem::file_size(path, ec);
  KVQ_CHECK(!ec, "KVCache::load: cannot read '", path, "': ", ec.message());
  std::ifstream in(path, std::ios::binary);
  KVQ_CHECK(in.is_open(), "KVCache::load: cannot open '", path, "'");
  KVQ_CHECK(size >= kHeaderBytes, "KVCache::load: '", path, "' is not a kvq cache file (", size,
            " bytes, shorter than the ", kHeaderBytes, "-byte header)");
  std::array<char, 8> magic{};
  uint32_t version = 0, crc = 0;
  uint64_t payload = 0;
  in.read(magic.data(), 8);
  in.read(reinterpret_cast<char*>(&version), 4);
  in.read(reinterpret_cast<char*>(&crc), 4);
  in.read(reinterpret_cast<char*>(&payload), 8);
  KVQ_CHECK(in.good(), "KVCache::load: cannot read the header of '", path, "'");
  KVQ_CHECK(magic == kMagic, "KVCache::load: '", path, "' is not a kvq cache file (no KVQCACHE magic)");
  KVQ_CHECK(version != 0, "KVCache::load: '", path, "' has an invalid format version 0");
  KVQ_CHECK(version <= kVersion, "KVCache::load: '", path, "' has format version ", version,
            ", newer than this build reads (", kVersion, "): update kvq");
  KVQ_CHECK(version >= kOldestVersion, "KVCache::load: '", path, "' has format version ", version,
            ", older than this build reads (", kOldestVersion, "): its blocks use an earlier layout; write it again");
  KVQ_CHECK(payload == size - kHeaderBytes, "KVCache::load: '", path,
            "' is truncated or damaged: the header announces ", payload, " payload bytes, the file holds ",
            size - kHeaderBytes);

  std::vector<char> chunk(std::min<uint64_t>(payload, 1 << 20));  // the CRC pass reads at most 1 MiB at a time
  uint32_t actual = 0;
  for (uint64_t left = payload; left > 0;) {
    const size_t n = static_cast<size_t>(std::min<uint64_t>(left, chunk.size()));
    in.read(chunk.data(), static_cast<std::streamsize>(n));
    KVQ_CHECK(in.good(), "KVCache::load: read error in '", path, "'");
    actual = crc32c(chunk.data(), n, actual);
    left -= n;
  }
  KVQ_CHECK(actual == crc, "KVCache::load: '", path, "' is damaged: the payload's CRC-32C is ", actual,
            ", the header says ", crc);
  in.seekg(static_cast<std::streamoff>(kHeaderBytes));
  try {
    return CacheFile::read(in, payload, version);
  } catch (const Error& e) {
    throw Error(detail::concat("KVCache::load: '", path, "': ", e.what()));
  }
}

}  // namespace kvq

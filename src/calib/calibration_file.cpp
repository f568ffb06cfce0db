// The calibration file (format in kvq/detail/calibration.hpp): text, so that the chosen codecs can be read, with a
// version and a CRC-32C so that a damaged or foreign file is refused before any of it is used.
#include <cinttypes>
#include <cstdio>
#include <fstream>
#include <sstream>

#include "core/crc32c.hpp"
#include "kvq/cache.hpp"
#include "kvq/codec.hpp"
#include "kvq/detail/calibration.hpp"
#include "kvq/error.hpp"

namespace kvq {
namespace {

constexpr std::string_view kMagic = "kvq-calibration";
constexpr int kVersion = 5;
constexpr int kFirstVersion = 1;  // without block_tokens and calibration_tokens
constexpr int kFirstCenteringVersion = 3;  // the layer lines' key centering
constexpr int kFirstSinksVersion = 4;      // sink_tokens
constexpr int kFirstStatesVersion = 5;     // trained_states
// Trained states make files large (vecinfer:12/8 at d = 256: 262 KB of hex per codec); the whole file is read.
constexpr size_t kMaxFileBytes = size_t{64} << 20;
constexpr int kMaxLayers = 4096;

std::string hex32(uint32_t x) {
  char s[9];
  std::snprintf(s, sizeof(s), "%08" PRIx32, x);
  return s;
}

std::string hex_bytes(const std::vector<uint8_t>& bytes) {
  static constexpr char digits[] = "0123456789abcdef";
  std::string s;
  s.reserve(2 * bytes.size());
  for (uint8_t b : bytes) s += digits[b >> 4], s += digits[b & 15];
  return s;
}

int hex_digit(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  return -1;
}

// Reads the fields of a calibration, in the file's order; every failure names the file and the line.
class FieldReader {
 public:
  FieldReader(std::string_view text, const std::filesystem::path& path) : in_(std::string(text)), path_(path) {}

  // The next line, which must start with `key`; returns the rest of it.
  std::istringstream next(std::string_view key) {
    std::string line;
    ++line_no_;
    KVQ_CHECK(std::getline(in_, line), where(), "ends before its '", key, "' line");
    std::istringstream fields(line);
    std::string word;
    fields >> word;
    KVQ_CHECK(word == key, where(), "holds '", word, "' where '", key, "' belongs");
    return fields;
  }
  template <typename T>
  T value(std::string_view key) {
    std::istringstream fields = next(key);
    T v{};
    fields >> v;
    KVQ_CHECK(!fields.fail(), where(), "has no valid value for '", key, "'");
    return v;
  }
  int count(std::string_view key, int max) {
    const int v = value<int>(key);
    KVQ_CHECK(v >= 1 && v <= max, where(), key, " ", v, " is outside [1, ", max, "]");
    return v;
  }
  // Whether every line has been read.
  bool at_end() {
    std::string line;
    ++line_no_;
    return !std::getline(in_, line);
  }
  std::string where() const { return detail::concat("calibration file ", path_, " line ", line_no_, " "); }

 private:
  std::istringstream in_;
  std::filesystem::path path_;
  int line_no_ = 0;
};

// One `state L ROLE BYTES HEX` line's bytes, checked against its length before anything is allocated.
std::vector<uint8_t> parse_state_bytes(std::istringstream& fields, const std::string& where) {
  size_t n = 0;
  std::string hex;
  fields >> n >> hex;
  KVQ_CHECK(!fields.fail() && n > 0 && n <= kMaxFileBytes / 2 && hex.size() == 2 * n, where,
            "should be 'state LAYER key|value BYTES HEX' with 2 BYTES hex digits of a state of BYTES > 0 bytes");
  std::vector<uint8_t> bytes(n);
  for (size_t i = 0; i < n; ++i) {
    const int hi = hex_digit(hex[2 * i]), lo = hex_digit(hex[2 * i + 1]);
    KVQ_CHECK(hi >= 0 && lo >= 0, where, "has '", hex.substr(2 * i, 2), "' where 2 lowercase hex digits belong");
    bytes[i] = static_cast<uint8_t>(hi << 4 | lo);
  }
  std::string rest;
  KVQ_CHECK(!(fields >> rest), where, "has '", rest, "' after its state");
  return bytes;
}

uint32_t parse_hex32(std::istringstream fields, const std::string& where) {
  std::string word;
  fields >> word;
  KVQ_CHECK(word.size() == 8 && word.find_first_not_of("0123456789abcdef") == std::string::npos, where,
            "has '", word, "' where 8 hex digits belong");
  return static_cast<uint32_t>(std::stoul(word, nullptr, 16));
}

}  // namespace

void save_calibration(const Calibration& c, const std::filesystem::path& path) {
  KVQ_CHECK(c.layers.size() == static_cast<size_t>(c.model.n_layers), "a calibration of ", c.layers.size(),
            " layers for a model of ", c.model.n_layers);
  std::ostringstream s;
  s.precision(17);
  s << kMagic << ' ' << kVersion << '\n'
    << "architecture " << c.model.architecture << '\n'
    << "layers " << c.model.n_layers << '\n'
    << "heads " << c.model.n_heads << '\n'
    << "kv_heads " << c.model.n_kv_heads << '\n'
    << "head_dim " << c.model.head_dim << '\n'
    << "model_crc32c " << hex32(c.model.model_crc32c) << '\n'
    << "channel_layout " << c.model.channel_layout << '\n'
    << "budget_bits " << c.budget_bits << '\n'
    << "block_tokens " << c.block_tokens << '\n'
    << "calibration_tokens " << c.calibration_tokens << '\n'
    << "sink_tokens " << c.sink_tokens << '\n'
    << "predicted_kld " << c.predicted_kld << '\n';
  size_t states = 0;
  for (size_t l = 0; l < c.layers.size(); ++l) {
    s << "layer " << l << ' ' << c.layers[l].key << ' ' << c.layers[l].value << ' '
      << (c.layers[l].center_keys ? "centered" : "plain") << '\n';
    states += !c.layers[l].key_state.empty() + !c.layers[l].value_state.empty();
  }
  s << "trained_states " << states << '\n';
  for (size_t l = 0; l < c.layers.size(); ++l)
    for (const auto& [role, state] : {std::pair{"key", &c.layers[l].key_state}, {"value", &c.layers[l].value_state}})
      if (!state->empty())
        s << "state " << l << ' ' << role << ' ' << state->size() << ' ' << hex_bytes(*state) << '\n';
  const std::string body = s.str();
  const std::filesystem::path tmp = path.string() + ".tmp";
  {
    std::ofstream out(tmp, std::ios::binary | std::ios::trunc);
    out << body << "crc32c " << hex32(crc32c(body.data(), body.size())) << '\n';
    KVQ_CHECK(out.good(), "cannot write calibration file ", tmp);
  }
  std::filesystem::rename(tmp, path);
}

Calibration load_calibration(const std::filesystem::path& path) {
  std::error_code ec;
  KVQ_CHECK(std::filesystem::is_regular_file(path, ec), "calibration file ", path, " is not a regular file");
  const uintmax_t size = std::filesystem::file_size(path, ec);
  KVQ_CHECK(!ec && size <= kMaxFileBytes, "calibration file ", path, " is larger than ", kMaxFileBytes, " bytes");
  std::ifstream in(path, std::ios::binary);
  std::string text(static_cast<size_t>(size), '\0');
  in.read(text.data(), static_cast<std::streamsize>(size));
  KVQ_CHECK(in.gcount() == static_cast<std::streamsize>(size), "cannot read calibration file ", path);

  KVQ_CHECK(text.starts_with(std::string(kMagic) + ' '), "", path, " is not a kvq calibration file");
  // The checksum line is the last one; every byte before it is covered.
  const size_t last = text.size() >= 2 ? text.rfind('\n', text.size() - 2) : std::string::npos;
  KVQ_CHECK(text.ends_with('\n') && last != std::string::npos && text.compare(last + 1, 7, "crc32c ") == 0,
            "calibration file ", path, " is truncated (no checksum line at its end)");
  const std::string body = text.substr(0, last + 1);
  const uint32_t stored = parse_hex32(std::istringstream(text.substr(last + 8)), detail::concat(path, " "));
  KVQ_CHECK(stored == crc32c(body.data(), body.size()), "calibration file ", path,
            " is corrupt: its CRC-32C does not match its contents");

  FieldReader r(body, path);
  const int version = r.value<int>(kMagic);
  KVQ_CHECK(version >= kFirstVersion && version <= kVersion, "calibration file ", path, " has format version ",
            version, "; this kvq reads versions ", kFirstVersion, " to ", kVersion);
  Calibration c;
  c.model.architecture = r.value<std::string>("architecture");
  c.model.n_layers = r.count("layers", kMaxLayers);
  c.model.n_heads = r.count("heads", 1 << 16);
  c.model.n_kv_heads = r.count("kv_heads", 1 << 16);
  c.model.head_dim = r.count("head_dim", 1 << 16);
  c.model.model_crc32c = parse_hex32(r.next("model_crc32c"), r.where());
  c.model.channel_layout = r.value<std::string>("channel_layout");
  c.budget_bits = r.value<double>("budget_bits");
  if (version >= 2) {
    c.block_tokens = r.count("block_tokens", 1 << 16);
    c.calibration_tokens = r.value<size_t>("calibration_tokens");
  }
  if (version >= kFirstSinksVersion) {
    c.sink_tokens = r.value<int>("sink_tokens");
    KVQ_CHECK(c.sink_tokens >= 0 && c.sink_tokens <= kMaxSinkTokens, r.where(), "sink_tokens ", c.sink_tokens,
              " is outside [0, ", kMaxSinkTokens, "]");
  }
  c.predicted_kld = r.value<double>("predicted_kld");
  for (int l = 0; l < c.model.n_layers; ++l) {
    std::istringstream fields = r.next("layer");
    int index = -1;
    LayerCodecs codecs;
    fields >> index >> codecs.key >> codecs.value;
    std::string centering = "plain";
    if (version >= kFirstCenteringVersion) fields >> centering;
    const std::string_view form = version >= kFirstCenteringVersion ? " KEY_SPEC VALUE_SPEC plain|centered'"
                                                                    : " KEY_SPEC VALUE_SPEC'";
    KVQ_CHECK(!fields.fail() && index == l && (centering == "plain" || centering == "centered"), r.where(),
              "should be 'layer ", l, form);
    std::string rest;
    KVQ_CHECK(!(fields >> rest), r.where(), "has '", rest, "' after its layer's fields");
    // An unknown codec or one the head dimension does not fit is an error here, not when a cache is built.
    make_codec(codecs.key, {c.model.head_dim, 64, 0, Role::key});
    make_codec(codecs.value, {c.model.head_dim, 64, 0, Role::value});
    codecs.center_keys = centering == "centered";
    KVQ_CHECK(!codecs.center_keys || centering_applies(codecs.key), r.where(), "centers keys of ", codecs.key,
              ", which are stored as they are");
    c.layers.push_back(codecs);
  }
  if (version >= kFirstStatesVersion) {
    const int states = r.value<int>("trained_states");
    KVQ_CHECK(states >= 0 && states <= 2 * c.model.n_layers, r.where(), "trained_states ", states,
              " is outside [0, ", 2 * c.model.n_layers, "] (a key and a value state per layer)");
    int previous = -1;  // 2 layer + role of the previous state: in that order, each once
    for (int i = 0; i < states; ++i) {
      std::istringstream fields = r.next("state");
      int layer = -1;
      std::string role;
      fields >> layer >> role;
      KVQ_CHECK(!fields.fail() && layer >= 0 && layer < c.model.n_layers && (role == "key" || role == "value"),
                r.where(), "should be 'state LAYER key|value BYTES HEX' with LAYER in [0, ", c.model.n_layers, ")");
      const int at = 2 * layer + (role == "value");
      KVQ_CHECK(at > previous, r.where(), "repeats or reorders the states: layer ", layer, "'s ", role,
                " state comes after the previous one's");
      previous = at;
      LayerCodecs& codecs = c.layers[static_cast<size_t>(layer)];
      std::vector<uint8_t>& state = role == "key" ? codecs.key_state : codecs.value_state;
      state = parse_state_bytes(fields, r.where());
      // A state the codec refuses (its size, non-finite numbers) is an error here, not when a cache is built.
      try {
        make_codec(role == "key" ? codecs.key : codecs.value,
                   {c.model.head_dim, 64, 0, role == "key" ? Role::key : Role::value})
            ->load_state(state);
      } catch (const Error& e) {
        throw Error(
            detail::concat(r.where(), "holds a state that layer ", layer, "'s ", role, " codec refuses: ", e.what()));
      }
    }
  }
  KVQ_CHECK(r.at_end(), r.where(), version >= kFirstStatesVersion ? "follows the last state's line"
                                                                  : "follows the last layer's line");
  return c;
}

void check_calibration_model(const Calibration& c, const LlamaModel& model) {
  const ModelIdentity want = model_identity(model);
  const ModelIdentity& got = c.model;
  const auto differs = [&](std::string_view what, const auto& file, const auto& actual) {
    KVQ_CHECK(file == actual, "the calibration is for another model: its ", what, " is ", file, ", the model's ",
              actual);
  };
  differs("architecture", got.architecture, want.architecture);
  differs("layer count", got.n_layers, want.n_layers);
  differs("query head count", got.n_heads, want.n_heads);
  differs("kv head count", got.n_kv_heads, want.n_kv_heads);
  differs("head dimension", got.head_dim, want.head_dim);
  differs("channel layout", got.channel_layout, want.channel_layout);
  differs("model checksum (CRC-32C of its header and metadata)", hex32(got.model_crc32c), hex32(want.model_crc32c));
}

}  // namespace kvq

#include "kvq/codec.hpp"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
#include <sstream>

#include "kvq/error.hpp"

namespace kvq {
namespace {

int parse_int(std::string_view text, std::string_view whole) {
  int v = 0;
  const auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), v);
  KVQ_CHECK(!text.empty() && ec == std::errc{} && ptr == text.data() + text.size(), "codec spec '", whole,
            "': '", text, "' is not an integer");
  return v;
}

void check_finite(const float* x, int n, int d, const char* what, std::string_view codec) {
  for (int t = 0; t < n; ++t)
    for (int c = 0; c < d; ++c) {
      const float v = x[static_cast<size_t>(t) * d + c];
      KVQ_CHECK(std::isfinite(v), codec, ": ", what, " row ", t, " channel ", c, " is ", v,
                " (NaN and Inf are rejected)");
    }
}

// The generic scorer: queries mapped to the codec space, keys decoded there, dot products.
class SpaceScorer final : public Scorer {
 public:
  SpaceScorer(const Codec& codec, const float* q, int n_q)
      : Scorer(n_q, codec.block_tokens()),
        codec_(codec),
        q_(static_cast<size_t>(n_q) * codec.space_dim()),
        keys_(static_cast<size_t>(codec.block_tokens()) * codec.space_dim()) {
    codec.to_space(q, n_q, q_.data());
  }
  void scores(const uint8_t* block, int n, float* out) override {
    const int m = codec_.space_dim();
    codec_.decode_space(block, n, keys_.data());
    for (int i = 0; i < n_queries(); ++i)
      for (int t = 0; t < n; ++t) {
        const float* qi = q_.data() + static_cast<size_t>(i) * m;
        const float* kt = keys_.data() + static_cast<size_t>(t) * m;
        float s = 0;
        for (int j = 0; j < m; ++j) s += qi[j] * kt[j];
        out[static_cast<size_t>(i) * block_tokens() + t] = s;
      }
  }

 private:
  const Codec& codec_;
  std::vector<float> q_, keys_;
};

}  // namespace

CodecSpec CodecSpec::parse(std::string_view text) {
  KVQ_CHECK(!text.empty(), "empty codec spec");
  CodecSpec spec;
  std::string_view head = text.substr(0, text.find(','));
  std::string_view rest = head.size() < text.size() ? text.substr(head.size() + 1) : std::string_view{};
  const auto colon = head.find(':');
  spec.name = std::string(head.substr(0, colon));
  KVQ_CHECK(!spec.name.empty(), "codec spec '", text, "' has no codec name");
  if (colon != std::string_view::npos) {
    std::string_view args = head.substr(colon + 1);
    while (true) {
      const auto slash = args.find('/');
      spec.args.push_back(parse_int(args.substr(0, slash), text));
      if (slash == std::string_view::npos) break;
      args = args.substr(slash + 1);
    }
  }
  while (!rest.empty()) {
    const std::string_view item = rest.substr(0, rest.find(','));
    rest = item.size() < rest.size() ? rest.substr(item.size() + 1) : std::string_view{};
    const auto eq = item.find('=');
    KVQ_CHECK(eq != std::string_view::npos && eq > 0 && eq + 1 < item.size(), "codec spec '", text,
              "': option '", item, "' must look like key=value");
    const bool fresh = spec.options.emplace(std::string(item.substr(0, eq)), std::string(item.substr(eq + 1))).second;
    KVQ_CHECK(fresh, "codec spec '", text, "': option '", item.substr(0, eq), "' given twice");
  }
  return spec;
}

std::string CodecSpec::str() const {
  std::ostringstream s;
  s << name;
  for (size_t i = 0; i < args.size(); ++i) s << (i == 0 ? ':' : '/') << args[i];
  for (const auto& [k, v] : options) s << ',' << k << '=' << v;
  return s.str();
}

std::string CodecSpec::option(std::string_view key, std::string_view fallback) const {
  const auto it = options.find(key);
  return it == options.end() ? std::string(fallback) : it->second;
}

std::string default_rotation(int dim) { return dim > 0 && (dim & (dim - 1)) == 0 ? "hadamard" : "srft"; }

Codec::Codec(CodecSpec spec, const CodecParams& params) : spec_(std::move(spec)), params_(params) {
  KVQ_CHECK(params.dim >= 16 && params.dim <= 512 && params.dim % 16 == 0, spec_.str(), ": head dimension ",
            params.dim, " unsupported (need a multiple of 16 in [16, 512])");
  KVQ_CHECK(params.block_tokens >= 1 && params.block_tokens <= 1024, spec_.str(), ": block of ",
            params.block_tokens, " tokens unsupported (need 1..1024)");
}

void Codec::set_layout(size_t block_bytes, int space_dim) {
  block_bytes_ = block_bytes;
  space_dim_ = space_dim;
}

double Codec::bits_per_element() const {
  return 8.0 * static_cast<double>(block_bytes_) / (static_cast<double>(block_tokens()) * dim());
}

void Codec::train(const float* x, size_t n) {
  KVQ_CHECK(x != nullptr || n == 0, spec_.str(), ": train given a null pointer");
  check_finite(x, static_cast<int>(n), dim(), "training vector", spec_.str());
  train_impl(x, n);
  trained_ = true;
}

void Codec::train_impl(const float*, size_t) {}

void Codec::load_state(const std::vector<uint8_t>& bytes) {
  load_state_impl(bytes);
  trained_ = true;
}

void Codec::load_state_impl(const std::vector<uint8_t>& bytes) {
  KVQ_CHECK(bytes.empty(), spec_.str(), ": has no trained state, but ", bytes.size(), " bytes of state were given");
}

void Codec::encode(const float* x, int n, uint8_t* block) const {
  KVQ_CHECK(n >= 0 && n <= block_tokens(), spec_.str(), ": encode of ", n, " tokens into a block of ",
            block_tokens());
  KVQ_CHECK(block != nullptr && (x != nullptr || n == 0), spec_.str(), ": encode given a null pointer");
  KVQ_CHECK(trained(), spec_.str(), ": train() must be called before encode");
  check_finite(x, n, dim(), "input token", spec_.str());
  encode_block(x, n, block);
}

void Codec::decode(const uint8_t* block, int n, float* x) const {
  std::vector<float> y(static_cast<size_t>(std::max(n, 0)) * space_dim());
  decode_space(block, n, y.data());
  from_space(y.data(), n, x);
}

void Codec::decode_space(const uint8_t* block, int n, float* y) const {
  KVQ_CHECK(n >= 0 && n <= block_tokens(), spec_.str(), ": decode of ", n, " tokens from a block of ",
            block_tokens());
  KVQ_CHECK(block != nullptr && (y != nullptr || n == 0), spec_.str(), ": decode given a null pointer");
  KVQ_CHECK(trained(), spec_.str(), ": train() must be called before decode");
  decode_block_space(block, n, y);
}

void Codec::to_space(const float* q, int n_q, float* y) const {
  KVQ_CHECK(n_q >= 0 && (q != nullptr || n_q == 0), spec_.str(), ": to_space given bad arguments");
  map_to_space(q, n_q, y);
}

void Codec::from_space(const float* y, int n_q, float* x) const {
  KVQ_CHECK(n_q >= 0 && (y != nullptr || n_q == 0), spec_.str(), ": from_space given bad arguments");
  map_from_space(y, n_q, x);
}

void Codec::map_to_space(const float* q, int n_q, float* y) const {
  if (rotation_) {
    rotation_->apply(q, y, static_cast<size_t>(n_q));
  } else if (q != y) {
    std::memcpy(y, q, static_cast<size_t>(n_q) * dim() * sizeof(float));
  }
}

void Codec::map_from_space(const float* y, int n_q, float* x) const {
  if (rotation_) {
    rotation_->apply_inverse(y, x, static_cast<size_t>(n_q));
  } else if (x != y) {
    std::memcpy(x, y, static_cast<size_t>(n_q) * dim() * sizeof(float));
  }
}

std::unique_ptr<Scorer> Codec::prepare(const float* q, int n_q) const {
  KVQ_CHECK(n_q >= 1 && q != nullptr, spec_.str(), ": prepare needs at least one query");
  KVQ_CHECK(trained(), spec_.str(), ": train() must be called before prepare");
  check_finite(q, n_q, dim(), "query", spec_.str());
  return make_scorer(q, n_q);
}

std::unique_ptr<Scorer> Codec::make_scorer(const float* q, int n_q) const {
  return std::make_unique<SpaceScorer>(*this, q, n_q);
}

void Codec::accumulate(const float* w, int n_q, const uint8_t* block, int n, float* acc) const {
  KVQ_CHECK(n >= 0 && n <= block_tokens(), spec_.str(), ": accumulate over ", n, " tokens of a block of ",
            block_tokens());
  KVQ_CHECK(n_q >= 1 && w != nullptr && block != nullptr && acc != nullptr, spec_.str(),
            ": accumulate given bad arguments");
  KVQ_CHECK(trained(), spec_.str(), ": train() must be called before accumulate");
  accumulate_block(w, n_q, block, n, acc);
}

void Codec::accumulate_block(const float* w, int n_q, const uint8_t* block, int n, float* acc) const {
  const int m = space_dim(), T = block_tokens();
  // Decoded tokens in per-thread scratch: attention calls this once per page, which must not allocate.
  thread_local std::vector<float> y;
  y.resize(std::max(y.size(), static_cast<size_t>(n) * m));
  decode_block_space(block, n, y.data());
  for (int i = 0; i < n_q; ++i)
    for (int t = 0; t < n; ++t) {
      const float wt = w[static_cast<size_t>(i) * T + t];
      const float* yt = y.data() + static_cast<size_t>(t) * m;
      float* ai = acc + static_cast<size_t>(i) * m;
      for (int j = 0; j < m; ++j) ai[j] += wt * yt[j];
    }
}

}  // namespace kvq

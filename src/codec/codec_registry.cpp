// The table of codec families: make_codec, codec_names and the registry-driven tests all read it.
#include <array>

#include "codec/codec_factories.hpp"
#include "kvq/detail/random.hpp"
#include "kvq/error.hpp"

namespace kvq {
namespace {

struct Entry {
  const char* name;
  CodecFactory factory;
  const char* test_specs;  // space-separated specs that tests and benchmarks sweep
};

constexpr std::array kRegistry{
    Entry{"f32", make_float_codec, "f32"},
    Entry{"f16", make_float_codec, "f16"},
    Entry{"bf16", make_float_codec, "bf16"},
    Entry{"int8", make_int_group_codec, "int8 int8:16"},
    Entry{"int4", make_int_group_codec, "int4 int4:16"},
    Entry{"kivi", make_kivi_codec, "kivi:2 kivi:4"},
    Entry{"turbo_mse", make_turbo_mse_codec, "turbo_mse:1 turbo_mse:2 turbo_mse:3 turbo_mse:4"},
    Entry{"turbo_prod", make_turbo_prod_codec, "turbo_prod:2 turbo_prod:3 turbo_prod:4"},
    // qjl with its default m = d rows decodes with relative error pi/2 - 1/d (it is an inner-product sketch, not a
    // reconstruction), above the contract's coarse 1.5; qjl:256 (0.39-0.78 at d = 64-128) keeps the contract and
    // turbo_codecs_test covers m = d.
    Entry{"qjl", make_qjl_codec, "qjl:256"},
    Entry{"turbo_rvq", make_turbo_rvq_codec, "turbo_rvq:1 turbo_rvq:2"},
    Entry{"vecinfer", make_vecinfer_codec, "vecinfer:8/4 vecinfer:10/8 vecinfer:8/4,norm=1"},
};

}  // namespace

void check_spec_shape(const CodecSpec& spec, size_t max_args, std::string_view allowed) {
  KVQ_CHECK(spec.args.size() <= max_args, "codec '", spec.str(), "' takes at most ", max_args, " argument(s)");
  for (const auto& [key, value] : spec.options) {
    bool ok = false;
    std::string_view rest = allowed;
    while (!rest.empty() && !ok) {
      const std::string_view item = rest.substr(0, rest.find(','));
      ok = item == key;
      rest = item.size() < rest.size() ? rest.substr(item.size() + 1) : std::string_view{};
    }
    KVQ_CHECK(ok, "codec '", spec.str(), "': unknown option '", key, "'",
              allowed.empty() ? std::string(" (it takes none)") : detail::concat(" (allowed: ", allowed, ")"));
  }
}

std::unique_ptr<Rotation> rotation_from_spec(const CodecSpec& spec, const CodecParams& params,
                                             std::string_view fallback) {
  const std::string name = spec.option("rot", fallback.empty() ? default_rotation(params.dim) : fallback);
  return make_rotation(name, params.dim, derive_seed(params.seed, 1));
}

std::unique_ptr<Codec> make_codec(std::string_view text, const CodecParams& params) {
  const CodecSpec spec = CodecSpec::parse(text);
  for (const Entry& e : kRegistry)
    if (spec.name == e.name) return e.factory(spec, params);
  std::string known;
  for (const Entry& e : kRegistry) known += (known.empty() ? "" : ", ") + std::string(e.name);
  throw Error(detail::concat("unknown codec '", spec.name, "' (known: ", known, ")"));
}

std::vector<std::string> codec_names() {
  std::vector<std::string> names;
  for (const Entry& e : kRegistry) names.emplace_back(e.name);
  return names;
}

std::vector<std::string> codec_test_specs() {
  std::vector<std::string> specs;
  for (const Entry& e : kRegistry) {
    std::string_view rest = e.test_specs;
    while (!rest.empty()) {
      const std::string_view item = rest.substr(0, rest.find(' '));
      specs.emplace_back(item);
      rest = item.size() < rest.size() ? rest.substr(item.size() + 1) : std::string_view{};
    }
  }
  return specs;
}

}  // namespace kvq

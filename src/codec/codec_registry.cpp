// The table of codec families: make_codec and codec_names read it.
#include <array>

#include "codec/codec_factories.hpp"
#include "kvq/detail/random.hpp"
#include "kvq/error.hpp"

namespace kvq {
namespace {

struct Entry {
  const char* name;
  CodecFactory factory;
};

constexpr std::array kRegistry{
    Entry{"f32", make_float_codec},
    Entry{"f16", make_float_codec},
    Entry{"bf16", make_float_codec},
    Entry{"int8", make_int_group_codec},
    Entry{"int4", make_int_group_codec},
    Entry{"kivi", make_kivi_codec},
    Entry{"turbo_mse", make_turbo_mse_codec},
    Entry{"turbo_prod", make_turbo_prod_codec},
    Entry{"qjl", make_qjl_codec},
    Entry{"turbo_rvq", make_turbo_rvq_codec},
    Entry{"vecinfer", make_vecinfer_codec},
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

}  // namespace kvq

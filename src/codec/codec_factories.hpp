// One factory per codec family, each defined in the codec's own file and listed in codec_registry.cpp.
#pragma once

#include <memory>

#include "kvq/codec.hpp"

namespace kvq {

using CodecFactory = std::unique_ptr<Codec> (*)(const CodecSpec&, const CodecParams&);

std::unique_ptr<Codec> make_float_codec(const CodecSpec& spec, const CodecParams& params);  // f32, f16, bf16
std::unique_ptr<Codec> make_int_group_codec(const CodecSpec& spec, const CodecParams& params);   // int8, int4
std::unique_ptr<Codec> make_kivi_codec(const CodecSpec& spec, const CodecParams& params);        // kivi
std::unique_ptr<Codec> make_turbo_mse_codec(const CodecSpec& spec, const CodecParams& params);   // turbo_mse:b
std::unique_ptr<Codec> make_turbo_prod_codec(const CodecSpec& spec, const CodecParams& params);  // turbo_prod:b
std::unique_ptr<Codec> make_qjl_codec(const CodecSpec& spec, const CodecParams& params);         // qjl[:m]
std::unique_ptr<Codec> make_turbo_rvq_codec(const CodecSpec& spec, const CodecParams& params);   // turbo_rvq:b
std::unique_ptr<Codec> make_vecinfer_codec(const CodecSpec& spec, const CodecParams& params);    // vecinfer:c/s

/// Throws unless the spec has at most `max_args` arguments and only the options listed in `allowed`
/// (a comma-separated list, e.g. "rot,g").
void check_spec_shape(const CodecSpec& spec, size_t max_args, std::string_view allowed);
/// The rotation named by the spec's "rot" option, or `fallback` (default_rotation(d) when empty).
std::unique_ptr<Rotation> rotation_from_spec(const CodecSpec& spec, const CodecParams& params,
                                             std::string_view fallback = {});

}  // namespace kvq

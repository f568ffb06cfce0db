// The measurements of the command-line program as functions returning dicts: kvq.distortion (`kvq distortion`,
// distortion.hpp; the same keys as its --json) and kvq.attention_error (`kvq attention-error`, attention_error.hpp).
#include <nanobind/stl/string.h>

#include <string>

#include "bindings.hpp"
#include "kvq/detail/attention_error.hpp"
#include "kvq/detail/distortion.hpp"

namespace kvq::python {
namespace {

namespace nb = nanobind;

nb::dict distortion(const std::string& codec, int dim, size_t n, uint64_t seed, int block_tokens,
                    const std::string& role) {
  DistortionOptions o;
  o.codec = codec;
  o.dim = dim;
  o.n = n;
  o.seed = seed;
  o.block_tokens = block_tokens;
  o.role = parse_role(role);
  DistortionResult r;
  {
    nb::gil_scoped_release release;
    r = measure_distortion(o);
  }
  nb::dict d;
  d["codec"] = r.codec;
  d["dim"] = r.dim;
  d["n"] = r.n;
  d["bits_per_element"] = r.bits_per_element;
  d["mse"] = r.mse;
  d["ip_bias"] = r.ip_bias;
  d["ip_bias_stderr"] = r.ip_bias_stderr;
  d["ip_mse_d"] = r.ip_mse_d;
  return d;
}

nb::dict attention_error(const std::string& key_codec, const std::string& value_codec, int dim, int ctx, int q_heads,
                         int kv_heads, int queries, double logit_std, uint64_t seed) {
  const AttentionErrorOptions o{key_codec, value_codec, dim, ctx, q_heads, kv_heads, queries, logit_std, seed};
  AttentionErrorResult r;
  {
    nb::gil_scoped_release release;
    r = measure_attention_error(o);
  }
  nb::dict d;
  d["key_codec"] = r.key_codec;
  d["value_codec"] = r.value_codec;
  d["bits_k"] = r.bits_k;
  d["bits_v"] = r.bits_v;
  d["rel_err_mean"] = r.rel_err_mean;
  d["rel_err_max"] = r.rel_err_max;
  d["weights_tv"] = r.weights_tv;
  return d;
}

}  // namespace

void bind_measurements(nb::module_& m) {
  m.def("distortion", &distortion, nb::arg("codec"), nb::arg("dim") = 128, nb::arg("n") = 10000, nb::arg("seed") = 0,
        nb::arg("block_tokens") = 64, nb::arg("role") = "key",
        "Distortion of a codec on n random unit vectors (`kvq distortion`): a dict of codec, dim, n, "
        "bits_per_element, mse (mean squared reconstruction error), ip_bias, ip_bias_stderr and ip_mse_d (the "
        "inner-product estimate's bias, its standard error, and d times its mean squared error).");
  m.def("attention_error", &attention_error, nb::arg("key_codec") = "int4", nb::arg("value_codec") = "int4",
        nb::arg("dim") = 128, nb::arg("ctx") = 4096, nb::arg("q_heads") = 4, nb::arg("kv_heads") = 1,
        nb::arg("queries") = 16, nb::arg("logit_std") = 2.5, nb::arg("seed") = 0,
        "Decode attention over a cache of ctx tokens compressed with the codec pair against fp32 attention over "
        "the original tokens, on key-like data with outlier channels (`kvq attention-error`): a dict of "
        "key_codec, value_codec, bits_k, bits_v, rel_err_mean, rel_err_max (|o - o_ref| / |o_ref| over heads and "
        "calls) and weights_tv (total variation between the softmax weights).");
}

}  // namespace kvq::python

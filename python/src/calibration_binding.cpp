// kvq.load_calibration and kvq.Calibration: a file written by `kvq calibrate` (kvq/detail/calibration.hpp), read
// and checked by the library's reader, as a read-only object: the model it was made for, its budget and page size,
// and per layer the key and value codec, key centering and trained codec states (kvq.LayerCodecs).
#include <nanobind/stl/filesystem.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <filesystem>
#include <string>
#include <vector>

#include "bindings.hpp"
#include "kvq/detail/calibration.hpp"

namespace kvq::python {
namespace {

namespace nb = nanobind;

nb::bytes as_bytes(const std::vector<uint8_t>& state) { return nb::bytes(state.data(), state.size()); }

std::string layer_repr(const LayerCodecs& c) {
  return "kvq.LayerCodecs('" + c.key + "', '" + c.value + "'" + (c.center_keys ? ", centered" : "") +
         (c.key_state.empty() && c.value_state.empty() ? "" : ", trained") + ")";
}

}  // namespace

void bind_calibration(nb::module_& m) {
  nb::class_<LayerCodecs>(m, "LayerCodecs",
                          "One layer of a calibration: its key and value codec specs, whether its keys are centered "
                          "and the trained states its codecs start from (read-only).")
      .def_ro("key_codec", &LayerCodecs::key)
      .def_ro("value_codec", &LayerCodecs::value)
      .def_ro("center_keys", &LayerCodecs::center_keys,
              "Keys stored minus their first page's mean (KVCache's center_keys).")
      .def_prop_ro("key_state", [](const LayerCodecs& c) { return as_bytes(c.key_state); },
                   "Codec.state() the key codec starts from (a codec seeded as this layer's of a cache of seed 0); "
                   "empty: none.")
      .def_prop_ro("value_state", [](const LayerCodecs& c) { return as_bytes(c.value_state); },
                   "The value codec's, as key_state.")
      .def("__repr__", &layer_repr);
  nb::class_<Calibration>(m, "Calibration",
                          "A calibration file's contents (kvq calibrate; kvq.load_calibration), read-only: the "
                          "model it was made for, its budget, and per layer the codecs (layers).")
      .def_prop_ro("architecture", [](const Calibration& c) { return c.model.architecture; },
                   "The GGUF's general.architecture (llama, qwen2, gemma3), or llama2.c.")
      .def_prop_ro("n_layers", [](const Calibration& c) { return c.model.n_layers; })
      .def_prop_ro("n_heads", [](const Calibration& c) { return c.model.n_heads; }, "Query heads.")
      .def_prop_ro("n_kv_heads", [](const Calibration& c) { return c.model.n_kv_heads; })
      .def_prop_ro("head_dim", [](const Calibration& c) { return c.model.head_dim; })
      .def_prop_ro("model_crc32c", [](const Calibration& c) { return c.model.model_crc32c; },
                   "CRC-32C of the model file's description of itself (the GGUF's header, metadata and tensor infos).")
      .def_prop_ro("channel_layout", [](const Calibration& c) { return c.model.channel_layout; },
                   "The key channel order the codecs were measured and trained on: 'rope_adjacent_pairs' (RoPE pairs "
                   "(2i, 2i+1), GGUF llama) or 'rope_halves' (i, i + head_dim/2).")
      .def_ro("budget_bits", &Calibration::budget_bits, "The average stored bits per element asked for.")
      .def_ro("block_tokens", &Calibration::block_tokens, "Tokens per page the budget's block bytes assume.")
      .def_ro("calibration_tokens", &Calibration::calibration_tokens, "Positions scored (0: unknown).")
      .def_ro("sink_tokens", &Calibration::sink_tokens, "Sink tokens kept in f16 the codecs were chosen with.")
      .def_ro("predicted_kld", &Calibration::predicted_kld,
              "The sum of the chosen codecs' single-layer KL divergences.")
      .def_ro("layers", &Calibration::layers, "kvq.LayerCodecs per layer, in order.")
      .def("__repr__", [](const Calibration& c) {
        return "kvq.Calibration(architecture='" + c.model.architecture + "', n_layers=" +
               std::to_string(c.model.n_layers) + ", budget_bits=" + std::to_string(c.budget_bits) + ")";
      });
  m.def(
      "load_calibration", [](const std::filesystem::path& path) { return load_calibration(path); }, nb::arg("path"),
      "Reads and checks a calibration file written by `kvq calibrate`; kvq.Error naming what is wrong (not a "
      "regular file, another format or a newer version, a checksum mismatch, a field out of range, an unknown codec "
      "spec, a trained state its codec refuses).");
}

}  // namespace kvq::python

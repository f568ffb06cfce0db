// kvq.Codec: one codec (codec.hpp) encoding token vectors into blocks of bytes and back. encode takes any number
// of tokens and returns one row of block_bytes per block of block_tokens tokens, the last one zero-padded.
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "arrays.hpp"
#include "bindings.hpp"
#include "kvq/error.hpp"
#include "without_gil.hpp"

namespace kvq::python {
namespace {

namespace nb = nanobind;

struct PyCodec {
  std::unique_ptr<Codec> codec;
  std::mutex mutex;
};

size_t blocks_for(size_t n, const Codec& c) {
  const size_t T = static_cast<size_t>(c.block_tokens());
  return (n + T - 1) / T;
}

nb::ndarray<nb::numpy, uint8_t> encode(PyCodec& self, const InputArray& x) {
  const Codec& c = *self.codec;
  const size_t d = static_cast<size_t>(c.dim()), T = static_cast<size_t>(c.block_tokens());
  const float* data = float_input(x, "x", {{"n"}, {"dim", d}});
  const size_t n = x.shape(0);
  auto blocks = output_memory<uint8_t>(blocks_for(n, c) * c.block_bytes());
  without_gil(self.mutex, [&] {
    for (size_t b = 0; b * T < n; ++b)
      c.encode(data + b * T * d, static_cast<int>(std::min(T, n - b * T)), blocks.get() + b * c.block_bytes());
  });
  return numpy_array(std::move(blocks), {blocks_for(n, c), c.block_bytes()});
}

nb::ndarray<nb::numpy, float> decode(PyCodec& self, const InputArray& blocks, size_t n) {
  const Codec& c = *self.codec;
  const size_t d = static_cast<size_t>(c.dim()), T = static_cast<size_t>(c.block_tokens());
  check_kind(blocks, "blocks", nb::dtype<uint8_t>(), "uint8");
  const size_t have = blocks.nbytes() / c.block_bytes();
  KVQ_CHECK(blocks.nbytes() % c.block_bytes() == 0, "blocks: ", blocks.nbytes(), " bytes, not whole blocks of ",
            c.block_bytes(), " bytes");
  KVQ_CHECK(n <= have * T, "blocks: ", n, " tokens need ", blocks_for(n, c), " blocks of ", c.block_tokens(),
            " tokens, given ", have);
  const auto* bytes = static_cast<const uint8_t*>(blocks.data());
  auto x = output_memory<float>(n * d);
  without_gil(self.mutex, [&] {
    for (size_t b = 0; b * T < n; ++b)
      c.decode(bytes + b * c.block_bytes(), static_cast<int>(std::min(T, n - b * T)), x.get() + b * T * d);
  });
  return numpy_array(std::move(x), {n, d});
}

void train(PyCodec& self, const InputArray& x) {
  const float* data = float_input(x, "x", {{"n"}, {"dim", static_cast<size_t>(self.codec->dim())}});
  without_gil(self.mutex, [&] { self.codec->train(data, x.shape(0)); });
}

nb::bytes state(PyCodec& self) {
  const std::vector<uint8_t> s = without_gil(self.mutex, [&] { return self.codec->state(); });
  return nb::bytes(s.data(), s.size());
}

void load_state(PyCodec& self, const nb::bytes& bytes) {
  const auto* p = static_cast<const uint8_t*>(bytes.data());
  const std::vector<uint8_t> s(p, p + bytes.size());
  without_gil(self.mutex, [&] { self.codec->load_state(s); });
}

}  // namespace

Role parse_role(const std::string& role) {
  KVQ_CHECK(role == "key" || role == "value", "role must be 'key' or 'value', got '", role, "'");
  return role == "key" ? Role::key : Role::value;
}

void bind_codec(nb::module_& m) {
  nb::class_<PyCodec>(m, "Codec",
                      "A KV-cache codec: encodes blocks of block_tokens token vectors of dimension dim into "
                      "block_bytes bytes each (codec.hpp).")
      .def(
          "__init__",
          [](PyCodec* self, const std::string& spec, int dim, uint64_t seed, int block_tokens,
             const std::string& role) {
            new (self) PyCodec{make_codec(spec, CodecParams{dim, block_tokens, seed, parse_role(role)}), {}};
          },
          nb::arg("spec"), nb::arg("dim"), nb::arg("seed") = 0, nb::arg("block_tokens") = 64,
          nb::arg("role") = "key",
          "spec: e.g. 'int4', 'turbo_mse:3', 'vecinfer:10/4' (kvq.codec_names() lists the families); dim: a "
          "multiple of 16 in [16, 512]; seed: rotations, sketches and trainers; role: 'key' or 'value'.")
      .def("encode", &encode, nb::arg("x"),
           "x: float32 [n, dim]. Returns uint8 [ceil(n / block_tokens), block_bytes]: one encoded block per row, "
           "the tokens of the last block beyond n encoded as zeros.")
      .def("decode", &decode, nb::arg("blocks"), nb::arg("n"),
           "The first n tokens of encoded blocks (uint8, C-contiguous, whole blocks, e.g. what encode returned) "
           "as float32 [n, dim].")
      .def("train", &train, nb::arg("x"),
           "Fits the codec's state (codebooks, scales) to float32 [n, dim] examples; a no-op for codecs "
           "without one.")
      .def("state", &state, "The trained state as bytes (empty if none), for load_state.")
      .def("load_state", &load_state, nb::arg("state"),
           "Restores a state from state() of a codec with the same spec, dim, seed and block_tokens.")
      .def_prop_ro("spec", [](PyCodec& self) { return self.codec->spec().str(); }, "The spec in canonical form.")
      .def_prop_ro("dim", [](PyCodec& self) { return self.codec->dim(); })
      .def_prop_ro("block_tokens", [](PyCodec& self) { return self.codec->block_tokens(); })
      .def_prop_ro("role", [](PyCodec& self) { return self.codec->role() == Role::key ? "key" : "value"; })
      .def_prop_ro("block_bytes", [](PyCodec& self) { return self.codec->block_bytes(); },
                   "Bytes of one encoded block: codes, scales, norms.")
      .def_prop_ro("bits_per_element", [](PyCodec& self) { return self.codec->bits_per_element(); },
                   "8 * block_bytes / (block_tokens * dim).")
      .def_prop_ro("space_dim", [](PyCodec& self) { return self.codec->space_dim(); },
                   "Dimension of the codec's space (dim, or a sketch's rows).")
      .def_prop_ro("needs_training", [](PyCodec& self) { return self.codec->needs_training(); })
      .def_prop_ro(
          "trained", [](PyCodec& self) { return without_gil(self.mutex, [&] { return self.codec->trained(); }); },
          "Whether encode may run: trained, or needing no training.")
      .def("__repr__", [](PyCodec& self) {
        return "kvq.Codec('" + self.codec->spec().str() + "', dim=" + std::to_string(self.codec->dim()) + ")";
      });
  m.def("codec_names", &codec_names, "The registered codec families ('f16', 'int4', 'turbo_mse', ...).");
}

}  // namespace kvq::python

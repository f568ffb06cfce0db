// kvq.KVCache's methods for a cache on a CUDA device only (cuda.hpp), on arrays in that device's memory (torch CUDA
// tensors through DLPack, read and written in place): append_batch and decode_step, with kvq.DecodeStep. What a
// call runs on when the caller names no stream is Python's policy: kvq/_device.py. Builds without the CUDA backend
// bind the same methods; the library's stand-in makes every CUDA cache's constructor raise kvq.Error naming the
// reason.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "arrays.hpp"
#include "bindings.hpp"
#include "cache_objects.hpp"
#include "kvq/attention.hpp"
#include "kvq/cuda.hpp"
#include "kvq/error.hpp"
#include "without_gil.hpp"

namespace kvq::python {

namespace {

namespace nb = nanobind;

// A CUDA-only call on a CPU cache: kvq.Error before any argument is read, so that the message names the cause.
void check_cuda(const PyKVCache& self, const char* what) {
  KVQ_CHECK(self.cache.device().is_cuda(), what, ": a cpu cache; this runs on a CUDA cache (KVCache(..., "
            "device='cuda') or to('cuda'))");
}

void append_batch(PyKVCache& self, const std::vector<SeqId>& seqs, int layer, const InputArray& keys,
                  const InputArray& values, const std::vector<size_t>& n_tokens, const nb::object& stream) {
  check_cuda(self, "append_batch");
  const CacheConfig& c = self.cache.config();
  const size_t H = static_cast<size_t>(c.n_kv_heads), d = static_cast<size_t>(c.head_dim);
  size_t total = 0;
  for (const size_t n : n_tokens) {
    KVQ_CHECK(n <= SIZE_MAX - total, "n_tokens: the counts add up beyond ", SIZE_MAX);
    total += n;
  }
  const int place = place_of(self.cache);
  const float* k = float_input(keys, "keys", {{"sum(n_tokens)", total}, {"n_kv_heads", H}, {"head_dim", d}}, place);
  const float* v =
      float_input(values, "values", {{"sum(n_tokens)", total}, {"n_kv_heads", H}, {"head_dim", d}}, place);
  void* s = stream_of(self, stream);
  without_gil(self.mutex, [&] { self.cache.append_device_batch(seqs, layer, k, v, n_tokens, s); });
}

// A DecodeStep of the cache (cuda.hpp), holding the cache alive and taking turns on its lock.
struct PyDecodeStep {
  cuda::DecodeStep step;
  PyKVCache* owner;
  size_t batch, n_q_heads;
};

PyDecodeStep* make_decode_step(PyKVCache& self, const std::vector<SeqId>& seqs, const std::vector<int>& layers,
                               int n_q_heads, const std::vector<std::optional<float>>& scales,
                               const std::vector<size_t>& windows, size_t max_tokens) {
  check_cuda(self, "decode_step");
  KVQ_CHECK(scales.size() == layers.size() && windows.size() == layers.size(), "decode_step: ", layers.size(),
            " layers but ", scales.size(), " scales and ", windows.size(), " windows");
  std::vector<AttentionOptions> options(layers.size());
  for (size_t i = 0; i < layers.size(); ++i) {
    options[i].scale = scales[i].value_or(0.0f);
    options[i].window = windows[i];
  }
  return without_gil(self.mutex, [&] {
    return new PyDecodeStep{cuda::DecodeStep(self.cache, seqs, layers, n_q_heads, options, max_tokens), &self,
                            seqs.size(), static_cast<size_t>(n_q_heads)};
  });
}

void run_decode_step(PyDecodeStep& self, int layer, const InputArray& keys, const InputArray& values,
                     const InputArray& q, OutputArray& out, const nb::object& stream) {
  const KVCache& cache = self.owner->cache;
  const int device = place_of(cache);
  const size_t H = static_cast<size_t>(cache.config().n_kv_heads), d = static_cast<size_t>(cache.config().head_dim);
  const float* k = float_input(keys, "keys", {{"batch", self.batch}, {"n_kv_heads", H}, {"head_dim", d}}, device);
  const float* v = float_input(values, "values", {{"batch", self.batch}, {"n_kv_heads", H}, {"head_dim", d}}, device);
  const float* qp = float_input(q, "q", {{"batch", self.batch}, {"n_q_heads", self.n_q_heads}, {"head_dim", d}}, device);
  float* op = float_output(out, "out", {{"batch", self.batch}, {"n_q_heads", self.n_q_heads}, {"head_dim", d}}, device);
  check_disjoint(qp, op, q.size());
  void* s = stream_of(*self.owner, stream);
  without_gil(self.owner->mutex, [&] { self.step.run(layer, k, v, qp, op, s); });
}

}  // namespace

void bind_device_cache(nb::module_& m, nb::class_<PyKVCache>& cls) {
  cls.def("append_batch", &append_batch, nb::arg("seqs"), nb::arg("layer"), nb::arg("keys"), nb::arg("values"),
          nb::arg("n_tokens"), nb::arg("stream") = nb::none(),
          "A CUDA cache: appends n_tokens[i] tokens to each sequence seqs[i] of one layer in one set of launches (a "
          "decode step: one token each): keys and values float32 [sum(n_tokens), n_kv_heads, head_dim] on the "
          "cache's device, the chunks in the order of seqs, queued on `stream` (as append's). On any error no "
          "sequence is modified.");
  cls.def("decode_step", &make_decode_step, nb::arg("seqs"), nb::arg("layers"), nb::arg("n_q_heads"), nb::kw_only(),
          nb::arg("scales"), nb::arg("windows"), nb::arg("max_tokens"), nb::keep_alive<0, 1>(),
          nb::rv_policy::take_ownership,
          "A CUDA cache: decode steps of the batch `seqs` over `layers` whose launches keep one shape, for CUDA "
          "graphs (torch.cuda.graph): each step appends one token per sequence to each layer and attends there, as "
          "append_batch then decode_attention would. scales, windows: per layer (None: 1 / sqrt(head_dim); 0: no "
          "window); max_tokens: the longest a sequence may grow. Per step: prepare(), then run() once per layer "
          "(the runs may be a captured graph's replay).");
  nb::class_<PyDecodeStep>(m, "DecodeStep",
                           "Decode steps of a fixed batch whose launches a CUDA graph can capture and replay "
                           "(KVCache.decode_step).")
      .def(
          "prepare",
          [](PyDecodeStep& self, const nb::object& stream) {
            void* s = stream_of(*self.owner, stream);
            without_gil(self.owner->mutex, [&] { self.step.prepare(s); });
          },
          nb::arg("stream") = nb::none(),
          "Takes the next step's pages, records it in the cache and uploads its tables on `stream` (as append's). "
          "Raises kvq.Error, changing nothing, where the pool is full or a sequence would pass max_tokens, and for "
          "a NaN, Inf or unstorable value a step before last appended (the sequences then hold it).")
      .def("run", &run_decode_step, nb::arg("layer"), nb::arg("keys"), nb::arg("values"), nb::arg("q"),
           nb::arg("out"), nb::arg("stream") = nb::none(),
           "Layer `layer`'s part of the prepared step, launched on `stream` without waiting: keys, values float32 "
           "[batch, n_kv_heads, head_dim], q and out float32 [batch, n_q_heads, head_dim], on the cache's device.")
      .def(
          "check",
          [](PyDecodeStep& self, const nb::object& stream) {
            void* s = stream_of(*self.owner, stream);
            without_gil(self.owner->mutex, [&] { self.step.check(s); });
          },
          nb::arg("stream") = nb::none(), "Waits for `stream`; raises kvq.Error for a value any step so far found.")
      .def_prop_ro("steps", [](PyDecodeStep& self) { return self.step.steps(); }, "Steps prepared so far.");
  m.def(
      "cuda_available", [] { return cuda::device_count() > 0; },
      "Whether a KVCache can live on a CUDA device here: this build has the CUDA backend and the machine a device.");
  m.def("cuda_unavailable_reason", &cuda::unavailable_reason,
        "Why no CUDA device can be used ('' when one can): a build without the CUDA backend, the driver's error, "
        "or no device.");
}

}  // namespace kvq::python

// kvq.DeviceKVCache: the compressed KV cache on a CUDA device (cuda.hpp) and its fused decode attention, on
// arrays in that device's memory (torch CUDA tensors through DLPack, read and written in place). What a call runs
// on when the caller names no stream, and the tensor decode_attention writes when it gets no out=, are Python's
// policy: kvq/_device.py. Builds without the CUDA backend bind the same class; the library's stand-in makes every
// constructor raise kvq.Error naming the reason.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/vector.h>

#include <climits>
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

PyDeviceKVCache* to_device(PyKVCache& host, int device, size_t capacity_pages) {
  return without_gil(host.mutex, [&] {
    return new PyDeviceKVCache{cuda::DeviceKVCache(host.cache, capacity_pages, device), {}};
  });
}

namespace {

namespace nb = nanobind;

nb::object device_policy(const char* name) { return nb::module_::import_("kvq._device").attr(name); }

// The cudaStream_t a call on the cache's device runs on (kvq/_device.py: stream_handle).
void* stream_of(const PyDeviceKVCache& self, const nb::object& stream) {
  const nb::object handle = device_policy("stream_handle")(stream, self.cache.device());
  return reinterpret_cast<void*>(nb::cast<uintptr_t>(handle));
}

// Tokens come from the cache's device (appended there) or from CPU memory (uploaded first): keys decide, values
// must lie with them.
int tokens_place(const PyDeviceKVCache& self, const InputArray& keys) {
  return keys.device_type() == nb::device::cuda::value ? self.cache.device() : kCpu;
}

void append(PyDeviceKVCache& self, SeqId seq, int layer, const InputArray& keys, const InputArray& values,
            const nb::object& stream) {
  const CacheConfig& c = self.cache.config();
  const size_t H = static_cast<size_t>(c.n_kv_heads), d = static_cast<size_t>(c.head_dim);
  const int place = tokens_place(self, keys);
  const float* k = float_input(keys, "keys", {{"n"}, {"n_kv_heads", H}, {"head_dim", d}}, place);
  const float* v = float_input(values, "values", {{"n", keys.shape(0)}, {"n_kv_heads", H}, {"head_dim", d}}, place);
  const size_t n = keys.shape(0);
  if (place == kCpu) {
    without_gil(self.mutex, [&] { self.cache.append(seq, layer, k, v, n); });
    return;
  }
  void* s = stream_of(self, stream);
  without_gil(self.mutex, [&] { self.cache.append_device(seq, layer, k, v, n, s); });
}

void append_batch(PyDeviceKVCache& self, const std::vector<SeqId>& seqs, int layer, const InputArray& keys,
                  const InputArray& values, const std::vector<size_t>& n_tokens, const nb::object& stream) {
  const CacheConfig& c = self.cache.config();
  const size_t H = static_cast<size_t>(c.n_kv_heads), d = static_cast<size_t>(c.head_dim);
  size_t total = 0;
  for (const size_t n : n_tokens) {
    KVQ_CHECK(n <= SIZE_MAX - total, "n_tokens: the counts add up beyond ", SIZE_MAX);
    total += n;
  }
  const int place = self.cache.device();
  const float* k = float_input(keys, "keys", {{"sum(n_tokens)", total}, {"n_kv_heads", H}, {"head_dim", d}}, place);
  const float* v =
      float_input(values, "values", {{"sum(n_tokens)", total}, {"n_kv_heads", H}, {"head_dim", d}}, place);
  void* s = stream_of(self, stream);
  without_gil(self.mutex, [&] { self.cache.append_device_batch(seqs, layer, k, v, n_tokens, s); });
}

nb::object decode_attention(PyDeviceKVCache& self, int layer, const std::vector<SeqId>& seqs, const InputArray& q,
                            std::optional<float> scale, size_t window, nb::object out, const nb::object& stream) {
  const int device = self.cache.device();
  const size_t d = static_cast<size_t>(self.cache.config().head_dim);
  const float* qp = float_input(q, "q", {{"len(seqs)", seqs.size()}, {"n_q_heads"}, {"head_dim", d}}, device);
  KVQ_CHECK(q.shape(1) <= INT_MAX, "q: ", q.shape(1), " query heads");
  if (out.is_none()) out = device_policy("empty_output")(nb::make_tuple(q.shape(0), q.shape(1), d), device);
  OutputArray target;
  if (!nb::try_cast(out, target, false))
    throw nb::type_error("out: expected a writable array on a CUDA device (a tensor through DLPack)");
  float* op = float_output(target, "out", {{"len(seqs)", seqs.size()}, {"n_q_heads", q.shape(1)}, {"head_dim", d}},
                           device);
  check_disjoint(qp, op, q.size());
  AttentionOptions options;
  options.scale = scale.value_or(0.0f);
  options.window = window;
  void* s = stream_of(self, stream);
  without_gil(self.mutex, [&] {
    cuda::decode_attention(self.cache, layer, seqs, qp, op, static_cast<int>(q.shape(1)), options, s);
  });
  return out;
}

// A DecodeStep of the cache (cuda.hpp), holding the cache alive and taking turns on its lock.
struct PyDecodeStep {
  cuda::DecodeStep step;
  PyDeviceKVCache* owner;
  size_t batch, n_q_heads;
};

PyDecodeStep* make_decode_step(PyDeviceKVCache& self, const std::vector<SeqId>& seqs, const std::vector<int>& layers,
                               int n_q_heads, const std::vector<std::optional<float>>& scales,
                               const std::vector<size_t>& windows, size_t max_tokens) {
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
  const cuda::DeviceKVCache& cache = self.owner->cache;
  const int device = cache.device();
  const size_t H = static_cast<size_t>(cache.config().n_kv_heads), d = static_cast<size_t>(cache.config().head_dim);
  const float* k = float_input(keys, "keys", {{"batch", self.batch}, {"n_kv_heads", H}, {"head_dim", d}}, device);
  const float* v = float_input(values, "values", {{"batch", self.batch}, {"n_kv_heads", H}, {"head_dim", d}}, device);
  const float* qp = float_input(q, "q", {{"batch", self.batch}, {"n_q_heads", self.n_q_heads}, {"head_dim", d}}, device);
  float* op = float_output(out, "out", {{"batch", self.batch}, {"n_q_heads", self.n_q_heads}, {"head_dim", d}}, device);
  check_disjoint(qp, op, q.size());
  void* s = stream_of(*self.owner, stream);
  without_gil(self.owner->mutex, [&] { self.step.run(layer, k, v, qp, op, s); });
}

// What the device cache can tell of its memory, with KVCache.memory()'s keys where they mean the same.
nb::dict memory(PyDeviceKVCache& self) {
  const CacheConfig& c = self.cache.config();
  size_t page_bytes = 0, free_pages = 0, slots = 0, sequences = 0;
  without_gil(self.mutex, [&] {
    page_bytes = self.cache.page_bytes();
    free_pages = self.cache.free_pages();
    slots = self.cache.residual_slots();
    sequences = self.cache.sequences().size();
  });
  const size_t capacity = self.cache.capacity_pages(), in_use = capacity - free_pages;
  nb::dict m;
  m["page_bytes"] = page_bytes;
  m["pages_in_use"] = in_use;
  m["pages_capacity"] = capacity;
  m["encoded_bytes"] = in_use * page_bytes;
  m["pool_bytes"] = capacity * page_bytes;
  // Every (sequence, layer) has its whole window from the start on the device.
  m["residual_bytes"] = sequences * static_cast<size_t>(c.n_layers) * 2 * static_cast<size_t>(c.n_kv_heads) * slots *
                        static_cast<size_t>(c.head_dim) * sizeof(float);
  m["bits_per_element"] = 8.0 * static_cast<double>(page_bytes) / (2.0 * c.block_tokens * c.n_kv_heads * c.head_dim);
  return m;
}

}  // namespace

void bind_device_cache(nb::module_& m) {
  nb::class_<PyDeviceKVCache> cls(
      m, "DeviceKVCache",
      "The paged compressed KV cache on a CUDA device: KVCache's codecs, pages and windows in one device pool, "
      "appended to from device (or CPU) arrays and attended over by fused CUDA kernels (cuda.hpp). Device "
      "arrays are float32, C-contiguous, on the cache's device: torch CUDA tensors or anything with __dlpack__.");
  cls.def(
         "__init__",
         [](PyDeviceKVCache* self, int n_layers, int n_kv_heads, int head_dim, size_t capacity_pages,
            const std::string& key_codec, const std::string& value_codec, int block_tokens, int residual_tokens,
            uint64_t seed, bool center_keys, int device) {
           const CacheConfig config{n_layers,       n_kv_heads,      head_dim, block_tokens, key_codec,
                                    value_codec,    residual_tokens, capacity_pages,         seed,
                                    center_keys};
           nb::gil_scoped_release release;
           new (self) PyDeviceKVCache{cuda::DeviceKVCache(config, device), {}};
         },
         nb::arg("n_layers"), nb::arg("n_kv_heads"), nb::arg("head_dim"), nb::kw_only(), nb::arg("capacity_pages"),
         nb::arg("key_codec") = "f16", nb::arg("value_codec") = "f16", nb::arg("block_tokens") = 64,
         nb::arg("residual_tokens") = 0, nb::arg("seed") = 0, nb::arg("center_keys") = false, nb::arg("device") = 0,
         "As KVCache's, with the pool of capacity_pages pages allocated on CUDA device `device`. Codecs that need "
         "training come trained from a CPU cache: KVCache.to_device.")
      .def(
          "to_host",
          [](PyDeviceKVCache& self, size_t capacity_pages) {
            const int workers = pool_size(0);
            return without_gil(self.mutex, [&] {
              return new PyKVCache{self.cache.to_host(capacity_pages), ThreadPool(workers), {}};
            });
          },
          nb::arg("capacity_pages") = 0, nb::rv_policy::take_ownership,
          "A CPU KVCache with the same codecs, sequences (ids, pages byte for byte, windows) and next id; "
          "capacity_pages: its pool (0: this cache's capacity). Waits for the device's queued work.")
      .def(
          "add_sequence",
          [](PyDeviceKVCache& self) { return without_gil(self.mutex, [&] { return self.cache.add_sequence(); }); },
          "A new empty sequence's id (ids are never reused).")
      .def(
          "remove_sequence",
          [](PyDeviceKVCache& self, SeqId seq) {
            without_gil(self.mutex, [&] { self.cache.remove_sequence(seq); });
          },
          nb::arg("seq"), "Frees the sequence's pages and window.")
      .def_prop_ro(
          "sequences",
          [](PyDeviceKVCache& self) { return without_gil(self.mutex, [&] { return self.cache.sequences(); }); },
          "Live sequence ids in increasing order.")
      .def(
          "length",
          [](PyDeviceKVCache& self, SeqId seq, int layer) {
            return without_gil(self.mutex, [&] { return self.cache.length(seq, layer); });
          },
          nb::arg("seq"), nb::arg("layer"), "Tokens of the sequence in `layer`.")
      .def("append", &append, nb::arg("seq"), nb::arg("layer"), nb::arg("keys"), nb::arg("values"),
           nb::arg("stream") = nb::none(),
           "Appends n tokens to one layer of a sequence: keys and values float32 [n, n_kv_heads, head_dim], both on "
           "the cache's device (encoded there, queued on `stream`) or both in CPU memory (uploaded, done when the "
           "call returns). stream: None for torch's current stream on the cache's device (the default stream "
           "where torch is not imported), an int cudaStream_t, or a torch.cuda.Stream. On any error nothing is "
           "modified.")
      .def("append_batch", &append_batch, nb::arg("seqs"), nb::arg("layer"), nb::arg("keys"), nb::arg("values"),
           nb::arg("n_tokens"), nb::arg("stream") = nb::none(),
           "Appends n_tokens[i] tokens to each sequence seqs[i] of one layer in one set of launches (a decode step: "
           "one token each): keys and values float32 [sum(n_tokens), n_kv_heads, head_dim] on the cache's device, "
           "the chunks in the order of seqs. On any error no sequence is modified.")
      .def("decode_attention", &decode_attention, nb::arg("layer"), nb::arg("seqs"), nb::arg("q"),
           nb::arg("scale") = nb::none(), nb::arg("window") = 0, nb::arg("out") = nb::none(),
           nb::arg("stream") = nb::none(),
           "Attention of one query token per sequence over everything the sequence holds in `layer`, by the fused "
           "kernel of the layer's codec pair: q float32 [len(seqs), n_q_heads, head_dim] on the cache's device, "
           "n_q_heads a multiple of n_kv_heads (GQA). scale: None for 1 / sqrt(head_dim); window: sliding window "
           "(0: none). Returns `out`, or a new torch tensor of q's shape; done on `stream` (as append's) when the "
           "call returns.")
      .def(
          "attention_kernel",
          [](PyDeviceKVCache& self, int layer) {
            return without_gil(self.mutex, [&] { return cuda::decode_kernel(self.cache, layer); });
          },
          nb::arg("layer"),
          "The CUDA kernel decode attention runs for the layer, e.g. 'cuda_int4_int4_fast' (KVQ_ATTENTION=fast, the "
          "default) or 'cuda_int4_int4' (exact); kvq.Error for a codec pair "
          "without one.")
      .def("memory", &memory,
           "Bytes held on the device: page_bytes, pages_in_use, pages_capacity, encoded_bytes, pool_bytes, "
           "residual_bytes (the fp32 windows), bits_per_element.")
      .def_prop_ro("free_pages", [](PyDeviceKVCache& self) {
        return without_gil(self.mutex, [&] { return self.cache.free_pages(); });
      });
  // The configuration does not change after construction: read without the lock.
  cls.def_prop_ro("device", [](PyDeviceKVCache& self) { return self.cache.device(); }, "The CUDA device's id.")
      .def_prop_ro("n_layers", [](PyDeviceKVCache& self) { return self.cache.config().n_layers; })
      .def_prop_ro("n_kv_heads", [](PyDeviceKVCache& self) { return self.cache.config().n_kv_heads; })
      .def_prop_ro("head_dim", [](PyDeviceKVCache& self) { return self.cache.config().head_dim; })
      .def_prop_ro("block_tokens", [](PyDeviceKVCache& self) { return self.cache.config().block_tokens; })
      .def_prop_ro("residual_tokens", [](PyDeviceKVCache& self) { return self.cache.config().residual_tokens; })
      .def_prop_ro("capacity_pages", [](PyDeviceKVCache& self) { return self.cache.capacity_pages(); })
      .def_prop_ro("key_codec", [](PyDeviceKVCache& self) { return self.cache.config().key_codec; },
                   "The key codec's spec, canonical.")
      .def_prop_ro("value_codec", [](PyDeviceKVCache& self) { return self.cache.config().value_codec; })
      .def_prop_ro("seed", [](PyDeviceKVCache& self) { return self.cache.config().seed; })
      .def_prop_ro("center_keys", [](PyDeviceKVCache& self) { return self.cache.config().center_keys; })
      .def("__repr__", [](PyDeviceKVCache& self) {
        const CacheConfig& c = self.cache.config();
        return "kvq.DeviceKVCache(" + std::to_string(c.n_layers) + ", " + std::to_string(c.n_kv_heads) + ", " +
               std::to_string(c.head_dim) + ", capacity_pages=" + std::to_string(c.capacity_pages) +
               ", key_codec='" + c.key_codec + "', value_codec='" + c.value_codec +
               "', device=" + std::to_string(self.cache.device()) + ")";
      });
  cls.def("decode_step", &make_decode_step, nb::arg("seqs"), nb::arg("layers"), nb::arg("n_q_heads"), nb::kw_only(),
          nb::arg("scales"), nb::arg("windows"), nb::arg("max_tokens"), nb::keep_alive<0, 1>(),
          nb::rv_policy::take_ownership,
          "Decode steps of the batch `seqs` over `layers` whose launches keep one shape, for CUDA graphs "
          "(torch.cuda.graph): each step appends one token per sequence to each layer and attends there, as "
          "append_batch then decode_attention would. scales, windows: per layer (None: 1 / sqrt(head_dim); 0: no "
          "window); max_tokens: the longest a sequence may grow. Per step: prepare(), then run() once per layer "
          "(the runs may be a captured graph's replay).");
  nb::class_<PyDecodeStep>(m, "DecodeStep",
                           "Decode steps of a fixed batch whose launches a CUDA graph can capture and replay "
                           "(DeviceKVCache.decode_step).")
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
      "Whether kvq.DeviceKVCache can run here: this build has the CUDA backend and the machine a CUDA device.");
  m.def("cuda_unavailable_reason", &cuda::unavailable_reason,
        "Why no CUDA device can be used ('' when one can): a build without the CUDA backend, the driver's error, "
        "or no device.");
}

}  // namespace kvq::python

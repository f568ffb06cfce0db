// kvq.KVCache: the paged compressed KV cache (cache.hpp) on the CPU or a CUDA device, and attention over it
// (attention.hpp). Arrays lie where the cache does (NumPy or any DLPack array on the CPU, torch CUDA tensors on a
// device), except that append also takes CPU arrays on a CUDA cache. A CPU cache owns the thread pool its attention
// calls split their work over; a call on a CUDA cache runs on a stream (kvq/_device.py picks it where the caller
// names none). The CUDA-only methods: device_cache_binding.cpp.
#include <nanobind/stl/filesystem.h>
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <tuple>
#include <utility>
#include <vector>

#include "arrays.hpp"
#include "bindings.hpp"
#include "cache_objects.hpp"
#include "kvq/attention.hpp"
#include "kvq/cache.hpp"
#include "kvq/error.hpp"
#include "without_gil.hpp"

namespace kvq::python {

int pool_size(int threads) {
  KVQ_CHECK(threads >= 0, "threads = ", threads, " (need >= 0; 0: one per core)");
  return threads > 0 ? threads : static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
}

namespace nb = nanobind;

int place_of(const KVCache& cache) { return cache.device().is_cuda() ? cache.device().index : kCpu; }

nb::object device_policy(const char* name) { return nb::module_::import_("kvq._device").attr(name); }

void* stream_of(const PyKVCache& self, const nb::object& stream) {
  if (self.cache.device().is_cpu()) return nullptr;
  const nb::object handle = device_policy("stream_handle")(stream, self.cache.device().index);
  return reinterpret_cast<void*>(nb::cast<uintptr_t>(handle));
}

namespace {

// A new cache object on `device` around `cache`: a CPU cache with a pool of `threads` (0: one per core).
PyKVCache* new_cache(KVCache cache, int threads) {
  const int workers = cache.device().is_cpu() ? pool_size(threads) : 1;
  return new PyKVCache{std::move(cache), ThreadPool(workers), {}};
}

using Array = nb::ndarray<nb::numpy, float>;

Array numpy_tokens(std::unique_ptr<float[]> data, size_t n, const CacheConfig& c) {
  return numpy_array(std::move(data), {n, static_cast<size_t>(c.n_kv_heads), static_cast<size_t>(c.head_dim)});
}

// Tokens in CPU memory (either device), or in a CUDA cache's device memory: keys decide, values must lie with them.
void append(PyKVCache& self, SeqId seq, int layer, const InputArray& keys, const InputArray& values,
            const nb::object& stream) {
  const CacheConfig& c = self.cache.config();
  const size_t H = static_cast<size_t>(c.n_kv_heads), d = static_cast<size_t>(c.head_dim);
  const int place = keys.device_type() == nb::device::cuda::value ? place_of(self.cache) : kCpu;
  const float* k = float_input(keys, "keys", {{"n"}, {"n_kv_heads", H}, {"head_dim", d}}, place);
  const float* v =
      float_input(values, "values", {{"n", keys.shape(0)}, {"n_kv_heads", H}, {"head_dim", d}}, place);
  const size_t n = keys.shape(0);
  if (place == kCpu) {
    without_gil(self.mutex, [&] { self.cache.append(seq, layer, k, v, n); });
    return;
  }
  void* s = stream_of(self, stream);
  without_gil(self.mutex, [&] { self.cache.append_device(seq, layer, k, v, n, s); });
}

void train_layer(PyKVCache& self, int layer, const InputArray& keys, const InputArray& values) {
  const size_t d = static_cast<size_t>(self.cache.config().head_dim);
  const float* k = float_input(keys, "keys", {{"n"}, {"head_dim", d}});
  const float* v = float_input(values, "values", {{"n", keys.shape(0)}, {"head_dim", d}});
  without_gil(self.mutex, [&] { self.cache.train_layer(layer, k, v, keys.shape(0)); });
}

void load_layer_state(PyKVCache& self, int layer, const nb::bytes& key_state, const nb::bytes& value_state) {
  const auto vector_of = [](const nb::bytes& b) {
    const auto* p = static_cast<const uint8_t*>(b.data());
    return std::vector<uint8_t>(p, p + b.size());
  };
  const std::vector<uint8_t> k = vector_of(key_state), v = vector_of(value_state);
  without_gil(self.mutex, [&] { self.cache.load_layer_state(layer, k, v); });
}

std::tuple<nb::bytes, nb::bytes> layer_state(PyKVCache& self, int layer) {
  std::vector<uint8_t> k, v;
  without_gil(self.mutex, [&] {
    k = self.cache.key_codec(layer).state();
    v = self.cache.value_codec(layer).state();
  });
  return {nb::bytes(k.data(), k.size()), nb::bytes(v.data(), v.size())};
}

std::tuple<Array, Array> read(PyKVCache& self, SeqId seq, int layer) {
  const CacheConfig& c = self.cache.config();
  const size_t row = static_cast<size_t>(c.n_kv_heads * c.head_dim);
  std::unique_ptr<float[]> keys, values;
  const size_t n = without_gil(self.mutex, [&] {
    const size_t length = self.cache.length(seq, layer);
    keys = output_memory<float>(length * row);
    values = output_memory<float>(length * row);
    self.cache.read(seq, layer, keys.get(), values.get());
    return length;
  });
  return {numpy_tokens(std::move(keys), n, c), numpy_tokens(std::move(values), n, c)};
}

// Attention's shared part: q [rows, n_q_heads, head_dim] checked where the cache lies, the output allocated (a NumPy
// array; on a CUDA cache a torch tensor, kvq/_device.py) or out= checked, `run` called with both spans, the options
// and the stream; returns the output.
template <class Run>
nb::object attend(PyKVCache& self, size_t rows, const char* rows_name, const InputArray& q, std::optional<float> scale,
                  size_t window, nb::object out, const nb::object& stream, Run&& run) {
  const size_t d = static_cast<size_t>(self.cache.config().head_dim);
  const int place = place_of(self.cache);
  const float* qp = float_input(q, "q", {{rows_name, rows}, {"n_q_heads"}, {"head_dim", d}}, place);
  const size_t n = q.size();
  AttentionOptions options;
  options.scale = scale.value_or(0.0f);
  options.window = window;
  void* s = stream_of(self, stream);
  if (out.is_none() && place == kCpu) {
    auto result = output_memory<float>(n);
    without_gil(self.mutex, [&] { run(std::span(qp, n), std::span(result.get(), n), options, s); });
    return nb::cast(numpy_array(std::move(result), {q.shape(0), q.shape(1), d}));
  }
  if (out.is_none()) out = device_policy("empty_output")(nb::make_tuple(q.shape(0), q.shape(1), d), place);
  OutputArray target;
  if (!nb::try_cast(out, target, false))
    throw nb::type_error(place == kCpu ? "out: expected a writable array (NumPy, or a tensor through DLPack)"
                                       : "out: expected a writable array on the cache's CUDA device (a tensor "
                                         "through DLPack)");
  float* op = float_output(target, "out", {{rows_name, rows}, {"n_q_heads", q.shape(1)}, {"head_dim", d}}, place);
  check_disjoint(qp, op, n);
  without_gil(self.mutex, [&] { run(std::span(qp, n), std::span(op, n), options, s); });
  return out;
}

nb::object attend_decode(PyKVCache& self, int layer, const std::vector<SeqId>& seqs, const InputArray& q,
                         std::optional<float> scale, size_t window, const nb::object& out, const nb::object& stream) {
  return attend(self, seqs.size(), "len(seqs)", q, scale, window, out, stream,
                [&](std::span<const float> qs, std::span<float> os, const AttentionOptions& options, void* s) {
                  decode_attention(self.cache, layer, seqs, qs, os, options, &self.pool, s);
                });
}

nb::object attend_prefill(PyKVCache& self, int layer, SeqId seq, size_t start, const InputArray& q,
                          std::optional<float> scale, size_t window, const nb::object& out) {
  KVQ_CHECK(self.cache.device().is_cpu(), "prefill_attention: a ", self.cache.device().str(),
            " cache; prefill runs on CPU caches (decode_attention runs on both)");
  const size_t n_queries = q.ndim() > 0 ? q.shape(0) : 0;
  return attend(self, n_queries, "n", q, scale, window, out, nb::none(),
                [&](std::span<const float> qs, std::span<float> os, const AttentionOptions& options, void*) {
                  prefill_attention(self.cache, layer, seq, start, n_queries, qs, os, options, &self.pool);
                });
}

// A DecodePlan of the cache (attention.hpp), holding the cache alive and taking turns on its lock and pool.
struct PyDecodePlan {
  DecodePlan plan;
  PyKVCache* owner;
  size_t n_seqs;
  size_t n_q_heads;
};

PyDecodePlan* make_decode_plan(PyKVCache& self, int layer, const std::vector<SeqId>& seqs, int n_q_heads,
                               std::optional<float> scale, size_t window) {
  AttentionOptions options;
  options.scale = scale.value_or(0.0f);
  options.window = window;
  return without_gil(self.mutex, [&] {
    return new PyDecodePlan{DecodePlan(self.cache, layer, seqs, n_q_heads, options, &self.pool), &self, seqs.size(),
                            static_cast<size_t>(n_q_heads)};
  });
}

nb::object run_decode_plan(PyDecodePlan& self, const InputArray& q, const nb::object& out, const nb::object& stream) {
  if (q.ndim() == 3 && q.shape(1) != self.n_q_heads)
    throw nb::value_error(("q: " + std::to_string(q.shape(1)) + " query heads; the plan was made for " +
                           std::to_string(self.n_q_heads)).c_str());
  return attend(*self.owner, self.n_seqs, "len(seqs)", q, std::nullopt, 0, out, stream,
                [&](std::span<const float> qs, std::span<float> os, const AttentionOptions&, void* s) {
                  self.plan.run(qs, os, s);
                });
}

nb::dict memory(PyKVCache& self) {
  const CacheMemory m = without_gil(self.mutex, [&] { return self.cache.memory(); });
  nb::dict d;
  d["page_bytes"] = m.page_bytes;
  d["pages_in_use"] = m.pages_in_use;
  d["pages_capacity"] = m.pages_capacity;
  d["encoded_bytes"] = m.encoded_bytes;
  d["pool_bytes"] = m.pool_bytes;
  d["residual_bytes"] = m.residual_bytes;
  d["block_table_bytes"] = m.block_table_bytes;
  d["codec_state_bytes"] = m.codec_state_bytes;
  d["key_offset_bytes"] = m.key_offset_bytes;
  d["sink_bytes"] = m.sink_bytes;
  d["used_bytes"] = m.used_bytes;
  d["total_bytes"] = m.total_bytes;
  d["bits_per_element"] = m.bits_per_element;
  return d;
}

}  // namespace

void bind_cache(nb::module_& m) {
  nb::class_<PyKVCache> cls(
      m, "KVCache",
      "The paged compressed KV cache: per layer a key codec and a value codec, pages of block_tokens tokens from "
      "one pool of capacity_pages pages, the newest tokens of each (sequence, layer) in fp32 (cache.hpp), on the "
      "CPU or a CUDA device. Tokens are [n, n_kv_heads, head_dim] float32: NumPy arrays or anything with "
      "__dlpack__ on the CPU, torch CUDA tensors on the cache's device.");
  cls.def(
         "__init__",
         [](PyKVCache* self, int n_layers, int n_kv_heads, int head_dim, size_t capacity_pages,
            const std::string& key_codec, const std::string& value_codec, int block_tokens, int residual_tokens,
            uint64_t seed, bool center_keys, int sink_tokens, int threads, const std::string& device) {
           const CacheConfig config{n_layers,       n_kv_heads,      head_dim, block_tokens, key_codec,
                                    value_codec,    residual_tokens, capacity_pages,         seed,
                                    center_keys,    sink_tokens};
           const Device where = Device::parse(device);
           const int workers = where.is_cpu() ? pool_size(threads) : 1;
           nb::gil_scoped_release release;
           new (self) PyKVCache{KVCache(config, where), ThreadPool(workers), {}};
         },
         nb::arg("n_layers"), nb::arg("n_kv_heads"), nb::arg("head_dim"), nb::kw_only(), nb::arg("capacity_pages"),
         nb::arg("key_codec") = "f16", nb::arg("value_codec") = "f16", nb::arg("block_tokens") = 64,
         nb::arg("residual_tokens") = 0, nb::arg("seed") = 0, nb::arg("center_keys") = false,
         nb::arg("sink_tokens") = 0, nb::arg("threads") = 0, nb::arg("device") = "cpu",
         "capacity_pages: pages in the pool, allocated now, shared by every layer and sequence (a page holds "
         "block_tokens tokens of one layer of one sequence); block_tokens: 64 or 128; residual_tokens: newest "
         "tokens kept in fp32, a multiple of block_tokens; center_keys: store quantized keys minus their first "
         "page's mean; sink_tokens: the first tokens of every sequence kept in f16, never encoded (either device; "
         "docs/quality.md, \"Sink tokens\"); threads: a CPU cache's attention thread pool (0: one per core); device: 'cpu', 'cuda' or "
         "'cuda:N' (kvq.Error where this build or machine has no such device). Codecs that need training are "
         "trained on a CPU cache, then copied: to().")
      .def_static(
          "load",
          [](const std::filesystem::path& path, int threads, const std::string& device) {
            const Device where = Device::parse(device);
            nb::gil_scoped_release release;
            return new_cache(KVCache::load(path.string(), where), threads);
          },
          nb::arg("path"), nb::arg("threads") = 0, nb::arg("device") = "cpu", nb::rv_policy::take_ownership,
          "Reads a file written by save() into a cache on `device`; kvq.Error for a damaged, truncated, foreign or "
          "newer file.")
      .def(
          "to",
          [](PyKVCache& self, const std::string& device, size_t capacity_pages, int threads) {
            const Device where = Device::parse(device);
            return without_gil(self.mutex, [&] { return new_cache(self.cache.to(where, capacity_pages), threads); });
          },
          nb::arg("device"), nb::arg("capacity_pages") = 0, nb::arg("threads") = 0, nb::rv_policy::take_ownership,
          "A copy on `device` ('cpu', 'cuda', 'cuda:N'): the same codecs (trained state included), sequences (ids, "
          "pages byte for byte, windows) and next id; capacity_pages: its pool (0: this cache's capacity); "
          "threads: as the constructor's. Waits for a CUDA cache's queued work.")
      .def(
          "save",
          [](PyKVCache& self, const std::filesystem::path& path) {
            without_gil(self.mutex, [&] { self.cache.save(path.string()); });
          },
          nb::arg("path"),
          "Writes the cache to path (through path + '.tmp' and a rename; a CUDA cache through a CPU copy).")
      .def(
          "add_sequence",
          [](PyKVCache& self) { return without_gil(self.mutex, [&] { return self.cache.add_sequence(); }); },
          "A new empty sequence's id (ids are never reused).")
      .def(
          "remove_sequence",
          [](PyKVCache& self, SeqId seq) { without_gil(self.mutex, [&] { self.cache.remove_sequence(seq); }); },
          nb::arg("seq"), "Frees the sequence's pages and window.")
      .def_prop_ro(
          "sequences", [](PyKVCache& self) { return without_gil(self.mutex, [&] { return self.cache.sequences(); }); },
          "Live sequence ids in increasing order.")
      .def("append", &append, nb::arg("seq"), nb::arg("layer"), nb::arg("keys"), nb::arg("values"),
           nb::arg("stream") = nb::none(),
           "Appends n tokens (one decode step or a prefill chunk) to one layer of a sequence: keys and values "
           "float32 [n, n_kv_heads, head_dim], both in CPU memory (on a CUDA cache: uploaded, done when the call "
           "returns) or both on a CUDA cache's device (encoded there, queued on `stream`: None for torch's current "
           "stream on the cache's device, the default stream where torch is not imported, an int cudaStream_t, or "
           "a torch.cuda.Stream). On any error nothing is modified.")
      .def(
          "length",
          [](PyKVCache& self, SeqId seq, std::optional<int> layer) {
            return without_gil(self.mutex,
                               [&] { return layer ? self.cache.length(seq, *layer) : self.cache.length(seq); });
          },
          nb::arg("seq"), nb::arg("layer") = nb::none(),
          "Tokens of the sequence in `layer`, or in every layer (kvq.Error if the layers differ).")
      .def("read", &read, nb::arg("seq"), nb::arg("layer"),
           "(keys, values) of (seq, layer) as attention reads them, decoded: float32 [length, n_kv_heads, "
           "head_dim] NumPy arrays each (a CUDA cache's through a CPU copy of the sequence).")
      .def("train_layer", &train_layer, nb::arg("layer"), nb::arg("keys"), nb::arg("values"),
           "Trains the layer's codecs on float32 [n, head_dim] example keys and values in CPU memory, before the "
           "layer holds encoded tokens.")
      .def("load_layer_state", &load_layer_state, nb::arg("layer"), nb::arg("key_state"), nb::arg("value_state"),
           "Starts the layer's codecs from trained states (bytes of Codec.state() of codecs of the same specs seeded "
           "as this layer's, e.g. a calibration file's kvq.LayerCodecs key_state / value_state; empty bytes leave "
           "that codec as it is), before the layer holds encoded tokens; either device. kvq.Error for a state a "
           "codec refuses, changing neither.")
      .def("layer_state", &layer_state, nb::arg("layer"),
           "(key_state, value_state): Codec.state() of the layer's two codecs as bytes (empty where a codec has "
           "none), what load_layer_state takes.")
      .def(
          "ready",
          [](PyKVCache& self, int layer) { return without_gil(self.mutex, [&] { return self.cache.ready(layer); }); },
          nb::arg("layer"), "Whether both codecs of the layer can encode (trained, or needing no training).")
      .def("decode_attention", &attend_decode, nb::arg("layer"), nb::arg("seqs"), nb::arg("q"),
           nb::arg("scale") = nb::none(), nb::arg("window") = 0, nb::arg("out") = nb::none(),
           nb::arg("stream") = nb::none(),
           "Attention of one query token per sequence over everything the sequence holds in `layer`: q float32 "
           "[len(seqs), n_q_heads, head_dim] where the cache lies, n_q_heads a multiple of n_kv_heads (GQA). "
           "scale: None for 1 / sqrt(head_dim); window: sliding window (0: none). Returns float32 [len(seqs), "
           "n_q_heads, head_dim]: `out`, or a new NumPy array (a CUDA cache: a new torch tensor, done on `stream`, "
           "as append's, when the call returns).")
      .def("decode_plan", &make_decode_plan, nb::arg("layer"), nb::arg("seqs"), nb::arg("n_q_heads"),
           nb::arg("scale") = nb::none(), nb::arg("window") = 0, nb::keep_alive<0, 1>(),
           nb::rv_policy::take_ownership,
           "decode_attention of the batch `seqs` planned once for every step, the same output bit for bit. On the "
           "CPU DecodePlan.run(q) attends the sequences as they are then, reusing the scratch of the last run; on a "
           "CUDA device the plan's tables hold the sequences as they were when it was made (make a new one after "
           "an append) and run queues the kernels on its stream.")
      .def("prefill_attention", &attend_prefill, nb::arg("layer"), nb::arg("seq"), nb::arg("start"), nb::arg("q"),
           nb::arg("scale") = nb::none(), nb::arg("window") = 0, nb::arg("out") = nb::none(),
           "Causal attention of positions start .. start + n - 1 of a sequence whose tokens are appended, on a CPU "
           "cache: q float32 [n, n_q_heads, head_dim]; the query at position p sees tokens 0..p. Returns as "
           "decode_attention.")
      .def(
          "attention_kernel",
          [](PyKVCache& self, int layer) {
            return without_gil(self.mutex, [&] { return attention_kernel(self.cache, layer); });
          },
          nb::arg("layer"),
          "The kernel decode attention runs for the layer: on the CPU the page loop's, 'generic' or "
          "fused_<key>_<value>_<isa>; on a CUDA device the split kernel's, e.g. 'cuda_int4_int4_fast' (kvq.Error for a "
          "codec pair without one).")
      .def("memory", &memory,
           "True bytes held: page_bytes, pages_in_use, pages_capacity, encoded_bytes, pool_bytes, residual_bytes, "
           "block_table_bytes, codec_state_bytes, key_offset_bytes, sink_bytes, used_bytes, total_bytes, "
           "bits_per_element.")
      .def_prop_ro("free_pages",
                   [](PyKVCache& self) { return without_gil(self.mutex, [&] { return self.cache.free_pages(); }); });
  nb::class_<PyDecodePlan>(m, "DecodePlan",
                           "Decode attention of one batch of a KVCache, planned once and run at every step "
                           "(KVCache.decode_plan).")
      .def("run", &run_decode_plan, nb::arg("q"), nb::arg("out") = nb::none(), nb::arg("stream") = nb::none(),
           "Attention of one query token per sequence of the plan: q float32 [len(seqs), n_q_heads, head_dim] "
           "where the cache lies. Returns as KVCache.decode_attention (on a CUDA device queued on `stream`, "
           "without waiting).");
  // The configuration does not change after construction: read without the lock.
  cls.def_prop_ro("device", [](PyKVCache& self) { return self.cache.device().str(); },
                  "Where the pages live: 'cpu' or 'cuda:N'.")
      .def_prop_ro("n_layers", [](PyKVCache& self) { return self.cache.config().n_layers; })
      .def_prop_ro("n_kv_heads", [](PyKVCache& self) { return self.cache.config().n_kv_heads; })
      .def_prop_ro("head_dim", [](PyKVCache& self) { return self.cache.config().head_dim; })
      .def_prop_ro("block_tokens", [](PyKVCache& self) { return self.cache.config().block_tokens; })
      .def_prop_ro("residual_tokens", [](PyKVCache& self) { return self.cache.config().residual_tokens; })
      .def_prop_ro("capacity_pages", [](PyKVCache& self) { return self.cache.config().capacity_pages; })
      .def_prop_ro("key_codec", [](PyKVCache& self) { return self.cache.config().key_codec; },
                   "The key codec's spec, canonical.")
      .def_prop_ro("value_codec", [](PyKVCache& self) { return self.cache.config().value_codec; })
      .def_prop_ro("seed", [](PyKVCache& self) { return self.cache.config().seed; })
      .def_prop_ro("center_keys", [](PyKVCache& self) { return self.cache.config().center_keys; })
      .def_prop_ro("sink_tokens", [](PyKVCache& self) { return self.cache.config().sink_tokens; })
      .def_prop_ro("threads", [](PyKVCache& self) { return self.pool.size(); })
      .def("__repr__", [](PyKVCache& self) {
        const CacheConfig& c = self.cache.config();
        return "kvq.KVCache(" + std::to_string(c.n_layers) + ", " + std::to_string(c.n_kv_heads) + ", " +
               std::to_string(c.head_dim) + ", capacity_pages=" + std::to_string(c.capacity_pages) +
               ", key_codec='" + c.key_codec + "', value_codec='" + c.value_codec +
               (self.cache.device().is_cpu() ? "" : "', device='" + self.cache.device().str()) + "')";
      });
  bind_device_cache(m, cls);
  m.def("attention_isa", &attention_isa,
        "The instruction set the CPU attention kernels use here: 'scalar', 'avx2', 'avx512', 'avx512vnni', "
        "'avx512bf16' or 'neon' (KVQ_ISA caps it).");
}

}  // namespace kvq::python

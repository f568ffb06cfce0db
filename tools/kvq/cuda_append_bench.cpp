// kvq bench append --device cuda: the append kernels (KVCache::append_device_batch) per codec against the
// device's copy bandwidth measured in the same run, counted as copy_bandwidth_gbps counts it: bytes read (the fp32
// keys and values) plus bytes written (the packed pages and the fp32 window tokens), per second.
//
// Rows: "prefill", one chunk of --chunk tokens appended to each of --batch empty sequences in one batched call (the
// chunks concatenated, each sequence's in distinct device memory, so nothing is served from L2), and "decode", one
// token appended to each of --batch sequences that hold a chunk already, in one batched call (a decode step). A
// call waits once for its checks (non-finite tokens, values beyond the codec's fp16 fields) before it commits, so
// it costs one host-device round trip: the decode row measures that latency, the prefill row the kernels'
// throughput with it. "prefill_per_seq" and "decode_per_seq" time the same work as one append_device call per
// sequence (a round trip each).
#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cuda_append_bench.hpp"
#include "kvq/cuda.hpp"
#include "kvq/detail/cuda_bench_support.hpp"
#include "kvq/detail/synthetic.hpp"
#include "kvq/error.hpp"

namespace kvq::cli {
namespace {

constexpr size_t kCopyBytes = size_t{1} << 30;

struct Row {
  std::string codec, mode;
  double calls = 0;  // append calls per timed step
  double us = 0, tokens = 0, bytes_read = 0, bytes_written = 0;
};

CacheConfig config_for(const AppendBenchOptions& o, const std::string& codec, size_t capacity) {
  CacheConfig cfg;
  cfg.n_layers = 1;
  cfg.n_kv_heads = o.kv_heads;
  cfg.head_dim = o.dim;
  cfg.block_tokens = o.block;
  cfg.key_codec = codec;
  cfg.value_codec = codec;
  cfg.capacity_pages = capacity;
  cfg.seed = o.seed;
  return cfg;
}

// The inputs in device memory: the prefill chunks [batch][chunk][H][d] (every sequence's its own copy of the sample)
// and the decode steps [steps][batch][H][d] (step i: token i % chunk of the sample for every sequence).
struct Inputs {
  cuda::DeviceFloats prefill_k, prefill_v, decode_k, decode_v;
};

Inputs upload_inputs(const AppendBenchOptions& o, size_t steps, const std::vector<float>& keys,
                     const std::vector<float>& values) {
  const size_t row = static_cast<size_t>(o.kv_heads) * o.dim, chunk_floats = o.chunk * row;
  Inputs in{cuda::DeviceFloats(o.batch * chunk_floats), cuda::DeviceFloats(o.batch * chunk_floats),
            cuda::DeviceFloats(steps * o.batch * row), cuda::DeviceFloats(steps * o.batch * row)};
  for (const bool value : {false, true}) {
    const std::vector<float>& sample = value ? values : keys;
    std::vector<float> prefill, decode;
    prefill.reserve(o.batch * chunk_floats);
    for (size_t s = 0; s < o.batch; ++s) prefill.insert(prefill.end(), sample.begin(), sample.end());
    decode.reserve(steps * o.batch * row);
    for (size_t i = 0; i < steps; ++i)
      for (size_t s = 0; s < o.batch; ++s) {
        const auto token = sample.begin() + static_cast<std::ptrdiff_t>(i % o.chunk * row);
        decode.insert(decode.end(), token, token + static_cast<std::ptrdiff_t>(row));
      }
    (value ? in.prefill_v : in.prefill_k).upload(prefill);
    (value ? in.decode_v : in.decode_k).upload(decode);
  }
  return in;
}

// The prefill and decode rows of one codec, as one batched call per step or one call per sequence.
std::vector<Row> time_appends(const AppendBenchOptions& o, const std::string& codec, const KVCache& trainer,
                              const Inputs& in, int decode_reps, bool batched) {
  const size_t T = static_cast<size_t>(o.block), row = static_cast<size_t>(o.kv_heads) * o.dim;
  const size_t chunk_floats = o.chunk * row, pages_per_seq = o.chunk / T + 2;
  constexpr int kWarmup = 1;
  const size_t sets = static_cast<size_t>(o.reps + kWarmup);
  KVCache dev = trainer.to(Device::cuda(), (sets + 1) * o.batch * pages_per_seq);
  std::vector<std::vector<SeqId>> prefill_sets(sets);
  for (auto& set : prefill_sets)
    for (size_t s = 0; s < o.batch; ++s) set.push_back(dev.add_sequence());
  const std::vector<size_t> chunks(o.batch, o.chunk), ones(o.batch, 1);
  size_t next = 0;
  const double prefill_ms = cuda::median_ms(
      [&] {
        const std::vector<SeqId>& set = prefill_sets[next++ % sets];
        if (batched) {
          dev.append_device_batch(set, 0, in.prefill_k.data(), in.prefill_v.data(), chunks);
          return;
        }
        for (size_t s = 0; s < o.batch; ++s)
          dev.append_device(set[s], 0, in.prefill_k.data() + s * chunk_floats, in.prefill_v.data() + s * chunk_floats,
                            o.chunk);
      },
      o.reps, kWarmup);
  const SeqId probe = prefill_sets[0][0];
  const double stored = static_cast<double>(dev.view(probe, 0).pages.size() * dev.page_bytes()) +
                        static_cast<double>(dev.view(probe, 0).residual_count) * 2.0 * static_cast<double>(row) * 4.0;
  const double calls = batched ? 1.0 : static_cast<double>(o.batch);
  Row prefill{codec, batched ? "prefill" : "prefill_per_seq", calls};
  prefill.us = prefill_ms * 1e3;
  prefill.tokens = static_cast<double>(o.batch * o.chunk);
  prefill.bytes_read = prefill.tokens * 2.0 * static_cast<double>(row) * 4.0;
  prefill.bytes_written = stored * static_cast<double>(o.batch);

  // Decode: one token per sequence onto the sequences of the first set, each step from its own rows.
  size_t step = 0;
  const std::vector<SeqId>& seqs = prefill_sets[0];
  const double decode_ms = cuda::median_ms(
      [&] {
        const size_t first = step++ * o.batch * row;
        if (batched) {
          dev.append_device_batch(seqs, 0, in.decode_k.data() + first, in.decode_v.data() + first, ones);
          return;
        }
        for (size_t s = 0; s < o.batch; ++s)
          dev.append_device(seqs[s], 0, in.decode_k.data() + first + s * row, in.decode_v.data() + first + s * row, 1);
      },
      decode_reps, 1);
  Row decode{codec, batched ? "decode" : "decode_per_seq", calls};
  decode.us = decode_ms * 1e3;
  decode.tokens = static_cast<double>(o.batch);
  decode.bytes_read = decode.tokens * 2.0 * static_cast<double>(row) * 4.0;
  decode.bytes_written = decode.bytes_read;  // into the window; a page every T steps on top
  return {prefill, decode};
}

std::vector<Row> time_codec(const AppendBenchOptions& o, const std::string& codec, const std::vector<float>& keys,
                             const std::vector<float>& values) {
  KVCache trainer(config_for(o, codec, 1));
  if (!trainer.ready(0))
    trainer.train_layer(0, keys.data(), values.data(), std::min<size_t>(4096, o.chunk * o.kv_heads));
  const int decode_reps = std::max(o.reps, 2 * o.block);
  const Inputs in = upload_inputs(o, static_cast<size_t>(decode_reps) + 1, keys, values);
  std::vector<Row> rows;
  for (const bool batched : {true, false})  // each its own device cache, freed before the next
    for (const Row& r : time_appends(o, codec, trainer, in, decode_reps, batched)) rows.push_back(r);
  return rows;
}

}  // namespace

void run_cuda_append_bench(const AppendBenchOptions& o) {
  KVQ_CHECK(o.batch > 0 && o.chunk > 0 && o.reps > 0, "bench append: batch, chunk and reps must be positive");
  const std::string device = cuda::device_name(0);
  const double copy_gbps = cuda::copy_bandwidth_gbps(kCopyBytes, 20);
  std::vector<std::string> codecs = o.codecs;
  if (codecs.empty())
    codecs = {"f16",          "bf16",        "int8",         "int4",         "kivi:2",      "kivi:3",
              "kivi:4",       "turbo_mse:1", "turbo_mse:2",  "turbo_mse:3",  "turbo_mse:4", "qjl",
              "turbo_prod:3", "turbo_rvq:2", "vecinfer:8/4", "vecinfer:12/8"};
  const size_t rows = o.chunk * static_cast<size_t>(o.kv_heads);
  const std::vector<float> keys = sample_profile(key_like_profile(o.dim, o.seed), rows, o.seed + 1);
  const std::vector<float> values = gaussian_vectors(rows, o.dim, o.seed + 2);
  nlohmann::ordered_json j_rows = nlohmann::ordered_json::array();
  for (const std::string& c : codecs)
    for (const Row& r : time_codec(o, c, keys, values)) {
      const double gbps = (r.bytes_read + r.bytes_written) / (r.us * 1e3);
      j_rows.push_back({{"codec", r.codec},
                        {"mode", r.mode},
                        {"batch", o.batch},
                        {"calls_per_step", r.calls},
                        {"tokens_per_call", r.tokens},
                        {"us_per_call", r.us},
                        {"tokens_per_s", r.tokens / (r.us * 1e-6)},
                        {"bytes_read", r.bytes_read},
                        {"bytes_written", r.bytes_written},
                        {"gbps", gbps},
                        {"bw_fraction", gbps / copy_gbps}});
    }
  const nlohmann::ordered_json result = {{"device", device}, {"copy_gbps", copy_gbps}, {"kv_heads", o.kv_heads},
                                         {"dim", o.dim},     {"block", o.block},        {"chunk", o.chunk},
                                         {"batch", o.batch}, {"reps", o.reps},          {"rows", j_rows}};
  if (o.json) {
    std::printf("%s\n", result.dump().c_str());
    return;
  }
  std::printf("%s, copy bandwidth %.1f GB/s\nappend: batch %zu, prefill chunk %zu, %d kv heads, d=%d, T=%d\n\n",
              device.c_str(), copy_gbps, o.batch, o.chunk, o.kv_heads, o.dim, o.block);
  std::printf("%-14s %-15s %10s %12s %10s %10s %8s %8s\n", "codec", "mode", "us/call", "tokens/s", "MB read",
              "MB written", "GB/s", "of copy");
  for (const auto& r : j_rows)
    std::printf("%-14s %-15s %10.1f %12.4g %10.2f %10.2f %8.1f %8.2f\n", r["codec"].get<std::string>().c_str(),
                r["mode"].get<std::string>().c_str(), r["us_per_call"].get<double>(), r["tokens_per_s"].get<double>(),
                r["bytes_read"].get<double>() / 1e6, r["bytes_written"].get<double>() / 1e6, r["gbps"].get<double>(),
                r["bw_fraction"].get<double>());
}

}  // namespace kvq::cli

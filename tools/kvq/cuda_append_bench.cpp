// kvq bench append --device cuda: the append kernels (DeviceKVCache::append_device) per codec against the device's
// copy bandwidth measured in the same run, counted as copy_bandwidth_gbps counts it: bytes read (the fp32 keys and
// values) plus bytes written (the packed pages and the fp32 window tokens), per second.
//
// Rows: "prefill", one chunk of --chunk tokens appended to each of --batch empty sequences (one call per sequence,
// each with its own inputs in distinct device memory, so nothing is served from L2), and "decode", one token
// appended to each of --batch sequences that hold a chunk already. Each append_device call waits for its checks
// (non-finite tokens, values beyond the codec's fp16 fields) before it commits, so a call costs at least one
// host-device round trip: the decode row measures that latency, the prefill row the kernels' throughput with it.
#include <algorithm>
#include <cstdio>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cuda_append_bench.hpp"
#include "kvq/cuda.hpp"
#include "kvq/cuda_cache.hpp"
#include "kvq/error.hpp"
#include "kvq/synthetic.hpp"

namespace kvq::cli {
namespace {

constexpr size_t kCopyBytes = size_t{1} << 30;

struct Row {
  std::string codec, mode;
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

std::vector<Row> time_codec(const AppendBenchOptions& o, const std::string& codec, const std::vector<float>& keys,
                             const std::vector<float>& values) {
  const size_t T = static_cast<size_t>(o.block), row = static_cast<size_t>(o.kv_heads) * o.dim;
  const size_t chunk_floats = o.chunk * row, pages_per_seq = o.chunk / T + 2;
  constexpr int kWarmup = 1;
  const size_t sets = static_cast<size_t>(o.reps + kWarmup);
  KVCache trainer(config_for(o, codec, 1));
  if (!trainer.ready(0))
    trainer.train_layer(0, keys.data(), values.data(), std::min<size_t>(4096, o.chunk * o.kv_heads));
  cuda::DeviceKVCache dev(trainer, (sets + 1) * o.batch * pages_per_seq);
  // Every sequence's chunk in its own device memory: batch copies of the sample chunk.
  cuda::DeviceFloats k_dev(o.batch * chunk_floats), v_dev(o.batch * chunk_floats);
  {
    std::vector<float> all_k, all_v;
    all_k.reserve(o.batch * chunk_floats);
    all_v.reserve(o.batch * chunk_floats);
    for (size_t s = 0; s < o.batch; ++s) {
      all_k.insert(all_k.end(), keys.begin(), keys.end());
      all_v.insert(all_v.end(), values.begin(), values.end());
    }
    k_dev.upload(all_k);
    v_dev.upload(all_v);
  }
  std::vector<std::vector<SeqId>> prefill_sets(sets);
  for (auto& set : prefill_sets)
    for (size_t s = 0; s < o.batch; ++s) set.push_back(dev.add_sequence());
  size_t next = 0;
  const double prefill_ms = cuda::median_ms(
      [&] {
        const std::vector<SeqId>& set = prefill_sets[next++ % sets];
        for (size_t s = 0; s < o.batch; ++s)
          dev.append_device(set[s], 0, k_dev.data() + s * chunk_floats, v_dev.data() + s * chunk_floats, o.chunk);
      },
      o.reps, kWarmup);
  const SeqId probe = prefill_sets[0][0];
  const double stored = static_cast<double>(dev.view(probe, 0).n_pages * dev.page_bytes()) +
                        static_cast<double>(dev.view(probe, 0).window_count) * 2.0 * static_cast<double>(row) * 4.0;
  Row prefill{codec, "prefill"};
  prefill.us = prefill_ms * 1e3;
  prefill.tokens = static_cast<double>(o.batch * o.chunk);
  prefill.bytes_read = prefill.tokens * 2.0 * static_cast<double>(row) * 4.0;
  prefill.bytes_written = stored * static_cast<double>(o.batch);

  // Decode: one token per sequence onto the sequences of the first set, from distinct rows of the inputs.
  size_t step = 0;
  const int decode_reps = std::max(o.reps, 2 * o.block);
  const double decode_ms = cuda::median_ms(
      [&] {
        const size_t token = step++ % o.chunk;
        for (size_t s = 0; s < o.batch; ++s)
          dev.append_device(prefill_sets[0][s], 0, k_dev.data() + s * chunk_floats + token * row,
                            v_dev.data() + s * chunk_floats + token * row, 1);
      },
      decode_reps, 1);
  Row decode{codec, "decode"};
  decode.us = decode_ms * 1e3;
  decode.tokens = static_cast<double>(o.batch);
  decode.bytes_read = decode.tokens * 2.0 * static_cast<double>(row) * 4.0;
  decode.bytes_written = decode.bytes_read;  // into the window; a page every T steps on top
  return {prefill, decode};
}

}  // namespace

void run_cuda_append_bench(const AppendBenchOptions& o) {
  KVQ_CHECK(o.batch > 0 && o.chunk > 0 && o.reps > 0, "bench append: batch, chunk and reps must be positive");
  const std::string device = cuda::device_name(0);
  const double copy_gbps = cuda::copy_bandwidth_gbps(kCopyBytes, 20);
  std::vector<std::string> codecs = o.codecs;
  if (codecs.empty())
    codecs = {"f16",         "bf16",        "int8",        "int4",       "kivi:2",
              "kivi:4",      "turbo_mse:1", "turbo_mse:2", "turbo_mse:3", "turbo_mse:4"};
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
  std::printf("%-14s %-8s %10s %12s %10s %10s %8s %8s\n", "codec", "mode", "us/call", "tokens/s", "MB read",
              "MB written", "GB/s", "of copy");
  for (const auto& r : j_rows)
    std::printf("%-14s %-8s %10.1f %12.4g %10.2f %10.2f %8.1f %8.2f\n", r["codec"].get<std::string>().c_str(),
                r["mode"].get<std::string>().c_str(), r["us_per_call"].get<double>(), r["tokens_per_s"].get<double>(),
                r["bytes_read"].get<double>() / 1e6, r["bytes_written"].get<double>() / 1e6, r["gbps"].get<double>(),
                r["bw_fraction"].get<double>());
}

}  // namespace kvq::cli

// kvq bench attention --device cuda: decode attention per codec pair on the GPU, against our bf16/bf16 kernel (the
// `baseline` row) and the device's measured copy bandwidth.
//
// Each pair's cache is built from a few pages of real data (key-like keys, Gaussian values, encoded by the CPU
// codecs) repeated on the device into distinct memory for every sequence, so that a large context needs no large
// host encode. Where one batch is smaller than several times the L2 cache, several copies of the batch are built
// and the timed calls rotate over them. Times are CUDA-event medians of one call (three kernels, replayed as a CUDA
// graph). --hot: every sequence of the batch is one sequence (its pages read batch times per call, from L2 where
// they fit): the kernels' time without the HBM traffic, against which the cold time tells memory from compute.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "cuda_bench.hpp"
#include "kvq/cuda.hpp"
#include "kvq/detail/cuda_bench_support.hpp"
#include "kvq/detail/synthetic.hpp"
#include "kvq/error.hpp"

namespace kvq::cli {
namespace {

constexpr size_t kSourcePages = 32;                     // distinct encoded pages per cache
constexpr size_t kRotateBytes = size_t{512} << 20;      // rotate over copies until this much is read per round
constexpr size_t kCopyBytes = size_t{1} << 30;          // copy-bandwidth buffers

struct Timed {
  std::string k, v, kernel;
  double bytes_per_token = 0, us = 0;
  size_t copies = 1;
  int splits = 0;
};

Timed time_pair(const CudaBenchOptions& o, const std::string& k, const std::string& v) {
  CacheConfig cfg;
  cfg.n_layers = 1;
  cfg.n_kv_heads = o.kv_heads;
  cfg.head_dim = o.dim;
  cfg.block_tokens = o.block;
  cfg.key_codec = k;
  cfg.value_codec = v;
  cfg.seed = o.seed;
  const size_t T = static_cast<size_t>(o.block);
  KVQ_CHECK(o.ctx % T == 0, "bench attention --device cuda: --ctx ", o.ctx, " must be a multiple of --block ", T);
  const size_t pages = o.ctx / T, source = std::min(kSourcePages, pages);
  cfg.capacity_pages = source;
  KVCache host(cfg);
  const size_t rows = source * T * static_cast<size_t>(o.kv_heads);
  const ChannelProfile profile = key_like_profile(o.dim, o.seed);
  const std::vector<float> keys = sample_profile(profile, rows, o.seed + 1);
  const std::vector<float> values = gaussian_vectors(rows, o.dim, o.seed + 2);
  if (!host.ready(0)) {
    const size_t n = std::min<size_t>(4096, rows);
    host.train_layer(0, keys.data(), values.data(), n);
  }
  const SeqId src = host.add_sequence();
  host.append(src, 0, keys.data(), values.data(), source * T);

  Timed t{k, v};
  t.bytes_per_token = static_cast<double>(o.kv_heads) *
                      static_cast<double>(host.key_codec(0).block_bytes() + host.value_codec(0).block_bytes()) /
                      static_cast<double>(T);
  const size_t batch_bytes = o.batch * pages * host.page_bytes();
  t.copies = o.hot ? 1 : std::clamp<size_t>((kRotateBytes + batch_bytes - 1) / batch_bytes, 1, 16);
  const size_t distinct = o.hot ? 1 : o.batch;
  KVCache dev = host.to(Device::cuda(), source + t.copies * distinct * pages);
  std::vector<std::vector<SeqId>> batches(t.copies);
  for (auto& b : batches) {
    for (size_t s = 0; s < distinct; ++s) b.push_back(cuda::add_sequence_repeating(dev, src, o.ctx));
    b.resize(o.batch, b.front());
  }
  std::vector<DecodePlan> plans;
  AttentionOptions options;
  options.splits = o.splits;
  for (const auto& b : batches) plans.emplace_back(dev, 0, b, o.q_heads, options);
  t.splits = plans[0].splits();
  t.kernel = attention_kernel(dev, 0);

  const std::vector<float> q = gaussian_vectors(o.batch * static_cast<size_t>(o.q_heads), o.dim, o.seed + 5);
  cuda::DeviceFloats q_dev(q.size()), out_dev(q.size());
  q_dev.upload(q);
  size_t next = 0;
  // Two warm-up calls per plan: the first runs the kernels, the second captures them as the graph the timed calls
  // replay.
  t.us = 1e3 * cuda::median_ms([&] { plans[next++ % plans.size()].run({q_dev.data(), q_dev.size()}, {out_dev.data(), out_dev.size()}); }, o.reps,
                               2 * static_cast<int>(t.copies) + 2);
  for (float x : out_dev.download()) KVQ_CHECK(std::isfinite(x), "bench attention: non-finite output of ", k, "/", v);
  return t;
}

}  // namespace

void run_cuda_bench(const CudaBenchOptions& o) {
  KVQ_CHECK(o.keys.size() == o.values.size(), "bench attention: ", o.keys.size(), " --k but ", o.values.size(),
            " --v (give them in pairs)");
  KVQ_CHECK(o.ctx > 0 && o.batch > 0 && o.reps > 0, "bench attention: ctx, batch and reps must be positive");
  const std::string device = cuda::device_name(0);
  const double copy_gbps = cuda::copy_bandwidth_gbps(kCopyBytes, 20);
  std::vector<Timed> timed;
  timed.push_back(time_pair(o, "bf16", "bf16"));
  for (size_t i = 0; i < o.keys.size(); ++i)
    if (!(o.keys[i] == "bf16" && o.values[i] == "bf16")) timed.push_back(time_pair(o, o.keys[i], o.values[i]));

  const double base_us = timed[0].us;
  auto row_json = [&](const Timed& t) {
    const double gbps = t.bytes_per_token * static_cast<double>(o.ctx * o.batch) / (t.us * 1e3);
    return nlohmann::ordered_json{{"k", t.k},
                                  {"v", t.v},
                                  {"ctx", o.ctx},
                                  {"batch", o.batch},
                                  {"bytes_per_token", t.bytes_per_token},
                                  {"us_per_call", t.us},
                                  {"gbps", gbps},
                                  {"bw_fraction", gbps / copy_gbps},
                                  {"speedup_vs_baseline", base_us / t.us},
                                  {"kernel", t.kernel},
                                  {"splits", t.splits},
                                  {"copies", t.copies}};
  };
  nlohmann::ordered_json rows = nlohmann::ordered_json::array();
  for (const Timed& t : timed) rows.push_back(row_json(t));
  const nlohmann::ordered_json result = {{"device", device},   {"copy_gbps", copy_gbps}, {"q_heads", o.q_heads},
                                         {"kv_heads", o.kv_heads}, {"dim", o.dim},         {"block", o.block},
                                         {"reps", o.reps},     {"hot", o.hot},           {"baseline", rows[0]},
                                         {"rows", rows}};
  if (o.json) {
    std::printf("%s\n", result.dump().c_str());
    return;
  }
  std::printf("%s, copy bandwidth %.1f GB/s\nctx %zu, batch %zu, %d query heads on %d kv heads, d=%d, T=%d%s\n\n",
              device.c_str(), copy_gbps, o.ctx, o.batch, o.q_heads, o.kv_heads, o.dim, o.block,
              o.hot ? ", hot (one sequence's pages for the whole batch)" : "");
  std::printf("%-14s %-14s %10s %10s %8s %8s %9s  %s\n", "k", "v", "bytes/tok", "us/call", "GB/s", "of copy",
              "vs bf16", "kernel");
  for (const auto& r : rows)
    std::printf("%-14s %-14s %10.1f %10.1f %8.1f %8.2f %8.2fx  %s\n", r["k"].get<std::string>().c_str(),
                r["v"].get<std::string>().c_str(), r["bytes_per_token"].get<double>(), r["us_per_call"].get<double>(),
                r["gbps"].get<double>(), r["bw_fraction"].get<double>(), r["speedup_vs_baseline"].get<double>(),
                r["kernel"].get<std::string>().c_str());
}

}  // namespace kvq::cli

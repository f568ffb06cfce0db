// kvq bench attention --ctx N --batch B --q-heads H --kv-heads G --dim D --threads T --k SPEC --v SPEC
//   [--k SPEC --v SPEC ...] [--block 64|128] [--reps R] [--hot] [--exact] [--json] [--device cpu|cuda] [--splits S]
// kvq bench append --device cuda [--batch B] [--chunk N] [--codec SPEC ...] [--json]   (cuda_append_bench.cpp)
// kvq bench decode ...   (decode_bench_command.cpp)
//
// Decode attention speed per (key codec, value codec) pair against the f16/f16 cache and this machine's read
// bandwidth. Every cache is built with key-like keys and Gaussian values appended in prefill chunks; unless --hot,
// a cache smaller than 4x the last-level cache is built several times over and the calls rotate over the copies,
// so that every call reads its pages from memory. The rows are timed alternately (one call of each per round) so
// that drifting load from other processes hits them alike; each row reports the median call. Beside the wall time,
// cpu_us_per_call is the CPU time per call of the caller and the pool's threads divided by the threads: on a
// machine shared with other work, the time the kernel itself took while its threads ran (their waits for memory
// included, and a worker's polling for the next task, at most 50 us after each call).
#include <sys/mman.h>
#include <time.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "commands.hpp"
#include "cuda_append_bench.hpp"
#include "cuda_bench.hpp"
#include "exact_attention_option.hpp"
#include "kvq/attention.hpp"
#include "kvq/cache.hpp"
#include "kvq/detail/synthetic.hpp"
#include "kvq/error.hpp"
#include "progress.hpp"
#include "system_info.hpp"

namespace kvq::cli {
namespace {

struct BenchOptions {
  size_t ctx = 32768;
  size_t batch = 1;
  int q_heads = 32, kv_heads = 8, dim = 128, threads = 2, block = 64, reps = 20;
  int splits = 0;  // cuda: ranges per sequence and kv head; 0: the plan's choice
  std::vector<std::string> keys, values;
  bool hot = false, json = false;
  uint64_t seed = 1;
  std::string device = "cpu";
};

using Clock = std::chrono::steady_clock;

double seconds_since(Clock::time_point start) {
  return std::chrono::duration<double>(Clock::now() - start).count();
}

// The CPU time of the calling thread and the pool's workers, each from its own thread clock (ThreadPool::
// worker_cpu_seconds says why not the process clock).
double calls_cpu_seconds(ThreadPool& pool) {
  timespec ts{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9 + pool.worker_cpu_seconds();
}

// The last-level cache this CPU's core sees: sysfs first (in a VM, sysconf may report the whole host's L3).
size_t last_level_cache_bytes() {
  std::ifstream in("/sys/devices/system/cpu/cpu0/cache/index3/size");
  size_t kib = 0;
  if (in >> kib) return kib * 1024;
  const long l3 = sysconf(_SC_LEVEL3_CACHE_SIZE);
  return l3 > 0 ? static_cast<size_t>(l3) : size_t{32} << 20;
}

/// GB/s of a streaming read of 1 GiB split over the threads, best of 5; in 2 MiB pages where granted, as the cache's
/// pool is.
double read_bandwidth(ThreadPool& pool) {
  constexpr size_t kBytes = size_t{1} << 30, kHuge = size_t{2} << 20;
  const std::unique_ptr<uint64_t, decltype(&std::free)> buffer(
      static_cast<uint64_t*>(std::aligned_alloc(kHuge, kBytes)), &std::free);
  KVQ_CHECK(buffer != nullptr, "read bandwidth: no memory for 1 GiB");
#if defined(MADV_HUGEPAGE)
  madvise(buffer.get(), kBytes, MADV_HUGEPAGE);
#endif
  const size_t words = kBytes / sizeof(uint64_t);
  uint64_t* data = buffer.get();
  for (size_t i = 0; i < words; ++i) data[i] = i;
  const size_t parts = static_cast<size_t>(pool.size());
  std::vector<uint64_t> sums(parts);
  double best = 0;
  for (int rep = 0; rep < 5; ++rep) {
    const auto start = Clock::now();
    pool.parallel_for(parts, [&](size_t p) {
      const uint64_t* w = data + p * words / parts;
      const size_t n = (p + 1) * words / parts - p * words / parts;
      uint64_t a = 0, b = 0, c = 0, d = 0;  // independent sums keep the loads in flight
      for (size_t i = 0; i + 4 <= n; i += 4) a += w[i], b += w[i + 1], c += w[i + 2], d += w[i + 3];
      sums[p] = a + b + c + d;
    });
    best = std::max(best, static_cast<double>(words * sizeof(uint64_t)) / seconds_since(start) / 1e9);
  }
  KVQ_CHECK(sums[0] != 1, "read bandwidth: impossible sum");  // keeps the sums alive
  return best;
}

// The tokens every cache holds: [ctx][kv heads][d] key-like keys and Gaussian values, and training samples.
struct Tokens {
  std::vector<float> keys, values, train_keys, train_values;
};

Tokens make_tokens(const BenchOptions& o) {
  const ChannelProfile profile = key_like_profile(o.dim, o.seed);
  const size_t rows = o.ctx * static_cast<size_t>(o.kv_heads);
  constexpr size_t kTrain = 4096;
  return {sample_profile(profile, rows, o.seed + 1), gaussian_vectors(rows, o.dim, o.seed + 2),
          sample_profile(profile, kTrain, o.seed + 3), gaussian_vectors(kTrain, o.dim, o.seed + 4)};
}

struct Row {
  std::string k, v;
  std::unique_ptr<KVCache> cache;
  size_t copies = 1;
  double bytes_per_token = 0;
  std::vector<double> times;      // seconds per call
  std::vector<double> cpu_times;  // process CPU seconds per call
};

CacheConfig config(const Row& row, const BenchOptions& o, size_t pages) {
  CacheConfig cfg;
  cfg.n_layers = 1;
  cfg.n_kv_heads = o.kv_heads;
  cfg.head_dim = o.dim;
  cfg.block_tokens = o.block;
  cfg.key_codec = row.k;
  cfg.value_codec = row.v;
  cfg.seed = o.seed;
  cfg.capacity_pages = pages;
  return cfg;
}

// How many copies of the batch the row needs so that its calls read from memory, and its bytes per token.
void plan(Row& row, const BenchOptions& o, size_t llc) {
  const KVCache probe(config(row, o, 1));
  const size_t T = static_cast<size_t>(o.block);
  const size_t bytes = o.batch * (o.ctx / T) * probe.page_bytes();
  row.copies = o.hot || bytes == 0 ? 1 : std::min<size_t>(64, (4 * llc + bytes - 1) / bytes);
  row.bytes_per_token = static_cast<double>(o.kv_heads) *
                        static_cast<double>(probe.key_codec(0).block_bytes() + probe.value_codec(0).block_bytes()) /
                        static_cast<double>(T);
}

// One cache holding copies x batch sequences of ctx tokens each.
void build(Row& row, const BenchOptions& o, const Tokens& tokens, Progress& bar, size_t& step, size_t steps) {
  row.cache = std::make_unique<KVCache>(config(row, o, row.copies * o.batch * (o.ctx / static_cast<size_t>(o.block))));
  KVCache& cache = *row.cache;
  if (!cache.ready(0)) cache.train_layer(0, tokens.train_keys.data(), tokens.train_values.data(), 4096);
  const size_t stride = static_cast<size_t>(o.kv_heads) * static_cast<size_t>(o.dim);
  constexpr size_t kChunk = 1024;  // prefill chunks
  for (size_t s = 0; s < row.copies * o.batch; ++s) {
    const SeqId id = cache.add_sequence();
    for (size_t pos = 0; pos < o.ctx; pos += kChunk) {
      const size_t n = std::min(kChunk, o.ctx - pos);
      cache.append(id, 0, tokens.keys.data() + pos * stride, tokens.values.data() + pos * stride, n);
    }
    bar.update(++step, steps);
  }
}

// Builds every row's caches and times them.
std::vector<Row> measure(const BenchOptions& o, ThreadPool& pool, double& read_gbps) {
  KVQ_CHECK(o.keys.size() == o.values.size(), "bench attention: ", o.keys.size(), " --k but ", o.values.size(),
            " --v (give them in pairs)");
  KVQ_CHECK(o.ctx > 0 && o.batch > 0 && o.reps > 0 && o.threads > 0, "bench attention: ctx, batch, reps and threads "
            "must be positive");
  KVQ_CHECK(o.q_heads > 0 && o.kv_heads > 0 && o.q_heads % o.kv_heads == 0, "bench attention: ", o.q_heads,
            " query heads is not a multiple of ", o.kv_heads, " kv heads");
  std::vector<Row> rows;
  rows.push_back({"f16", "f16"});
  for (size_t i = 0; i < o.keys.size(); ++i)
    if (!(o.keys[i] == "f16" && o.values[i] == "f16")) rows.push_back({o.keys[i], o.values[i]});

  Progress bar("bench attention");
  read_gbps = read_bandwidth(pool);
  const Tokens tokens = make_tokens(o);
  const size_t llc = last_level_cache_bytes();
  size_t step = 0, steps = static_cast<size_t>(o.reps) * rows.size();
  for (Row& r : rows) {
    plan(r, o, llc);
    steps += r.copies * o.batch;
  }
  for (Row& r : rows) build(r, o, tokens, bar, step, steps);

  const std::vector<float> q = gaussian_vectors(o.batch * static_cast<size_t>(o.q_heads), o.dim, o.seed + 5);
  std::vector<float> out(q.size());
  auto call = [&](Row& r, size_t copy) {
    const std::vector<SeqId> all = r.cache->sequences();
    const std::span<const SeqId> seqs(all.data() + copy * o.batch, o.batch);
    decode_attention(*r.cache, 0, seqs, q, out, {}, &pool);
  };
  for (Row& r : rows)  // warm-up: every copy once
    for (size_t c = 0; c < r.copies; ++c) call(r, c);
  for (int rep = 0; rep < o.reps; ++rep)
    for (Row& r : rows) {
      const auto start = Clock::now();
      const double cpu_start = calls_cpu_seconds(pool);
      call(r, static_cast<size_t>(rep) % r.copies);
      r.times.push_back(seconds_since(start));
      r.cpu_times.push_back(calls_cpu_seconds(pool) - cpu_start);
      bar.update(++step, steps);
    }
  return rows;
}

void run_bench(const BenchOptions& o) {
  if (o.device == "cuda") {
    run_cuda_bench({o.ctx, o.batch, o.q_heads, o.kv_heads, o.dim, o.block, o.reps, o.keys, o.values, o.json, o.hot,
                    o.seed, o.splits});
    return;
  }
  KVQ_CHECK(o.splits == 0, "bench attention: --splits is for --device cuda (the CPU splits over its threads)");
  ThreadPool pool(o.threads);
  double read_gbps = 0;
  std::vector<Row> rows = measure(o, pool, read_gbps);
  auto median = [](std::vector<double> t) {
    std::sort(t.begin(), t.end());
    return t.size() % 2 ? t[t.size() / 2] : (t[t.size() / 2 - 1] + t[t.size() / 2]) / 2;
  };
  const double f16_us = median(rows[0].times) * 1e6;
  nlohmann::ordered_json j_rows = nlohmann::ordered_json::array();
  for (Row& r : rows) {
    const double us = median(r.times) * 1e6;
    const double gbps = r.bytes_per_token * static_cast<double>(o.ctx * o.batch) / (us * 1e3);
    j_rows.push_back({{"k", r.k},
                      {"v", r.v},
                      {"ctx", o.ctx},
                      {"batch", o.batch},
                      {"bytes_per_token", r.bytes_per_token},
                      {"us_per_call", us},
                      {"gbps", gbps},
                      {"bw_fraction", gbps / read_gbps},
                      {"speedup_vs_f16", f16_us / us},
                      {"kernel", attention_kernel(*r.cache, 0)},
                      {"cpu_us_per_call", median(r.cpu_times) * 1e6 / o.threads},
                      {"copies", r.copies}});
  }
  const nlohmann::ordered_json result = {{"read_gbps", read_gbps},
                                         {"cpu", cpu_model()},
                                         {"isa", attention_isa()},
                                         {"threads", o.threads},
                                         {"q_heads", o.q_heads},
                                         {"kv_heads", o.kv_heads},
                                         {"dim", o.dim},
                                         {"block", o.block},
                                         {"reps", o.reps},
                                         {"hot", o.hot},
                                         {"rows", j_rows}};
  if (o.json) {
    std::printf("%s\n", result.dump().c_str());
    return;
  }
  std::printf("cpu %s, isa %s, %d threads, read bandwidth %.1f GB/s\n", cpu_model().c_str(), attention_isa().c_str(),
              o.threads, read_gbps);
  std::printf("ctx %zu, batch %zu, %d query heads on %d kv heads, d=%d, T=%d%s\n\n", o.ctx, o.batch, o.q_heads,
              o.kv_heads, o.dim, o.block, o.hot ? ", hot (one cache, reused)" : "");
  std::printf("%-14s %-14s %10s %10s %8s %8s %8s %10s  %s\n", "k", "v", "bytes/tok", "us/call", "GB/s", "of bw",
              "vs f16", "cpu us", "kernel");
  for (const auto& r : j_rows)
    std::printf("%-14s %-14s %10.1f %10.1f %8.2f %8.2f %7.2fx %10.1f  %s\n", r["k"].get<std::string>().c_str(),
                r["v"].get<std::string>().c_str(), r["bytes_per_token"].get<double>(), r["us_per_call"].get<double>(),
                r["gbps"].get<double>(), r["bw_fraction"].get<double>(), r["speedup_vs_f16"].get<double>(),
                r["cpu_us_per_call"].get<double>(), r["kernel"].get<std::string>().c_str());
}

}  // namespace

void add_bench_command(CLI::App& app) {
  CLI::App* bench = app.add_subcommand("bench", "speed measurements");
  bench->require_subcommand(1);
  auto o = std::make_shared<BenchOptions>();
  CLI::App* cmd = bench->add_subcommand("attention", "decode attention per codec pair vs f16 and the read bandwidth");
  cmd->add_option("--ctx", o->ctx, "tokens per sequence")->check(CLI::Range(1, 1 << 22))->capture_default_str();
  cmd->add_option("--batch", o->batch, "sequences per call")->check(CLI::Range(1, 4096))->capture_default_str();
  cmd->add_option("--q-heads", o->q_heads, "query heads")->check(CLI::Range(1, 1024))->capture_default_str();
  cmd->add_option("--kv-heads", o->kv_heads, "kv heads")->check(CLI::Range(1, 1024))->capture_default_str();
  cmd->add_option("--dim", o->dim, "head dimension")->check(CLI::Range(16, 512))->capture_default_str();
  cmd->add_option("--threads", o->threads, "worker threads")->check(CLI::Range(1, 1024))->capture_default_str();
  cmd->add_option("--k", o->keys, "key codec spec, once per pair (repeat with --v)");
  cmd->add_option("--v", o->values, "value codec spec, once per pair");
  cmd->add_option("--block", o->block, "tokens per page")->check(CLI::IsMember({64, 128}))->capture_default_str();
  cmd->add_option("--reps", o->reps, "timed calls per pair")->check(CLI::Range(1, 1 << 20))->capture_default_str();
  cmd->add_option("--seed", o->seed, "random seed")->check(CLI::NonNegativeNumber)->capture_default_str();
  cmd->add_flag("--hot", o->hot,
                "one cache per pair, reused: with a small --ctx, the compute time alone (cuda: one sequence's pages "
                "for the whole batch)");
  add_exact_attention_option(*cmd);
  cmd->add_flag("--json", o->json, "print one JSON object");
  cmd->add_option("--device", o->device, "cpu, or cuda (device 0, against the bf16/bf16 kernel)")
      ->check(CLI::IsMember({"cpu", "cuda"}))->capture_default_str();
  cmd->add_option("--splits", o->splits, "cuda: split-K ranges per sequence and kv head (0: the plan's choice)")
      ->check(CLI::Range(0, 1 << 16))->capture_default_str();
  cmd->callback([o] { run_bench(*o); });

  auto a = std::make_shared<AppendBenchOptions>();
  CLI::App* append = bench->add_subcommand("append", "the CUDA append kernels per codec vs the copy bandwidth");
  append->add_option("--batch", a->batch, "sequences")->check(CLI::Range(1, 4096))->capture_default_str();
  append->add_option("--chunk", a->chunk, "prefill tokens per sequence")
      ->check(CLI::Range(1, 1 << 20))->capture_default_str();
  append->add_option("--kv-heads", a->kv_heads, "kv heads")->check(CLI::Range(1, 1024))->capture_default_str();
  append->add_option("--dim", a->dim, "head dimension")->check(CLI::Range(16, 512))->capture_default_str();
  append->add_option("--block", a->block, "tokens per page")->check(CLI::IsMember({64, 128}))->capture_default_str();
  append->add_option("--codec", a->codecs, "codec spec (keys and values), repeatable; default: every codec with "
                                           "append kernels");
  append->add_option("--reps", a->reps, "timed calls per row")->check(CLI::Range(1, 1 << 20))->capture_default_str();
  append->add_option("--seed", a->seed, "random seed")->check(CLI::NonNegativeNumber)->capture_default_str();
  append->add_flag("--json", a->json, "print one JSON object");
  append->add_option("--device", a->device, "cuda (the append kernels run on device 0)")
      ->check(CLI::IsMember({"cuda"}))->capture_default_str();
  append->callback([a] { run_cuda_append_bench(*a); });

  add_decode_bench_command(*bench);
}

}  // namespace kvq::cli

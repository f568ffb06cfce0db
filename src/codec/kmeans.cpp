#include "codec/kmeans.hpp"

#include <algorithm>
#include <limits>
#include <numeric>
#include <thread>

#include "codec/nearest_centroid.hpp"
#include "kvq/attention.hpp"  // ThreadPool
#include "kvq/detail/random.hpp"
#include "kvq/error.hpp"

namespace kvq {
namespace {

// Below this many point-centroid pairs per assignment, starting threads costs more than it saves.
constexpr size_t kMinPairsForThreads = size_t{1} << 22;

// `count` distinct indices drawn uniformly from [0, n), in increasing order (partial Fisher-Yates).
std::vector<size_t> uniform_subsample(size_t n, size_t count, Rng& rng) {
  std::vector<size_t> all(n);
  std::iota(all.begin(), all.end(), size_t{0});
  for (size_t i = 0; i < count; ++i) std::swap(all[i], all[i + rng.next_u64() % (n - i)]);
  all.resize(count);
  std::sort(all.begin(), all.end());
  return all;
}

double squared_distance(const float* a, const float* b, int dim) {
  double s = 0;
  for (int i = 0; i < dim; ++i) {
    const double e = static_cast<double>(a[i]) - b[i];
    s += e * e;
  }
  return s;
}

// Sum in four independent chains (a fixed order, so deterministic), a serial sum being latency-bound.
double chained_sum(const std::vector<float>& v) {
  double part[4] = {0, 0, 0, 0};
  size_t i = 0;
  for (; i + 4 <= v.size(); i += 4)
    for (int l = 0; l < 4; ++l) part[l] += v[i + l];
  for (; i < v.size(); ++i) part[0] += v[i];
  return (part[0] + part[1]) + (part[2] + part[3]);
}

// k-means++: each seed drawn with probability proportional to its squared distance to the nearest seed so far.
std::vector<float> kmeans_plus_plus(const float* x, size_t n, int dim, int k, size_t sample, Rng& rng) {
  const std::vector<size_t> pick = uniform_subsample(n, std::min(n, sample), rng);
  const size_t m = pick.size();
  std::vector<float> coords(static_cast<size_t>(dim) * m);  // dimension-major, so the distance loop vectorizes
  for (size_t p = 0; p < m; ++p)
    for (int i = 0; i < dim; ++i) coords[static_cast<size_t>(i) * m + p] = x[pick[p] * dim + i];
  std::vector<float> nearest(m, std::numeric_limits<float>::infinity()), d2(m), centroids(static_cast<size_t>(k) * dim);
  size_t chosen = rng.next_u64() % m;
  for (int c = 0; c < k; ++c) {
    float* centroid = centroids.data() + static_cast<size_t>(c) * dim;
    for (int i = 0; i < dim; ++i) centroid[i] = coords[static_cast<size_t>(i) * m + chosen];
    if (c + 1 == k) break;
    std::fill(d2.begin(), d2.end(), 0.0f);
    for (int i = 0; i < dim; ++i) {
      const float* row = coords.data() + static_cast<size_t>(i) * m;
      for (size_t p = 0; p < m; ++p) {
        const float e = row[p] - centroid[i];
        d2[p] += e * e;
      }
    }
    for (size_t p = 0; p < m; ++p) nearest[p] = std::min(nearest[p], d2[p]);
    const double total = chained_sum(nearest);
    if (total <= 0) {  // every sampled point already is a seed: duplicates, cleaned up by the Lloyd re-seeding
      chosen = rng.next_u64() % m;
      continue;
    }
    const double target = rng.uniform() * total;
    double running = 0;
    chosen = m - 1;
    for (size_t p = 0; p < m; ++p) {
      running += nearest[p];
      if (running > target && nearest[p] > 0) {
        chosen = p;
        break;
      }
    }
  }
  return centroids;
}

// Assigns every point to its nearest centroid; dist2[i] = exact squared distance to it (double).
void assign(const float* x, size_t n, int dim, const std::vector<float>& centroids, int k, ThreadPool& pool,
            std::vector<uint32_t>& label, std::vector<double>& dist2) {
  const CentroidTable table(centroids.data(), k, dim);
  const size_t tasks = pool.size() == 1 ? 1 : 4 * static_cast<size_t>(pool.size());
  pool.parallel_for(tasks, [&](size_t task) {
    const size_t begin = n * task / tasks, end = n * (task + 1) / tasks;
    table.nearest(x + begin * dim, end - begin, label.data() + begin);
    for (size_t i = begin; i < end; ++i)
      dist2[i] = squared_distance(x + i * dim, centroids.data() + static_cast<size_t>(label[i]) * dim, dim);
  });
}

// Centroids = means of their clusters; an empty cluster takes the farthest point not yet taken by another.
void update(const float* x, size_t n, int dim, int k, const std::vector<uint32_t>& label,
            const std::vector<double>& dist2, std::vector<float>& centroids) {
  std::vector<double> sum(static_cast<size_t>(k) * dim, 0.0);
  std::vector<size_t> count(k, 0);
  for (size_t i = 0; i < n; ++i) {
    ++count[label[i]];
    for (int j = 0; j < dim; ++j) sum[static_cast<size_t>(label[i]) * dim + j] += x[i * dim + j];
  }
  std::vector<int> empty;
  for (int c = 0; c < k; ++c) {
    if (count[c] == 0) {
      empty.push_back(c);
      continue;
    }
    for (int j = 0; j < dim; ++j)
      centroids[static_cast<size_t>(c) * dim + j] =
          static_cast<float>(sum[static_cast<size_t>(c) * dim + j] / static_cast<double>(count[c]));
  }
  if (empty.empty()) return;
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), size_t{0});
  const size_t take = std::min(empty.size(), n);
  std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(take), order.end(),
                    [&](size_t a, size_t b) { return dist2[a] > dist2[b] || (dist2[a] == dist2[b] && a < b); });
  for (size_t e = 0; e < take; ++e)
    std::copy_n(x + order[e] * dim, dim, centroids.begin() + static_cast<std::ptrdiff_t>(empty[e]) * dim);
}

double mean(const std::vector<double>& v) {
  return std::accumulate(v.begin(), v.end(), 0.0) / static_cast<double>(v.size());
}

}  // namespace

KMeansResult kmeans(const float* x, size_t n, int dim, const KMeansOptions& o) {
  const int k = o.k;
  KVQ_CHECK(k >= 1, "kmeans: need at least one centroid, got K = ", k);
  KVQ_CHECK(dim >= 1 && dim <= CentroidTable::kMaxDim, "kmeans: point dimension ", dim, " not in [1, ",
            CentroidTable::kMaxDim, "]");
  KVQ_CHECK(n >= static_cast<size_t>(k), "kmeans: ", n, " points cannot make ", k,
            " centroids (need at least as many points as centroids)");
  KVQ_CHECK(x != nullptr, "kmeans: null points");
  KVQ_CHECK(o.max_iterations >= 0 && o.tolerance >= 0, "kmeans: negative iteration count or tolerance");
  KVQ_CHECK(o.max_points == 0 || o.max_points >= static_cast<size_t>(k), "kmeans: a subsample of ", o.max_points,
            " points cannot make ", k, " centroids");
  Rng rng(o.seed);

  // The training subsample, gathered contiguously.
  std::vector<float> subsample;
  if (o.max_points != 0 && o.max_points < n) {
    const std::vector<size_t> pick = uniform_subsample(n, o.max_points, rng);
    subsample.resize(pick.size() * dim);
    for (size_t p = 0; p < pick.size(); ++p) std::copy_n(x + pick[p] * dim, dim, subsample.begin() + p * dim);
    x = subsample.data();
    n = pick.size();
  }

  const size_t seed_points = o.seed_points != 0 ? o.seed_points : std::max<size_t>(8 * static_cast<size_t>(k), 8192);
  const unsigned hardware = std::max(1u, std::thread::hardware_concurrency());
  const int threads = o.threads > 0 ? o.threads : static_cast<int>(std::min(hardware, 16u));
  ThreadPool pool(n * static_cast<size_t>(k) < kMinPairsForThreads ? 1 : threads);

  KMeansResult r;
  r.centroids = kmeans_plus_plus(x, n, dim, k, std::max(seed_points, static_cast<size_t>(k)), rng);
  std::vector<uint32_t> label(n);
  std::vector<double> dist2(n);
  assign(x, n, dim, r.centroids, k, pool, label, dist2);
  r.objective.push_back(mean(dist2));
  for (int it = 0; it < o.max_iterations && r.objective.back() > 0; ++it) {
    update(x, n, dim, k, label, dist2, r.centroids);
    assign(x, n, dim, r.centroids, k, pool, label, dist2);
    const double before = r.objective.back();
    r.objective.push_back(mean(dist2));
    if (before - r.objective.back() <= o.tolerance * before) break;
  }
  return r;
}

}  // namespace kvq

// k-means, the exact nearest-centroid search, and the vecinfer product-quantization codec, each checked against a
// plain double-precision reference on fresh random data.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <vector>

#include "codec/block_layout.hpp"
#include "codec/kmeans.hpp"
#include "codec/nearest_centroid.hpp"
#include "codec/vecinfer.hpp"
#include "core/bitpack.hpp"
#include "kvq/detail/random.hpp"
#include "kvq/detail/synthetic.hpp"
#include "kvq/error.hpp"
#include "test_seed.hpp"

namespace kvq {
namespace {

double squared_distance(const float* a, const float* b, int dim) {
  double s = 0;
  for (int i = 0; i < dim; ++i) s += (static_cast<double>(a[i]) - b[i]) * (static_cast<double>(a[i]) - b[i]);
  return s;
}

double squared_norm(const float* a, int dim) {
  double s = 0;
  for (int i = 0; i < dim; ++i) s += static_cast<double>(a[i]) * a[i];
  return s;
}

// The exact nearest centroid: double distances, ties to the lowest index.
uint32_t brute_force_nearest(const float* x, const float* centroids, int k, int dim) {
  uint32_t best = 0;
  double best_d = std::numeric_limits<double>::infinity();
  for (int j = 0; j < k; ++j) {
    const double d = squared_distance(x, centroids + static_cast<size_t>(j) * dim, dim);
    if (d < best_d) best_d = d, best = static_cast<uint32_t>(j);
  }
  return best;
}

// Checks searched indices against the double-precision argmin. A different index is accepted only at a genuine
// float tie: its exact distance within float rounding of the search's form ||c||^2 - 2<x, c> of the best one.
// Returns the number of such ties.
int expect_exact_argmin(const float* x, size_t n, const float* centroids, int k, int dim, const uint32_t* idx) {
  int ties = 0;
  double max_norm = 0;
  for (int j = 0; j < k; ++j) max_norm = std::max(max_norm, squared_norm(centroids + static_cast<size_t>(j) * dim, dim));
  for (size_t p = 0; p < n; ++p) {
    const float* xp = x + p * dim;
    const uint32_t ref = brute_force_nearest(xp, centroids, k, dim);
    if (idx[p] == ref) continue;
    EXPECT_LT(idx[p], static_cast<uint32_t>(k)) << "point " << p;
    if (idx[p] >= static_cast<uint32_t>(k)) return ties;
    const double got = squared_distance(xp, centroids + static_cast<size_t>(idx[p]) * dim, dim);
    const double want = squared_distance(xp, centroids + static_cast<size_t>(ref) * dim, dim);
    const double rounding = 1e-6 * (squared_norm(xp, dim) + max_norm);
    EXPECT_LE(got - want, rounding) << "point " << p << ": index " << idx[p] << " at distance " << got
                                    << ", the nearest is " << ref << " at " << want;
    ++ties;
  }
  return ties;
}

// ---- nearest-centroid search -------------------------------------------------------------------------------------

TEST(NearestCentroid, MatchesBruteForceDoubleArgmin) {
  KVQ_FRESH_SEED();
  for (int dim : {4, 8})
    for (int k : {256, 4096, 37}) {
      SCOPED_TRACE("s = " + std::to_string(dim) + ", K = " + std::to_string(k));
      const auto centroids = gaussian_vectors(static_cast<size_t>(k), dim, seed + k + dim);
      const size_t n_random = k == 4096 ? 300 : 1000;
      // Points: fresh Gaussian ones, large ones far outside the codebook, and exact copies of centroids.
      auto x = gaussian_vectors(n_random, dim, seed + 1);
      for (size_t p = 0; p < n_random / 4; ++p)
        for (int i = 0; i < dim; ++i) x[p * dim + i] *= 30.0f;
      std::vector<uint32_t> copied;
      Rng rng(seed + 2);
      for (int c = 0; c < 100; ++c) {
        copied.push_back(static_cast<uint32_t>(rng.next_u64() % static_cast<uint64_t>(k)));
        x.insert(x.end(), centroids.begin() + copied.back() * dim, centroids.begin() + (copied.back() + 1) * dim);
      }
      const size_t n = x.size() / dim;
      const CentroidTable table(centroids.data(), k, dim);
      ASSERT_EQ(table.size(), k);
      std::vector<uint32_t> idx(n, 0xFFFFFFFFu);
      table.nearest(x.data(), n, idx.data());
      const int ties = expect_exact_argmin(x.data(), n, centroids.data(), k, dim, idx.data());
      EXPECT_LE(ties, 2) << "float ties should be rare on continuous random data";
      for (size_t c = 0; c < copied.size(); ++c)
        EXPECT_EQ(idx[n_random + c], copied[c]) << "a point equal to centroid " << copied[c];
      // One point at a time gives the same answers as the batch.
      for (size_t p = 0; p < n; p += 97) {
        uint32_t one = 0xFFFFFFFFu;
        table.nearest(x.data() + p * dim, 1, &one);
        EXPECT_EQ(one, idx[p]) << "point " << p;
      }
    }
}

TEST(NearestCentroid, TiesGoToTheLowestIndex) {
  KVQ_FRESH_SEED();
  constexpr int kDim = 4, kK = 300;
  auto centroids = gaussian_vectors(kK, kDim, seed);
  // Centroid 250 duplicates 7 and centroid 290 duplicates 180: points on them must get 7 and 180.
  std::copy_n(centroids.begin() + 7 * kDim, kDim, centroids.begin() + 250 * kDim);
  std::copy_n(centroids.begin() + 180 * kDim, kDim, centroids.begin() + 290 * kDim);
  const CentroidTable table(centroids.data(), kK, kDim);
  std::vector<float> x(centroids.begin() + 250 * kDim, centroids.begin() + 251 * kDim);
  x.insert(x.end(), centroids.begin() + 290 * kDim, centroids.begin() + 291 * kDim);
  uint32_t idx[2];
  table.nearest(x.data(), 2, idx);
  EXPECT_EQ(idx[0], 7u);
  EXPECT_EQ(idx[1], 180u);
  // All centroids identical: index 0 for every point.
  const std::vector<float> same(static_cast<size_t>(kK) * kDim, 0.5f);
  const CentroidTable flat(same.data(), kK, kDim);
  const auto points = gaussian_vectors(50, kDim, seed + 1);
  std::vector<uint32_t> zero(50, 99);
  flat.nearest(points.data(), 50, zero.data());
  for (uint32_t i : zero) EXPECT_EQ(i, 0u);
}

// The search's form ||c||^2 - 2 <x, c> with every product and sum rounded on its own (volatile: no fused
// multiply-add), ||c||^2 summed in coordinate order; the strictly smaller value wins, so ties go to the lowest index.
uint32_t unfused_nearest(const float* x, const float* centroids, int k, int dim) {
  uint32_t best = 0;
  float best_value = std::numeric_limits<float>::infinity();
  for (int j = 0; j < k; ++j) {
    const float* c = centroids + static_cast<size_t>(j) * dim;
    volatile float value = 0;
    for (int i = 0; i < dim; ++i) {
      const volatile float square = c[i] * c[i];
      value = value + square;
    }
    for (int i = 0; i < dim; ++i) {
      const volatile float minus_2x = 0.0f + -2.0f * x[i];
      const volatile float product = minus_2x * c[i];
      value = value + product;
    }
    if (value < best_value) best_value = value, best = static_cast<uint32_t>(j);
  }
  return best;
}

// Every instruction-set clone of the search rounds as written (none fuses a product into its sum), so the indices
// are the same on every CPU, and the same as vecinfer's CUDA append kernel, which rounds the same way. Points at the
// midpoint of two centroids are near-ties, where a fused multiply-add would pick the other centroid now and then.
TEST(NearestCentroid, RoundsEveryProductAndSumOnItsOwn) {
  KVQ_FRESH_SEED();
  for (int dim : {4, 8}) {
    constexpr int kK = 256;
    constexpr size_t kPoints = 4000;
    const auto centroids = gaussian_vectors(kK, dim, seed + dim);
    const CentroidTable table(centroids.data(), kK, dim);
    Rng rng(seed + 10 + dim);
    std::vector<float> x(kPoints * dim);
    for (size_t p = 0; p < kPoints; ++p) {
      const size_t a = rng.next_u64() % kK, b = rng.next_u64() % kK;
      for (int i = 0; i < dim; ++i)
        x[p * dim + i] = 0.5f * (centroids[a * dim + i] + centroids[b * dim + i]);
    }
    std::vector<uint32_t> idx(kPoints);
    table.nearest(x.data(), kPoints, idx.data());
    size_t differ = 0, first = kPoints;
    for (size_t p = 0; p < kPoints; ++p)
      if (idx[p] != unfused_nearest(x.data() + p * dim, centroids.data(), kK, dim) && differ++ == 0) first = p;
    EXPECT_EQ(differ, 0u) << "s = " << dim << ": " << differ << " of " << kPoints
                          << " midpoints get another index than the unfused search, the first point " << first;
  }
}

TEST(NearestCentroid, RejectsBadShapes) {
  const std::vector<float> c(64, 0.f);
  EXPECT_THROW(CentroidTable(c.data(), 0, 4), Error);
  EXPECT_THROW(CentroidTable(c.data(), 4, 0), Error);
  EXPECT_THROW(CentroidTable(c.data(), 2, 17), Error);
}

// ---- k-means -----------------------------------------------------------------------------------------------------

// Mean squared distance of points to their exact nearest centroid.
double objective(const std::vector<float>& x, const std::vector<float>& centroids, int dim) {
  const size_t n = x.size() / dim;
  const int k = static_cast<int>(centroids.size() / dim);
  double s = 0;
  for (size_t p = 0; p < n; ++p) {
    const uint32_t j = brute_force_nearest(x.data() + p * dim, centroids.data(), k, dim);
    s += squared_distance(x.data() + p * dim, centroids.data() + static_cast<size_t>(j) * dim, dim);
  }
  return s / static_cast<double>(n);
}

TEST(KMeans, ObjectiveDecreasesAndBeatsRandomCentroids) {
  KVQ_FRESH_SEED();
  constexpr int kDim = 4, kK = 64;
  // Heavy-tailed, correlated points: a Gaussian mixed with a scaled copy, so the clusters are uneven.
  auto x = gaussian_vectors(4000, kDim, seed);
  for (size_t p = 0; p < 1000; ++p)
    for (int i = 0; i < kDim; ++i) x[p * kDim + i] = 5.0f * x[p * kDim + i] + 3.0f;
  KMeansOptions o;
  o.k = kK;
  o.seed = seed + 1;
  o.tolerance = 0;  // run until the assignment stops changing
  o.max_iterations = 20;
  const KMeansResult r = kmeans(x.data(), 4000, kDim, o);
  ASSERT_EQ(r.centroids.size(), static_cast<size_t>(kK) * kDim);
  ASSERT_GE(r.objective.size(), 2u);
  ASSERT_LE(r.objective.size(), 21u);
  for (size_t i = 1; i < r.objective.size(); ++i)
    EXPECT_LE(r.objective[i], r.objective[i - 1] * (1 + 1e-9)) << "Lloyd update " << i;
  // The reported objective is the exact one of the returned centroids.
  EXPECT_NEAR(r.objective.back(), objective(x, r.centroids, kDim), 1e-9 * r.objective.back());
  // Measured over 400 seeds: at most 0.78 of the k-means++ objective, 0.61 of that of random centroids.
  EXPECT_LT(r.objective.back(), 0.9 * r.objective.front()) << "Lloyd iterations should improve on the seeds";
  // K random points as centroids, without iterations: k-means must do much better.
  std::vector<float> random_centroids;
  Rng rng(seed + 2);
  for (int c = 0; c < kK; ++c) {
    const size_t p = rng.next_u64() % 4000;
    random_centroids.insert(random_centroids.end(), x.begin() + p * kDim, x.begin() + (p + 1) * kDim);
  }
  EXPECT_LT(r.objective.back(), 0.75 * objective(x, random_centroids, kDim));
}

TEST(KMeans, RecoversWellSeparatedClusters) {
  KVQ_FRESH_SEED();
  constexpr int kDim = 4, kClusters = 8, kPerCluster = 150;
  constexpr float kNoise = 0.001f;
  Rng rng(seed);
  // Centers: corners of a hypercube of side 10 (pairwise at least 10 apart), scrambled.
  std::vector<float> centers;
  for (int c = 0; c < kClusters; ++c)
    for (int i = 0; i < kDim; ++i)
      centers.push_back(10.0f * static_cast<float>((c >> i) & 1) + static_cast<float>(rng.normal()));
  std::vector<float> x;
  std::vector<int> truth;
  for (int p = 0; p < kClusters * kPerCluster; ++p) {
    const int c = static_cast<int>(rng.next_u64() % kClusters);
    truth.push_back(c);
    for (int i = 0; i < kDim; ++i) x.push_back(centers[c * kDim + i] + kNoise * static_cast<float>(rng.normal()));
  }
  KMeansOptions o;
  o.k = kClusters;
  o.seed = seed + 1;
  const KMeansResult r = kmeans(x.data(), truth.size(), kDim, o);
  // Every true center has exactly one centroid next to it (so the clusters map one to one).
  for (int c = 0; c < kClusters; ++c) {
    int near = 0;
    for (int j = 0; j < kClusters; ++j)
      if (squared_distance(centers.data() + c * kDim, r.centroids.data() + j * kDim, kDim) < 0.01) ++near;
    EXPECT_EQ(near, 1) << "true cluster " << c;
  }
  EXPECT_LT(r.objective.back(), 4 * kDim * kNoise * kNoise);
}

TEST(KMeans, DeterministicGivenTheSeedWhateverTheThreads) {
  KVQ_FRESH_SEED();
  const auto x = gaussian_vectors(20000, 4, seed);
  KMeansOptions o;
  o.k = 256;
  o.max_iterations = 3;
  o.seed = seed + 1;
  o.threads = 1;
  const KMeansResult a = kmeans(x.data(), 20000, 4, o);
  o.threads = 3;
  const KMeansResult b = kmeans(x.data(), 20000, 4, o);
  EXPECT_EQ(a.centroids, b.centroids);
  EXPECT_EQ(a.objective, b.objective);
  o.seed = seed + 2;
  EXPECT_NE(kmeans(x.data(), 20000, 4, o).centroids, a.centroids);
}

TEST(KMeans, ReseedsEmptyClustersAndHandlesDuplicates) {
  KVQ_FRESH_SEED();
  // 21 distinct points, the first repeated 400 times, into 21 centroids, with k-means++ drawing from only 21
  // points: the subsample is mostly copies of the first point, so seeds repeat, their clusters come out empty,
  // and only re-seeding them from far points reaches the optimum of one centroid on each distinct point.
  const auto distinct = gaussian_vectors(21, 4, seed);
  std::vector<float> x;
  for (int rep = 0; rep < 400; ++rep) x.insert(x.end(), distinct.begin(), distinct.begin() + 4);
  x.insert(x.end(), distinct.begin() + 4, distinct.end());
  KMeansOptions o;
  o.k = 21;
  o.seed = seed + 1;
  o.seed_points = 21;
  const KMeansResult r = kmeans(x.data(), x.size() / 4, 4, o);
  EXPECT_LT(r.objective.back(), 1e-12);
  // Fewer distinct points than centroids: no crash, duplicate centroids, zero objective.
  o.k = 30;
  o.seed_points = 0;
  EXPECT_LT(kmeans(x.data(), x.size() / 4, 4, o).objective.back(), 1e-12);
}

TEST(KMeans, RejectsFewerPointsThanCentroids) {
  const auto x = gaussian_vectors(100, 4, 1);
  KMeansOptions o;
  o.k = 256;
  try {
    kmeans(x.data(), 100, 4, o);
    FAIL() << "100 points for 256 centroids must be rejected";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("100 points cannot make 256 centroids"), std::string::npos) << e.what();
  }
  o.k = 16;
  EXPECT_THROW(kmeans(x.data(), 100, 0, o), Error);
  o.max_points = 8;
  EXPECT_THROW(kmeans(x.data(), 100, 4, o), Error);
}

// ---- the vecinfer codec ------------------------------------------------------------------------------------------

std::unique_ptr<VecInferCodec> trained_vecinfer(const std::string& spec, int d, uint64_t seed,
                                                const std::vector<float>& train) {
  auto codec = make_codec(spec, CodecParams{d, 64, seed, Role::key});
  auto* vq = dynamic_cast<VecInferCodec*>(codec.get());
  EXPECT_NE(vq, nullptr);
  codec.release();
  std::unique_ptr<VecInferCodec> owned(vq);
  owned->train(train.data(), train.size() / d);
  return owned;
}

// sum ||x - x^||^2 / sum ||x||^2 over n vectors encoded in blocks of the codec.
double relative_error(const Codec& codec, const std::vector<float>& x) {
  const int d = codec.dim(), T = codec.block_tokens();
  const size_t n = x.size() / d;
  std::vector<uint8_t> block(codec.block_bytes());
  std::vector<float> xhat(static_cast<size_t>(T) * d);
  double err = 0, ref = 0;
  for (size_t start = 0; start < n; start += T) {
    const int m = static_cast<int>(std::min<size_t>(T, n - start));
    codec.encode(x.data() + start * d, m, block.data());
    codec.decode(block.data(), m, xhat.data());
    for (size_t i = 0; i < static_cast<size_t>(m) * d; ++i) {
      const double v = x[start * d + i];
      err += (v - xhat[i]) * (v - xhat[i]);
      ref += v * v;
    }
  }
  return err / ref;
}

// Measured at d = 128 over 200 profiles (train 4096 vectors, test 1024 others): relative error 0.005..0.029
// smoothed, 0.008..0.075 unsmoothed; the smoothed/unsmoothed ratio of one profile is 0.27..0.91 (median 0.40), of
// the summed errors of 4 profiles at most 0.80 in 200000 resamples. Gaussian data: 0.101 either way.
TEST(VecInfer, ReconstructionOfKeyLikeDataIsBoundedAndSmoothingHelps) {
  KVQ_FRESH_SEED();
  constexpr int kD = 128;
  double smoothed_sum = 0, plain_sum = 0;
  for (uint64_t layer = 0; layer < 4; ++layer) {
    const uint64_t s = seed + 10 * layer;
    const auto profile = key_like_profile(kD, s);
    const auto train = sample_profile(profile, 4096, s + 1);
    const auto test = sample_profile(profile, 1024, s + 2);  // a different sample of the same layer
    const double smoothed = relative_error(*trained_vecinfer("vecinfer:8/4", kD, s, train), test);
    const double plain = relative_error(*trained_vecinfer("vecinfer:8/4,smooth=0", kD, s, train), test);
    EXPECT_LT(smoothed, 0.06) << "layer " << layer;
    smoothed_sum += smoothed;
    plain_sum += plain;
  }
  EXPECT_LT(smoothed_sum, 0.85 * plain_sum) << "smoothing the outlier channels should cut the error";
  // Without outliers smoothing has nothing to fix, and must not hurt.
  const auto train = gaussian_vectors(4096, kD, seed + 3), test = gaussian_vectors(1024, kD, seed + 4);
  const double smoothed = relative_error(*trained_vecinfer("vecinfer:8/4", kD, seed, train), test);
  const double plain = relative_error(*trained_vecinfer("vecinfer:8/4,smooth=0", kD, seed, train), test);
  EXPECT_LT(smoothed, 1.03 * plain);
  EXPECT_LT(smoothed, 0.13);
}

TEST(VecInfer, SmoothingFactorsFollowTheChannelScale) {
  KVQ_FRESH_SEED();
  constexpr int kD = 64;
  const auto profile = key_like_profile(kD, seed);
  const auto train = sample_profile(profile, 2048, seed + 1);
  const auto codec = trained_vecinfer("vecinfer:8/4", kD, seed, train);
  const std::vector<float>& lambda = codec->smoothing();
  ASSERT_EQ(lambda.size(), static_cast<size_t>(kD));
  double log_sum = 0;
  for (float l : lambda) log_sum += std::log(l);
  EXPECT_NEAR(log_sum / kD, 0.0, 1e-5) << "geometric mean 1";
  // lambda_c^2 proportional to the channel's RMS: check the ratio against the profile's own statistics.
  for (int c = 0; c < kD; ++c) {
    const double rms = std::sqrt(profile.mean[c] * profile.mean[c] + profile.stddev[c] * profile.stddev[c]);
    const double rms0 = std::sqrt(profile.mean[0] * profile.mean[0] + profile.stddev[0] * profile.stddev[0]);
    EXPECT_NEAR(lambda[c] * lambda[c] / (lambda[0] * lambda[0]), rms / rms0, 0.1 * rms / rms0) << "channel " << c;
  }
  const auto plain = trained_vecinfer("vecinfer:8/4,smooth=0", kD, seed, train);
  for (float l : plain->smoothing()) EXPECT_EQ(l, 1.0f);
}

TEST(VecInfer, EncoderPicksTheNearestCentroidOfItsSubVectors) {
  KVQ_FRESH_SEED();
  for (const char* spec : {"vecinfer:8/4", "vecinfer:9/8"}) {
    SCOPED_TRACE(spec);
    constexpr int kD = 64, kT = 64;
    const auto profile = key_like_profile(kD, seed);
    const auto codec = trained_vecinfer(spec, kD, seed, sample_profile(profile, 2048, seed + 1));
    const int s = codec->sub_dim(), K = codec->centroids(), n_sub = kD / s;
    ASSERT_EQ(codec->codebook().size(), static_cast<size_t>(K) * s);
    const auto x = sample_profile(profile, kT, seed + 2);
    std::vector<uint8_t> block(codec->block_bytes());
    codec->encode(x.data(), kT, block.data());
    std::vector<float> y(x.size());
    codec->smoothed_rotated(x.data(), kT, y.data());
    // Codes as laid out in block_layout.hpp: one byte-padded row of d/s c-bit indices per token.
    const layout::VecInfer l{kD, kT, static_cast<size_t>(s), static_cast<size_t>(codec->codeword_bits())};
    std::vector<uint32_t> codes;
    for (int t = 0; t < kT; ++t) {
      std::vector<uint16_t> row(n_sub);
      unpack_bits16(block.data() + t * l.row_bytes(), n_sub, codec->codeword_bits(), row.data());
      codes.insert(codes.end(), row.begin(), row.end());
    }
    const int ties = expect_exact_argmin(y.data(), codes.size(), codec->codebook().data(), K, s, codes.data());
    EXPECT_LE(ties, 2);
    // decode_space returns exactly those centroids.
    std::vector<float> space(x.size());
    codec->decode_space(block.data(), kT, space.data());
    for (size_t j = 0; j < codes.size(); ++j)
      for (int i = 0; i < s; ++i) ASSERT_EQ(space[j * s + i], codec->codebook()[codes[j] * s + i]);
  }
}

TEST(VecInfer, TrainingIsDeterministicGivenTheSeed) {
  KVQ_FRESH_SEED();
  constexpr int kD = 64;
  const auto train = sample_profile(key_like_profile(kD, seed), 2048, seed + 1);
  const auto a = trained_vecinfer("vecinfer:8/4", kD, seed, train);
  const auto b = trained_vecinfer("vecinfer:8/4", kD, seed, train);
  EXPECT_EQ(a->codebook(), b->codebook());
  EXPECT_EQ(a->smoothing(), b->smoothing());
}

// norm=1 stores gamma_t = |x_t|^2 / <x_t, x^_t> (capped at 2, never reached here), so <x_t, decode(x_t)> = |x_t|^2 up to the fp16 rounding of gamma;
// the plain codec's decode shrinks (<x, x^> ~ (1 - D) |x|^2, D ~ 0.01-0.03 on this data).
TEST(VecInfer, NormOptionMakesTheSelfInnerProductExact) {
  KVQ_FRESH_SEED();
  constexpr int kD = 64, kT = 64;
  const auto profile = key_like_profile(kD, seed);
  const auto train = sample_profile(profile, 2048, seed + 1);
  const auto x = sample_profile(profile, kT, seed + 2);
  for (bool norm : {false, true}) {
    SCOPED_TRACE(norm ? "norm=1" : "norm=0");
    const auto codec = trained_vecinfer(norm ? "vecinfer:8/4,norm=1" : "vecinfer:8/4", kD, seed, train);
    EXPECT_DOUBLE_EQ(codec->bits_per_element(), norm ? 2.0 + 16.0 / kD : 2.0);
    std::vector<uint8_t> block(codec->block_bytes());
    codec->encode(x.data(), kT - 3, block.data());  // a partial block: the padding tokens decode to zero
    std::vector<float> xhat(x.size());
    codec->decode(block.data(), kT, xhat.data());
    double ratio_sum = 0;
    for (int t = 0; t < kT - 3; ++t) {
      double dot = 0;
      for (int c = 0; c < kD; ++c) dot += static_cast<double>(x[t * kD + c]) * xhat[t * kD + c];
      const double ratio = dot / squared_norm(x.data() + t * kD, kD);
      ratio_sum += ratio;
      if (norm) {
        EXPECT_NEAR(ratio, 1.0, 1e-3) << "token " << t;
      }
    }
    if (norm) {
      for (int t = kT - 3; t < kT; ++t) EXPECT_EQ(squared_norm(xhat.data() + t * kD, kD), 0.0) << "token " << t;
    } else {
      EXPECT_LT(ratio_sum / (kT - 3), 0.999) << "a nearest-centroid decode shrinks";
    }
  }
}

TEST(VecInfer, SavedStateRestoresTheCodec) {
  KVQ_FRESH_SEED();
  constexpr int kD = 64;
  const auto profile = key_like_profile(kD, seed);
  const auto trained = trained_vecinfer("vecinfer:8/4", kD, seed, sample_profile(profile, 2048, seed + 1));
  const std::vector<uint8_t> state = trained->state();
  ASSERT_EQ(state.size(), (kD + 256 * 4) * sizeof(float));
  // A codec with another seed's rotation would decode differently: restore into the same spec and params.
  auto restored = make_codec("vecinfer:8/4", CodecParams{kD, 64, seed, Role::key});
  EXPECT_TRUE(restored->state().empty());
  restored->load_state(state);
  EXPECT_TRUE(restored->trained());
  EXPECT_EQ(restored->state(), state);
  const auto x = sample_profile(profile, 64, seed + 2);
  std::vector<uint8_t> a(trained->block_bytes()), b(a.size());
  trained->encode(x.data(), 64, a.data());
  restored->encode(x.data(), 64, b.data());
  EXPECT_EQ(a, b);
  std::vector<float> xa(x.size()), xb(x.size());
  trained->decode(a.data(), 64, xa.data());
  restored->decode(b.data(), 64, xb.data());
  EXPECT_EQ(xa, xb);
  // Malformed states are rejected with the reason.
  EXPECT_THROW(restored->load_state(std::vector<uint8_t>(state.begin(), state.end() - 4)), Error);
  auto bad = state;
  const float zero = 0.0f;
  std::memcpy(bad.data() + 5 * sizeof(float), &zero, sizeof zero);
  try {
    restored->load_state(bad);
    FAIL() << "a zero smoothing factor must be rejected";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("channel 5"), std::string::npos) << e.what();
  }
}

TEST(VecInfer, BitsPerElementAsDocumented) {
  const struct {
    const char* spec;
    double bits;
  } cases[] = {{"vecinfer", 2.0},       {"vecinfer:8/4", 2.0},  {"vecinfer:10/4", 2.5},
               {"vecinfer:12/8", 1.5},  {"vecinfer:8/8", 1.0},  {"vecinfer:10/8", 1.25}};
  for (const auto& c : cases) {
    const auto codec = make_codec(c.spec, CodecParams{128, 64, 0, Role::key});
    EXPECT_DOUBLE_EQ(codec->bits_per_element(), c.bits) << c.spec;
    EXPECT_TRUE(codec->needs_training());
    EXPECT_FALSE(codec->trained());
  }
  EXPECT_EQ(make_codec("vecinfer:8/4", CodecParams{128, 64, 0, Role::key})->block_bytes(),
            (layout::VecInfer{128, 64, 4, 8}.block_bytes()));
  EXPECT_DOUBLE_EQ(make_codec("vecinfer:8/4,norm=1", CodecParams{128, 64, 0, Role::key})->bits_per_element(), 2.125);
  // d = 96, s = 8, c = 9: 108 bits a token, padded to 14 bytes.
  constexpr layout::VecInfer padded{96, 64, 8, 9};
  EXPECT_EQ(padded.row_bytes(), 14u);
}

TEST(VecInfer, ClearErrors) {
  const CodecParams p{64, 64, 0, Role::key};
  auto expect_error = [&](const char* spec, const char* words) {
    try {
      make_codec(spec, p);
      ADD_FAILURE() << spec << " must be rejected";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << spec << ": " << e.what();
    }
  };
  expect_error("vecinfer:7/4", "codeword bits c must be in 8..12, got 7");
  expect_error("vecinfer:13/4", "codeword bits c must be in 8..12, got 13");
  expect_error("vecinfer:8/5", "sub-vector length s must be 4 or 8, got 5");
  expect_error("vecinfer:8/0", "sub-vector length s must be 4 or 8, got 0");
  expect_error("vecinfer:8/4/2", "at most 2 argument");
  expect_error("vecinfer:8/4,smooth=2", "smooth must be 0 or 1");
  expect_error("vecinfer:8/4,norm=yes", "norm must be 0 or 1");
  expect_error("vecinfer:8/4,zz=1", "unknown option 'zz'");

  auto codec = make_codec("vecinfer:8/4", p);
  const auto x = gaussian_vectors(64, 64, 1);
  std::vector<uint8_t> block(codec->block_bytes());
  try {
    codec->encode(x.data(), 64, block.data());
    FAIL() << "encode before train must be rejected";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("train() must be called before encode"), std::string::npos) << e.what();
  }
  EXPECT_THROW(codec->prepare(x.data(), 1), Error);
  EXPECT_THROW(codec->decode_space(block.data(), 1, std::vector<float>(64).data()), Error);
  // 15 vectors x 16 sub-vectors = 240 < 256 centroids.
  try {
    codec->train(x.data(), 15);
    FAIL() << "training with fewer sub-vectors than centroids must be rejected";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("training needs at least 256 sub-vectors"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(codec->trained());
  codec->train(x.data(), 16);  // 256 sub-vectors: enough
  EXPECT_TRUE(codec->trained());
}

}  // namespace
}  // namespace kvq

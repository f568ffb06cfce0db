// int8, int4: the SRFT paper's scheme. x' = R x (the spec's `rot`, default default_rotation(d)), x''_c = x'_c /
// lambda_c, then per token and group of G consecutive channels an absmax scale s (fp16) and symmetric codes
// q = round(x'' / s) in [-qmax, qmax] (qmax 127 / 7). The codec space is the rotated space: y_c = lambda_c * s * q_c.
// Layout: layout::IntGroup (two's-complement codes in 64-byte tiles, arranged differently for keys and values so that
// the fused attention kernels load 16 tokens x 32 / bits channels, or 32 / bits tokens x 16 channels, at once).
//
// The fp16 scale: s = max|x''| / qmax rounded to the nearest fp16, or up to the next one where the nearest would
// leave |x'' / s| > qmax + 0.5 (only subnormal scales are that coarse). So rounding and the clamp to +-qmax never
// move an element by more than half a step: |x'_c - y_c| <= lambda_c * s / 2 (plus fp32 rounding), with
// |s - max|x''| / qmax| <= 2^-11 max|x''| / qmax for a normal scale and <= 2^-24 for a subnormal one. Rounding to
// nearest rather than always up keeps the largest element of a group from being stretched on average (a bias in
// inner products). A group of zeros stores s = 0 and decodes to zeros.
//
// lambda (per rotated channel, default 1): train() sets lambda_c proportional to the RMS of rotated channel c over
// the examples, normalized to geometric mean 1, so that each channel's step follows its typical size and one large
// channel no longer coarsens its whole group. RMS values below 1e-3 of the largest are raised to that floor (a dead
// channel must not get lambda = 0). state() / load_state() carry lambda.
//
// learn=K (K even): train() also learns K Householder reflectors over the base rotation, R = H_K ... H_1 R_base,
// that lower the group maxima of the rotated examples (codec/reflector_learning.hpp), before it sets lambda. Such a
// codec needs train() (or a state) before it encodes; a state of lambda alone gives the base rotation.
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
#include <vector>

#include "codec/int_group.hpp"

#include "codec/block_layout.hpp"
#include "codec/codec_factories.hpp"
#include "codec/fp16_bounds.hpp"
#include "codec/reflector_learning.hpp"
#include "core/half.hpp"
#include "kvq/detail/random.hpp"
#include "kvq/error.hpp"
#include "rotation/rotations.hpp"

namespace kvq {
namespace {

constexpr size_t kTrainChunk = 1024;   // rows rotated at a time by train()
constexpr double kLambdaFloor = 1e-3;  // smallest RMS kept, relative to the largest

// The stored fp16 scale of a group whose largest |x''| is amax (see the top of the file).
uint16_t group_scale(float amax, int qmax) {
  const double exact = static_cast<double>(amax) / qmax;
  const uint16_t nearest = f32_to_f16(static_cast<float>(exact));
  return amax <= (qmax + 0.5) * static_cast<double>(f16_to_f32(nearest)) ? nearest : f16_round_up(exact);
}

// max |v_i| over n values; NaN if any value is NaN (std::max alone would drop it).
float max_abs(const float* v, int n) {
  float m = 0;
  for (int i = 0; i < n && !std::isnan(m); ++i) m = std::isnan(v[i]) ? v[i] : std::max(m, std::fabs(v[i]));
  return m;
}

// The spec's learn=K: 0 where absent.
int learned_reflectors(const CodecSpec& spec, int d) {
  const std::string text = spec.option("learn", "");
  if (text.empty()) return 0;
  int k = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), k);
  KVQ_CHECK(ec == std::errc() && end == text.data() + text.size() && k >= 2 && k <= d && k % 2 == 0, spec.str(),
            ": learn=", text, " is not an even count of reflectors in [2, ", d, "]");
  return k;
}

class IntGroupCodec final : public Codec {
 public:
  IntGroupCodec(const CodecSpec& spec, const CodecParams& params, int bits, int group)
      : Codec(spec, params),
        qmax_(bits == 8 ? 127 : 7),
        learn_(learned_reflectors(spec, params.dim)),
        lambda_(static_cast<size_t>(params.dim), 1.0f) {
    KVQ_CHECK(group == 16 || group == 32 || group == 64, spec.str(), ": group size ", group,
              " unsupported (use 16, 32 or 64)");
    KVQ_CHECK(params.dim % group == 0, spec.str(), ": group size ", group, " does not divide head dimension ",
              params.dim);
    layout_ = layout::IntGroup{static_cast<size_t>(params.dim), static_cast<size_t>(params.block_tokens),
                               static_cast<size_t>(bits), static_cast<size_t>(group), params.role == Role::key};
    rotation_ = rotation_from_spec(spec, params);
    set_layout(layout_.block_bytes(), params.dim);
  }

  // A learned rotation is asked for: encoding with the base one instead would be a silent fallback.
  bool needs_training() const override { return learn_ > 0; }
  int bits() const { return static_cast<int>(layout_.bits); }
  int group() const { return static_cast<int>(layout_.G); }
  int groups() const { return static_cast<int>(layout_.groups()); }
  const std::vector<float>& lambda() const { return lambda_; }

  /// The d codes of token t, as integers in [-qmax, qmax].
  void read_codes(const uint8_t* block, int t, int8_t* q) const {
    const size_t ut = static_cast<size_t>(t);
    for (size_t c = 0; c < layout_.d; ++c)
      q[c] = static_cast<int8_t>(layout_.code(block[layout_.code_byte(ut, c)], layout_.code_shift(ut, c)));
  }
  /// The d/G group scales of token t.
  void read_scales(const uint8_t* block, int t, float* s) const {
    for (int g = 0; g < groups(); ++g) {
      uint16_t h;
      std::memcpy(&h, block + layout_.scale_byte(static_cast<size_t>(t), static_cast<size_t>(g)), 2);
      s[g] = f16_to_f32(h);
    }
  }

 protected:
  void encode_block(const float* x, int n, uint8_t* block) const override {
    const int d = dim(), G = group(), T = block_tokens();
    std::memset(block, 0, block_bytes());
    std::vector<float> xs(static_cast<size_t>(T) * d, 0.0f);  // x'' of every token; tokens n..T-1 stay zero
    rotation_->apply(x, xs.data(), static_cast<size_t>(n));
    for (size_t i = 0; i < static_cast<size_t>(n) * d; ++i) xs[i] /= lambda_[i % d];
    std::vector<int8_t> q(d);
    for (int t = 0; t < T; ++t) {
      const float* xt = xs.data() + static_cast<size_t>(t) * d;
      for (int g = 0; g < groups(); ++g) {
        const float* v = xt + g * G;
        const float amax = max_abs(v, G);
        const uint16_t h = group_scale(amax, qmax_);
        const float s = f16_to_f32(h);
        KVQ_CHECK(std::isfinite(s), spec().str(), ": token ", t, " channels ", g * G, "..", g * G + G - 1,
                  " reach ", amax, " after rotation and lambda, beyond the fp16 scale range (|x| <= ",
                  65504.0 * qmax_, ")");
        const float lim = static_cast<float>(qmax_);  // |v / s| <= qmax + 0.5: clamping costs at most half a step
        for (int i = 0; i < G; ++i)
          q[g * G + i] = s > 0 ? static_cast<int8_t>(std::clamp(std::nearbyint(v[i] / s), -lim, lim)) : int8_t{0};
        std::memcpy(block + layout_.scale_byte(static_cast<size_t>(t), static_cast<size_t>(g)), &h, 2);
      }
      write_codes(q.data(), t, block);
    }
  }

  void decode_block_space(const uint8_t* block, int n, float* y) const override {
    const int d = dim(), G = group();
    std::vector<int8_t> q(d);
    std::vector<float> s(groups());
    for (int t = 0; t < n; ++t) {
      read_codes(block, t, q.data());
      read_scales(block, t, s.data());
      float* yt = y + static_cast<size_t>(t) * d;
      for (int c = 0; c < d; ++c) yt[c] = lambda_[c] * s[c / G] * static_cast<float>(q[c]);
    }
  }

  std::unique_ptr<Scorer> make_scorer(const float* q, int n_q) const override;

  // acc_c += lambda_c * sum_t w_t s_t,g(c) q_t,c: the tokens are summed in code units, lambda applied once.
  void accumulate_block(const float* w, int n_q, const uint8_t* block, int n, float* acc) const override {
    const int d = dim(), G = group(), T = block_tokens();
    // Per-thread scratch: attention calls this once per page, which must not allocate.
    thread_local std::vector<float> sum, s;
    thread_local std::vector<int8_t> q;
    sum.assign(static_cast<size_t>(n_q) * d, 0.0f);
    s.resize(static_cast<size_t>(groups()));
    q.resize(static_cast<size_t>(d));
    for (int t = 0; t < n; ++t) {
      read_codes(block, t, q.data());
      read_scales(block, t, s.data());
      for (int i = 0; i < n_q; ++i) {
        float* si = sum.data() + static_cast<size_t>(i) * d;
        const float wt = w[static_cast<size_t>(i) * T + t];
        for (int g = 0; g < groups(); ++g) {
          const float ws = wt * s[g];
          for (int c = g * G; c < g * G + G; ++c) si[c] += ws * static_cast<float>(q[c]);
        }
      }
    }
    for (size_t j = 0; j < static_cast<size_t>(n_q) * d; ++j) acc[j] += lambda_[j % d] * sum[j];
  }

  // The state is lambda as d little-endian fp32 values, or nothing while lambda is all 1 and nothing is learned;
  // with learned reflectors, lambda and then the K reflectors (K x d fp32).
  std::vector<uint8_t> state() const override {
    if (reflectors_.empty() && std::all_of(lambda_.begin(), lambda_.end(), [](float l) { return l == 1.0f; }))
      return {};
    std::vector<float> floats = lambda_;
    for (const auto& r : reflectors_) floats.insert(floats.end(), r.begin(), r.end());
    std::vector<uint8_t> bytes(floats.size() * sizeof(float));
    std::memcpy(bytes.data(), floats.data(), bytes.size());
    return bytes;
  }

  void load_state_impl(const std::vector<uint8_t>& bytes) override {
    const size_t d = lambda_.size(), scales = d * sizeof(float), learned = scales + learn_ * scales;
    if (bytes.empty()) {
      std::fill(lambda_.begin(), lambda_.end(), 1.0f);
      set_reflectors({});
      return;
    }
    KVQ_CHECK(bytes.size() == scales || (learn_ > 0 && bytes.size() == learned), spec().str(), ": state of ",
              bytes.size(), " bytes, expected ", scales, " (", dim(), " fp32 channel scales)",
              learn_ > 0 ? detail::concat(" or ", learned, " (and ", learn_, " learned reflectors)") : "");
    std::vector<float> floats(bytes.size() / sizeof(float));
    std::memcpy(floats.data(), bytes.data(), bytes.size());
    for (int c = 0; c < dim(); ++c)
      KVQ_CHECK(std::isfinite(floats[c]) && floats[c] > 0, spec().str(), ": state gives channel ", c, " the scale ",
                floats[c], " (must be positive and finite)");
    std::vector<std::vector<float>> reflectors;
    for (auto at = floats.begin() + d; at != floats.end(); at += d) reflectors.emplace_back(at, at + d);
    set_reflectors(std::move(reflectors));  // make_householder refuses non-finite or zero reflectors
    floats.resize(d);
    lambda_ = std::move(floats);
  }

  void train_impl(const float* x, size_t n) override {
    const int d = dim();
    if (learn_ > 0) learn_rotation(x, n);
    std::vector<double> sum_sq(d, 0.0);
    std::vector<float> xr(kTrainChunk * d);
    for (size_t start = 0; start < n; start += kTrainChunk) {
      const size_t rows = std::min(kTrainChunk, n - start);
      rotation_->apply(x + start * d, xr.data(), rows);
      for (size_t i = 0; i < rows * d; ++i) sum_sq[i % d] += static_cast<double>(xr[i]) * xr[i];
    }
    const double largest = *std::max_element(sum_sq.begin(), sum_sq.end());
    std::fill(lambda_.begin(), lambda_.end(), 1.0f);
    if (largest == 0) return;  // no examples or all zero: nothing to calibrate
    std::vector<double> rms(d);
    double mean_log = 0;
    for (int c = 0; c < d; ++c) {
      rms[c] = std::sqrt(std::max(sum_sq[c], kLambdaFloor * kLambdaFloor * largest) / static_cast<double>(n));
      mean_log += std::log(rms[c]) / d;
    }
    for (int c = 0; c < d; ++c) lambda_[c] = static_cast<float>(rms[c] / std::exp(mean_log));
  }

 private:
  // Reflectors learned on the examples under the base rotation (lambda comes after, from the result).
  void learn_rotation(const float* x, size_t n) {
    const int d = dim();
    set_reflectors({});
    std::vector<float> y(n * d);
    for (size_t start = 0; start < n; start += kTrainChunk)
      rotation_->apply(x + start * d, y.data() + start * d, std::min(kTrainChunk, n - start));
    detail::ReflectorLearning how;
    how.reflectors = learn_;
    how.group = group();
    how.seed = derive_seed(params().seed, 7);
    set_reflectors(detail::learn_reflectors(y.data(), n, d, how));
  }

  void set_reflectors(std::vector<std::vector<float>> reflectors) {
    auto base = rotation_from_spec(spec(), params());
    rotation_ = reflectors.empty() ? std::move(base)
                                   : make_composed_rotation(std::move(base), make_householder(dim(), reflectors));
    reflectors_ = std::move(reflectors);
  }

  // Into a zeroed block.
  void write_codes(const int8_t* q, int t, uint8_t* block) const {
    const size_t ut = static_cast<size_t>(t);
    const unsigned mask = (1u << layout_.bits) - 1;
    for (size_t c = 0; c < layout_.d; ++c)
      block[layout_.code_byte(ut, c)] |=
          static_cast<uint8_t>((static_cast<unsigned>(q[c]) & mask) << layout_.code_shift(ut, c));
  }

  layout::IntGroup layout_{};
  int qmax_;
  int learn_;                                    // K of learn=K, or 0
  std::vector<float> lambda_;                    // per rotated channel
  std::vector<std::vector<float>> reflectors_;  // learned, H_1 first; empty: the base rotation
};

// Scores from the codes: <q, k^> = sum_g s_g sum_{c in g} q_c (lambda_c (R q)_c), lambda folded into the query.
class IntGroupScorer final : public Scorer {
 public:
  IntGroupScorer(const IntGroupCodec& codec, const float* q, int n_q)
      : Scorer(n_q, codec.block_tokens()),
        codec_(codec),
        lq_(static_cast<size_t>(n_q) * codec.dim()),
        codes_(codec.dim()),
        scales_(codec.groups()) {
    const int d = codec.dim();
    codec.to_space(q, n_q, lq_.data());
    for (size_t j = 0; j < lq_.size(); ++j) lq_[j] *= codec.lambda()[j % d];
  }

  void scores(const uint8_t* block, int n, float* out) override {
    const int d = codec_.dim(), G = codec_.group();
    for (int t = 0; t < n; ++t) {
      codec_.read_codes(block, t, codes_.data());
      codec_.read_scales(block, t, scales_.data());
      for (int i = 0; i < n_queries(); ++i) {
        const float* qi = lq_.data() + static_cast<size_t>(i) * d;
        float total = 0;
        for (int g = 0; g < codec_.groups(); ++g) {
          float dot = 0;
          for (int c = g * G; c < g * G + G; ++c) dot += qi[c] * static_cast<float>(codes_[c]);
          total += scales_[g] * dot;
        }
        out[static_cast<size_t>(i) * block_tokens() + t] = total;
      }
    }
  }

 private:
  const IntGroupCodec& codec_;
  std::vector<float> lq_;  // n_q x d: lambda_c (R q)_c
  std::vector<int8_t> codes_;
  std::vector<float> scales_;
};

std::unique_ptr<Scorer> IntGroupCodec::make_scorer(const float* q, int n_q) const {
  return std::make_unique<IntGroupScorer>(*this, q, n_q);
}

}  // namespace

std::optional<IntGroupParams> int_group_params(const Codec& codec) {
  const auto* c = dynamic_cast<const IntGroupCodec*>(&codec);
  if (!c) return std::nullopt;
  return IntGroupParams{c->bits(), c->group(), c->lambda().data()};
}

std::unique_ptr<Codec> make_int_group_codec(const CodecSpec& spec, const CodecParams& params) {
  check_spec_shape(spec, 1, "rot,learn");
  return std::make_unique<IntGroupCodec>(spec, params, spec.name == "int8" ? 8 : 4, spec.arg(0, 32));
}

}  // namespace kvq

// kivi:b (b = 2, 3 or 4): KIVI's asymmetric quantization with a zero point, no rotation (the codec space is the
// original space). Keys: one range per channel over the n encoded tokens of a block, which gives outlier channels
// their own range; values: one range per token and group of G channels (option g, default 32). Layout: layout::Kivi.
//
// A range [lo, hi] is stored as m = lo rounded down to fp16 and s = the smallest fp16 >= (hi - m) / (2^b - 1), so
// every code q = round((x - m) / s) lies in [0, 2^b - 1] without clamping and |x - (m + s q)| <= s / 2 (plus fp32
// rounding). The outward rounding costs at most one fp16 step each: hi - m <= hi - lo + ulp16(lo), and s exceeds
// (hi - m) / (2^b - 1) by at most one fp16 step of s. A constant range stores s = 0 only when lo is an exact fp16.
//
// Partial key blocks: the channel ranges come from the first n tokens only; tokens n..T-1 are stored as the zero
// vector clamped into those ranges (no reader looks at them).
#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstring>
#include <vector>

#include "codec/kivi.hpp"

#include "codec/block_layout.hpp"
#include "codec/codec_factories.hpp"
#include "codec/fp16_bounds.hpp"
#include "core/half.hpp"
#include "kvq/error.hpp"

namespace kvq {
namespace {

class KiviCodec final : public Codec {
 public:
  KiviCodec(const CodecSpec& spec, const CodecParams& params, int bits, int group)
      : Codec(spec, params), levels_((1 << bits) - 1) {
    KVQ_CHECK(params.dim % group == 0, spec.str(), ": value group size ", group, " does not divide head dimension ",
              params.dim);
    KVQ_CHECK(bits != 3 || params.role != Role::key || params.dim % 32 == 0, spec.str(),
              ": 3-bit keys need a head dimension that is a multiple of 32 (their high bits lie in 32-channel lanes), "
              "not ", params.dim);
    layout_ = layout::Kivi{static_cast<size_t>(params.dim), static_cast<size_t>(params.block_tokens),
                           static_cast<size_t>(bits), static_cast<size_t>(group), params.role == Role::key};
    set_layout(layout_.block_bytes(), params.dim);
  }

  bool per_channel() const { return layout_.key; }
  int group() const { return static_cast<int>(layout_.G); }
  int groups() const { return dim() / group(); }  // value groups per token

  const layout::Kivi& layout() const { return layout_; }
  /// Codes of tokens 0..n-1, n x d values in [0, 2^b - 1].
  void read_codes(const uint8_t* block, int n, uint8_t* q) const {
    const size_t d = layout_.d;
    for (size_t t = 0; t < static_cast<size_t>(n); ++t)
      for (size_t c = 0; c < d; ++c) q[t * d + c] = static_cast<uint8_t>(layout_.read_code(block, t, c));
  }
  /// Minimum and scale number p (layout::Kivi::param).
  float min_at(const uint8_t* block, size_t p) const { return load_f16(block + layout_.mins_offset() + 2 * p); }
  float scale_at(const uint8_t* block, size_t p) const { return load_f16(block + layout_.scales_offset() + 2 * p); }

 protected:
  void encode_block(const float* x, int n, uint8_t* block) const override {
    const int d = dim(), T = block_tokens();
    std::memset(block, 0, block_bytes());
    std::vector<float> xs(static_cast<size_t>(T) * d, 0.0f);  // tokens n..T-1 are zero vectors
    std::copy(x, x + static_cast<size_t>(n) * d, xs.begin());
    std::vector<uint8_t> q(xs.size());
    if (per_channel()) {
      for (int c = 0; c < d; ++c) {
        float lo = n > 0 ? x[c] : 0.0f, hi = lo;  // over the n encoded tokens only
        for (int t = 1; t < n; ++t) {
          lo = std::min(lo, x[static_cast<size_t>(t) * d + c]);
          hi = std::max(hi, x[static_cast<size_t>(t) * d + c]);
        }
        const auto [m, s] = store_range(block, static_cast<size_t>(c), lo, hi, c, -1);
        for (int t = 0; t < T; ++t) {
          const size_t i = static_cast<size_t>(t) * d + c;
          q[i] = code(xs[i], m, s);
        }
      }
    } else {
      const int G = group();
      for (int t = 0; t < T; ++t)
        for (int g = 0; g < groups(); ++g) {
          const float* v = xs.data() + static_cast<size_t>(t) * d + g * G;
          const auto [lo, hi] = std::minmax_element(v, v + G);
          const auto [m, s] = store_range(block, param_index(t, g * G), *lo, *hi, g, t);
          for (int i = 0; i < G; ++i) q[static_cast<size_t>(t) * d + g * G + i] = code(v[i], m, s);
        }
    }
    for (size_t t = 0; t < static_cast<size_t>(T); ++t)
      for (size_t c = 0; c < static_cast<size_t>(d); ++c) layout_.write_code(block, t, c, q[t * d + c]);
  }

  void decode_block_space(const uint8_t* block, int n, float* y) const override {
    const int d = dim();
    std::vector<uint8_t> q(static_cast<size_t>(n) * d);
    read_codes(block, n, q.data());
    for (int t = 0; t < n; ++t)
      for (int c = 0; c < d; ++c) {
        const size_t i = static_cast<size_t>(t) * d + c, p = param_index(t, c);
        y[i] = min_at(block, p) + scale_at(block, p) * static_cast<float>(q[i]);
      }
  }

  std::unique_ptr<Scorer> make_scorer(const float* q, int n_q) const override;

  // Keys: acc_c += m_c sum_t w_t + s_c sum_t w_t q_t,c. Values: acc_c += w_t m_t,g + (w_t s_t,g) q_t,c.
  void accumulate_block(const float* w, int n_q, const uint8_t* block, int n, float* acc) const override {
    const int d = dim(), T = block_tokens(), G = group();
    std::vector<uint8_t> q(static_cast<size_t>(n) * d);
    read_codes(block, n, q.data());
    for (int i = 0; i < n_q; ++i) {
      const float* wi = w + static_cast<size_t>(i) * T;
      float* ai = acc + static_cast<size_t>(i) * d;
      if (per_channel()) {
        float w_sum = 0;
        std::vector<float> wq(d, 0.0f);
        for (int t = 0; t < n; ++t) {
          w_sum += wi[t];
          for (int c = 0; c < d; ++c) wq[c] += wi[t] * static_cast<float>(q[static_cast<size_t>(t) * d + c]);
        }
        for (int c = 0; c < d; ++c) ai[c] += min_at(block, c) * w_sum + scale_at(block, c) * wq[c];
        continue;
      }
      for (int t = 0; t < n; ++t)
        for (int g = 0; g < groups(); ++g) {
          const size_t p = param_index(t, g * G);
          const float wm = wi[t] * min_at(block, p), ws = wi[t] * scale_at(block, p);
          const uint8_t* qt = q.data() + static_cast<size_t>(t) * d;
          for (int c = g * G; c < g * G + G; ++c) ai[c] += wm + ws * static_cast<float>(qt[c]);
        }
    }
  }

 private:
  struct Range {
    float min, scale;
  };

  static float load_f16(const uint8_t* p) {
    uint16_t h;
    std::memcpy(&h, p, 2);
    return f16_to_f32(h);
  }
  size_t param_index(int t, int c) const { return layout_.param(static_cast<size_t>(t), static_cast<size_t>(c)); }

  // Stores [lo, hi] as parameter p (outward fp16 rounding, see the top of the file). `index` and `token` name the
  // range in errors (token -1: a key channel).
  Range store_range(uint8_t* block, size_t p, float lo, float hi, int index, int token) const {
    const uint16_t hm = f16_round_down(lo);
    const float m = f16_to_f32(hm);
    const uint16_t hs = f16_round_up((static_cast<double>(hi) - m) / levels_);
    const float s = f16_to_f32(hs);
    KVQ_CHECK(std::isfinite(m) && std::isfinite(s), spec().str(), ": ",
              token < 0 ? detail::concat("key channel ", index)
                        : detail::concat("value token ", token, " channels ", index * group(), "..",
                                         (index + 1) * group() - 1),
              " spans [", lo, ", ", hi, "], beyond what an fp16 minimum and scale can hold");
    std::memcpy(block + layout_.mins_offset() + 2 * p, &hm, 2);
    std::memcpy(block + layout_.scales_offset() + 2 * p, &hs, 2);
    return {m, s};
  }
  uint8_t code(float v, float m, float s) const {
    if (s == 0) return 0;  // a constant range: every value equals m
    return static_cast<uint8_t>(std::clamp(std::nearbyint((v - m) / s), 0.0f, static_cast<float>(levels_)));
  }

  layout::Kivi layout_{};
  int levels_;  // 2^b - 1
};

// Scores from the codes. Keys: <q, k^> = <q, m> + sum_c (q_c s_c) q_t,c, with q_c s_c and <q, m> formed once per
// block. Values: sum_g (m_g sum_{c in g} q_c + s_g sum_{c in g} q_c q_t,c), the group sums of q formed once.
class KiviScorer final : public Scorer {
 public:
  KiviScorer(const KiviCodec& codec, const float* q, int n_q)
      : Scorer(n_q, codec.block_tokens()),
        codec_(codec),
        q_(q, q + static_cast<size_t>(n_q) * codec.dim()),
        group_sums_(static_cast<size_t>(n_q) * codec.groups(), 0.0f),
        scaled_q_(codec.dim()),
        codes_(static_cast<size_t>(codec.block_tokens()) * codec.dim()) {
    // Element j = i d + c belongs to group j / G = i (d / G) + c / G, since G divides d.
    for (size_t j = 0; j < q_.size(); ++j) group_sums_[j / codec.group()] += q_[j];
  }

  void scores(const uint8_t* block, int n, float* out) override {
    const int d = codec_.dim(), G = codec_.group(), T = block_tokens();
    codec_.read_codes(block, n, codes_.data());
    for (int i = 0; i < n_queries(); ++i) {
      const float* qi = q_.data() + static_cast<size_t>(i) * d;
      float* oi = out + static_cast<size_t>(i) * T;
      if (codec_.per_channel()) {
        float qm = 0;
        for (int c = 0; c < d; ++c) {
          qm += qi[c] * codec_.min_at(block, c);
          scaled_q_[c] = qi[c] * codec_.scale_at(block, c);
        }
        for (int t = 0; t < n; ++t) {
          const uint8_t* kt = codes_.data() + static_cast<size_t>(t) * d;
          float dot = 0;
          for (int c = 0; c < d; ++c) dot += scaled_q_[c] * static_cast<float>(kt[c]);
          oi[t] = qm + dot;
        }
        continue;
      }
      const float* sums = group_sums_.data() + static_cast<size_t>(i) * codec_.groups();
      for (int t = 0; t < n; ++t) {
        const uint8_t* kt = codes_.data() + static_cast<size_t>(t) * d;
        float total = 0;
        for (int g = 0; g < codec_.groups(); ++g) {
          const size_t p = codec_.layout().param(static_cast<size_t>(t), static_cast<size_t>(g * G));
          float dot = 0;
          for (int c = g * G; c < g * G + G; ++c) dot += qi[c] * static_cast<float>(kt[c]);
          total += codec_.min_at(block, p) * sums[g] + codec_.scale_at(block, p) * dot;
        }
        oi[t] = total;
      }
    }
  }

 private:
  const KiviCodec& codec_;
  std::vector<float> q_;           // n_q x d
  std::vector<float> group_sums_;  // n_q x d/G: sum of q over each value group
  std::vector<float> scaled_q_;    // d: q_c s_c of the current key block
  std::vector<uint8_t> codes_;     // T x d
};

std::unique_ptr<Scorer> KiviCodec::make_scorer(const float* q, int n_q) const {
  return std::make_unique<KiviScorer>(*this, q, n_q);
}

int parse_group(const CodecSpec& spec) {
  const std::string text = spec.option("g", "32");
  int g = 0;
  const auto [ptr, ec] = std::from_chars(text.data(), text.data() + text.size(), g);
  KVQ_CHECK(ec == std::errc{} && ptr == text.data() + text.size(), spec.str(), ": option g='", text,
            "' is not an integer");
  KVQ_CHECK(g == 16 || g == 32 || g == 64 || g == 128, spec.str(), ": value group size ", g,
            " unsupported (use g=16, 32, 64 or 128)");
  return g;
}

}  // namespace

std::optional<layout::Kivi> kivi_layout(const Codec& codec) {
  const auto* c = dynamic_cast<const KiviCodec*>(&codec);
  if (!c) return std::nullopt;
  return c->layout();
}

std::unique_ptr<Codec> make_kivi_codec(const CodecSpec& spec, const CodecParams& params) {
  check_spec_shape(spec, 1, "g");
  KVQ_CHECK(spec.args.size() == 1, "codec '", spec.str(), "' needs a bit width (kivi:2, kivi:3 or kivi:4)");
  const int bits = spec.args[0];
  KVQ_CHECK(bits >= 2 && bits <= 4, spec.str(), ": ", bits, " bits unsupported (kivi:2, kivi:3 or kivi:4)");
  return std::make_unique<KiviCodec>(spec, params, bits, parse_group(spec));
}

}  // namespace kvq

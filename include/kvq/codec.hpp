// Codecs: a codec turns a block of T token vectors (T x d floats) into a fixed number of bytes and back, and
// computes the two attention primitives directly on its own format.
//
// The model every codec follows. A codec has a linear map A: R^d -> R^m (m = space_dim(); usually m = d and A
// a rotation, for QJL A is the sketch matrix). A key or value x is stored as codes whose "space decode" y(x) in
// R^m satisfies
//     decode(x)        = A^T y(x)
//     score(q, x)      = <A q, y(x)>        (= <q, decode(x)> exactly, up to fp32 rounding)
//     sum_t w_t x_t   ~= A^T (sum_t w_t y(x_t))
// so attention scores keys in the codec's space, sums values there, and maps back once per query with
// from_space. Subclasses provide encode_block and decode_block_space; the scorer and the accumulator have
// generic versions (through decode_block_space) that codecs replace with fused kernels.
//
// Non-finite input: encode and prepare reject NaN and Inf with kvq::Error naming the token and channel (a cache
// must never hold a value that silently poisons every later attention call).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "kvq/rotation.hpp"

namespace kvq {

/// What a codec stores: some codecs (kivi) lay keys and values out differently.
enum class Role { key, value };

/// A parsed codec spec, as users type it: name[:a[/b]][,option=value...]
/// e.g. "f16", "int4", "int4:16" (group 16), "turbo_mse:3", "vecinfer:10/4", "int4,rot=srft".
struct CodecSpec {
  std::string name;
  std::vector<int> args;
  std::map<std::string, std::string, std::less<>> options;

  static CodecSpec parse(std::string_view text);
  /// The canonical text of the spec (parse(str()) == *this).
  std::string str() const;
  /// args[i], or `fallback` where the spec does not give it.
  int arg(size_t i, int fallback) const { return i < args.size() ? args[i] : fallback; }
  std::string option(std::string_view key, std::string_view fallback) const;
  bool operator==(const CodecSpec&) const = default;
};

/// Construction parameters shared by every codec.
struct CodecParams {
  int dim = 128;          ///< head dimension d: a multiple of 16 in [16, 512]
  int block_tokens = 64;  ///< T, tokens per encoded block, in [1, 1024]
  uint64_t seed = 0;      ///< seeds rotations, sketches and trainers
  Role role = Role::key;
};

/// Scores a fixed set of queries against key blocks. Holds per-query precomputation (rotated query, sketch,
/// lookup table) and scratch: use one scorer per thread.
class Scorer {
 public:
  virtual ~Scorer() = default;
  int n_queries() const { return n_q_; }
  int block_tokens() const { return block_tokens_; }
  /// out[i * block_tokens() + t] = <q_i, k_t> for queries i < n_queries() and tokens t < n.
  virtual void scores(const uint8_t* block, int n, float* out) = 0;

 protected:
  Scorer(int n_q, int block_tokens) : n_q_(n_q), block_tokens_(block_tokens) {}

 private:
  int n_q_, block_tokens_;
};

class Codec {
 public:
  virtual ~Codec() = default;
  Codec(const Codec&) = delete;
  Codec& operator=(const Codec&) = delete;

  const CodecSpec& spec() const { return spec_; }
  const CodecParams& params() const { return params_; }
  int dim() const { return params_.dim; }
  int block_tokens() const { return params_.block_tokens; }
  Role role() const { return params_.role; }
  /// Bytes of one encoded block of block_tokens() tokens: everything stored (codes, norms, scales, zero points).
  size_t block_bytes() const { return block_bytes_; }
  /// 8 * block_bytes() / (block_tokens() * dim()).
  double bits_per_element() const;
  /// m, the dimension of the codec's space (see the model above).
  int space_dim() const { return space_dim_; }

  /// Whether encode needs train() first (codebooks). Codecs without trainable state accept train() as a no-op.
  virtual bool needs_training() const { return false; }
  bool trained() const { return trained_ || !needs_training(); }
  /// Fits the codec's state to n x d example vectors (original space).
  void train(const float* x, size_t n);
  /// The trained state (codebooks, calibrated scales) as bytes, for saving next to a cache; empty if none.
  virtual std::vector<uint8_t> state() const { return {}; }
  /// Restores a state written by state() of a codec with the same spec and params; throws on a mismatch.
  void load_state(const std::vector<uint8_t>& bytes);

  /// Encodes n <= T vectors (n x d, original space) into a block of block_bytes() bytes; tokens n..T-1 of the
  /// block are written as zero vectors.
  void encode(const float* x, int n, uint8_t* block) const;
  /// Decodes the first n tokens of a block into n x d floats (original space).
  void decode(const uint8_t* block, int n, float* x) const;
  /// Decodes the first n tokens into the codec's space: n x space_dim() floats.
  void decode_space(const uint8_t* block, int n, float* y) const;
  /// y = A q for n_q queries (n_q x d in, n_q x space_dim() out).
  void to_space(const float* q, int n_q, float* y) const;
  /// x = A^T y for n_q rows (n_q x space_dim() in, n_q x d out): maps accumulated values back.
  void from_space(const float* y, int n_q, float* x) const;

  /// Precomputes what scoring n_q queries (n_q x d, original space) needs.
  std::unique_ptr<Scorer> prepare(const float* q, int n_q) const;
  /// acc[i * space_dim() + j] += sum_{t<n} w[i * T + t] * y_j(x_t), for queries i < n_q.
  void accumulate(const float* w, int n_q, const uint8_t* block, int n, float* acc) const;

 protected:
  Codec(CodecSpec spec, const CodecParams& params);
  /// Called once by the subclass constructor.
  void set_layout(size_t block_bytes, int space_dim);

  virtual void encode_block(const float* x, int n, uint8_t* block) const = 0;
  virtual void decode_block_space(const uint8_t* block, int n, float* y) const = 0;
  virtual void map_to_space(const float* q, int n_q, float* y) const;
  virtual void map_from_space(const float* y, int n_q, float* x) const;
  virtual std::unique_ptr<Scorer> make_scorer(const float* q, int n_q) const;
  virtual void accumulate_block(const float* w, int n_q, const uint8_t* block, int n, float* acc) const;
  virtual void train_impl(const float* x, size_t n);
  /// Default: accepts only an empty state.
  virtual void load_state_impl(const std::vector<uint8_t>& bytes);

  /// The codec's rotation, if it has one (map_to_space/map_from_space default to it, or to the identity).
  std::unique_ptr<Rotation> rotation_;

 private:
  CodecSpec spec_;
  CodecParams params_;
  size_t block_bytes_ = 0;
  int space_dim_ = 0;
  bool trained_ = false;
};

/// Builds a codec from a spec; throws kvq::Error for an unknown codec, bad arguments or an unsupported d.
std::unique_ptr<Codec> make_codec(std::string_view spec, const CodecParams& params);
/// The registered codec names ("f32", "int4", "turbo_mse", ...).
std::vector<std::string> codec_names();

/// The default rotation for a dimension: "hadamard" for a power of two, else "srft".
std::string default_rotation(int dim);

}  // namespace kvq

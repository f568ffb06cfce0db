// Error of decode attention over a compressed cache against fp32 attention over the original keys and values, on
// key-like data with outlier channels (`kvq attention-error`): what a codec pair costs at the attention output,
// between the codec's own distortion (kvq distortion) and a model's perplexity (kvq ppl).
#pragma once

#include <cstdint>
#include <string>

namespace kvq {

struct AttentionErrorOptions {
  std::string key_codec = "int4";
  std::string value_codec = "int4";
  int dim = 128;
  int ctx = 4096;        ///< tokens in the cache
  int q_heads = 4;       ///< query heads, a multiple of kv_heads
  int kv_heads = 1;
  int queries = 16;      ///< decode calls, each with fresh queries
  double logit_std = 2.5;  ///< each query is scaled so that its logits over the context have this spread
  uint64_t seed = 0;
  /// Where decode attention runs: "cpu", or "cuda" / "cuda:N" (a copy of the cache there, the queries uploaded).
  std::string device = "cpu";
};

struct AttentionErrorResult {
  std::string key_codec, value_codec;
  std::string kernel;  ///< attention_kernel(): what ran (KVQ_ISA and KVQ_ATTENTION apply)
  double bits_k = 0, bits_v = 0;
  double rel_err_mean = 0;  ///< mean over query heads and calls of |o - o_ref| / |o_ref|
  double rel_err_max = 0;
  double weights_tv = 0;  ///< mean total variation between the softmax weights over the decoded and original keys
  /// The codec's own error: mean of |o_dec - o_ref| / |o_ref|, o_dec the double-precision attention over the
  /// decoded cache (what the cache holds, exactly computed).
  double codec_err_mean = 0;
  /// The kernel's own error: mean and largest |o - o_dec| / |o_ref|. The accuracy contract of the fast kernels
  /// (docs/METHODS.md): kernel_err_mean <= codec_err_mean / 10.
  double kernel_err_mean = 0, kernel_err_max = 0;
};

/// Keys and values are drawn from key_like_profile (4 outlier channels 10-50x the rest, non-zero channel means;
/// separate profiles for keys and values); queries from the key profile, scaled to the logit spread asked for. The
/// reference is the double-precision attention over the original fp32 keys and values. Codecs that need training
/// are trained on 4096 separate vectors of the same profiles.
AttentionErrorResult measure_attention_error(const AttentionErrorOptions& options);

}  // namespace kvq

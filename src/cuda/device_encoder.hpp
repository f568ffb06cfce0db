// The append kernels' host interface: a DeviceEncoder turns whole pages of one role (keys or values) of fp32 tokens
// in device memory into a codec's blocks (src/codec/block_layout.hpp) in the device pool, the same bytes as the
// CPU codec writes (or, where the float order of a rotation differs, the same reconstruction error). The codec's
// state (lambda, rotation signs or matrix, codebook boundaries or centroids, sketch matrix) goes to the device once,
// when the encoder is made.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "kvq/cache.hpp"
#include "kvq/codec.hpp"
#include "kvq/rotation.hpp"

namespace kvq::cuda::detail {

/// One sequence's token stream of one role (keys or values): its window's `used` tokens, then its fresh ones, which
/// start at token fresh_first of the batch's (EncodeSource::fresh_base: a launch may point it at other arrays of the
/// same shape, as a DecodeStep's runs do).
struct EncodeStream {
  const float* window = nullptr;  ///< [H][slots][d]
  size_t fresh_first = 0;         ///< its first fresh token in fresh_base's [sum n][H][d]
  const float* offset = nullptr;  ///< [H][d], subtracted from fresh tokens (centered keys), or null
  int used = 0;
  bool center_window = false;  ///< subtract it from the window's tokens too (an offset new in this append)
};

/// The token streams of one role of a batch: one per sequence (a device array), and what they all share.
struct EncodeSource {
  const EncodeStream* streams = nullptr;
  const float* fresh_base = nullptr;  ///< the batch's fresh tokens [sum n][H][d], 16-byte aligned
  int H = 0, slots = 0, d = 0, T = 0;
};

/// Page p of a launch: tokens [first, first + T) of stream `stream`, encoded into pool page `target`.
struct EncodePage {
  uint32_t stream = 0;
  uint32_t first = 0;
  PageId target = 0;
};
/// EncodePage::stream of an entry without a page (the empty entries of a DecodeStep's launches of fixed shape).
constexpr uint32_t kNoStream = 0xffffffffu;

/// Where a page's block of head h goes: pool + target * page_bytes + block_offset + h * head_stride.
struct EncodeTarget {
  uint8_t* pool = nullptr;
  size_t page_bytes = 0, block_offset = 0, head_stride = 0, block_bytes = 0;
};

/// The role (keys or values) one encode covers, with where it reports.
struct EncodeRole {
  EncodeSource src;
  EncodeTarget dst;
  const EncodePage* pages = nullptr;        ///< device array, one per page of the launch (both roles share it)
  unsigned long long* error = nullptr;      ///< error_position of a value the codec cannot store
  unsigned long long* nonfinite = nullptr;  ///< flat index in src.fresh_base of a NaN or Inf
};

class DeviceEncoder {
 public:
  virtual ~DeviceEncoder() = default;
  /// Encodes the n_pages pages of `role.pages` (each a page's tokens of one stream), and of `partner_role` too
  /// where `partner` is an encoder of the same kind (then one launch does both; returns whether it did). A token
  /// the codec cannot store (beyond an fp16 field's range) lowers *role.error to its error_position
  /// (encode_layout.cuh) with token p * T + t for token t of launch page p; a NaN or Inf among the fresh tokens it
  /// reads lowers *role.nonfinite to its flat index in src.fresh_base. The caller checks both before using the
  /// pages.
  virtual bool encode(const EncodeRole& role, const DeviceEncoder* partner, const EncodeRole* partner_role,
                      size_t n_pages, cudaStream_t stream) const = 0;
};

/// Device state of a rotation R as an encoder applies it: the randomized Hadamard transform's signs (bit-exact
/// with the CPU's fast transform), or the dense matrix for any other rotation (float order differs).
struct DeviceRotation {
  bool hadamard = false;
  float scale = 0;                  ///< hadamard: 1 / sqrt(d), as the CPU computes it
  std::shared_ptr<float> signs;     ///< hadamard: d signs
  std::shared_ptr<float> columns;   ///< dense: d x d, row i = R e_i (so y_j = sum_i x_i columns[i][j])
};
DeviceRotation upload_rotation(const Codec& codec);
/// The same from the Rotation itself, for codecs whose map to their space is not R alone (turbo_prod: [R x, S x];
/// vecinfer: R diag(lambda)): rebuilt with rotation_from_spec (codec_factories.hpp), the codec's own seed.
DeviceRotation upload_rotation(const Rotation& rotation);

/// Device state of R^T (turbo_prod's residual, vecinfer's gamma): the Hadamard rotation in the CPU's apply_inverse
/// order, the butterflies (`butterflies`: unit signs), times 1 / sqrt(d), then times the signs (`signs`); any other
/// rotation as the dense matrix of R^T (`butterflies.columns`; `signs` null).
struct DeviceInverseRotation {
  DeviceRotation butterflies;
  std::shared_ptr<float> signs;
};
DeviceInverseRotation upload_inverse_rotation(const Rotation& rotation);
/// n floats copied to the current device.
std::shared_ptr<float> upload_floats(const float* host, size_t n);

// Each returns nullptr for a codec of another kind.
std::unique_ptr<DeviceEncoder> make_float_encoder(const Codec& codec);
std::unique_ptr<DeviceEncoder> make_int_group_encoder(const Codec& codec);
std::unique_ptr<DeviceEncoder> make_kivi_encoder(const Codec& codec);
std::unique_ptr<DeviceEncoder> make_turbo_mse_encoder(const Codec& codec);
std::unique_ptr<DeviceEncoder> make_qjl_encoder(const Codec& codec);
std::unique_ptr<DeviceEncoder> make_turbo_prod_encoder(const Codec& codec);
std::unique_ptr<DeviceEncoder> make_vecinfer_encoder(const Codec& codec);
std::unique_ptr<DeviceEncoder> make_turbo_rvq_encoder(const Codec& codec);

/// The device encoder of a codec, or nullptr (with the codec named in *why) where none is written.
std::unique_ptr<DeviceEncoder> make_device_encoder(const Codec& codec, std::string* why);

}  // namespace kvq::cuda::detail

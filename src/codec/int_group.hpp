// What a fused attention kernel needs to know of an int8/int4 codec beyond its block layout.
#pragma once

#include <optional>

#include "kvq/codec.hpp"

namespace kvq {

struct IntGroupParams {
  int bits;              ///< 4 or 8
  int group;             ///< G, channels per fp16 scale
  const float* lambda;   ///< d per-channel scales of the rotated space (all 1 until trained); lives with the codec
};

/// The parameters of an int8/int4 codec; nullopt for any other codec.
std::optional<IntGroupParams> int_group_params(const Codec& codec);

}  // namespace kvq

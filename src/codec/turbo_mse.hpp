// What a fused attention kernel needs to know of a turbo_mse codec beyond its block layout.
#pragma once

#include <optional>

#include "kvq/block_layout.hpp"
#include "kvq/codec.hpp"

namespace kvq {

struct TurboMseParams {
  layout::TurboMse layout;
  const float* nibble_levels;  ///< 16 floats: the level of each nibble a LaneCodes chunk decodes to; lives with the codec
};

/// The parameters of a turbo_mse codec; nullopt for any other codec.
std::optional<TurboMseParams> turbo_mse_params(const Codec& codec);

}  // namespace kvq

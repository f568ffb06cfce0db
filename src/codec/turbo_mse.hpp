// What a fused attention kernel or an append kernel needs to know of a turbo_mse, turbo_prod, qjl or turbo_rvq
// codec beyond its block layout.
#pragma once

#include <optional>

#include "codec/block_layout.hpp"
#include "kvq/codec.hpp"

namespace kvq {

struct TurboMseParams {
  layout::TurboMse layout;
  const float* nibble_levels;  ///< the 16 levels a LaneCodes chunk's nibbles decode to; lives with the codec
};

/// The parameters of a turbo_mse codec; nullopt for any other codec.
std::optional<TurboMseParams> turbo_mse_params(const Codec& codec);

struct TurboProdParams {
  layout::TurboProd layout;
  const float* nibble_levels;  ///< of the turbo_mse:(b-1) part, as TurboMseParams::nibble_levels
  float sketch_scale;          ///< sqrt(pi/2) / m
};

/// The parameters of a turbo_prod codec; nullopt for any other codec (defined in turbo_prod.cpp).
std::optional<TurboProdParams> turbo_prod_params(const Codec& codec);

struct QjlParams {
  layout::Qjl layout;
  float sketch_scale;  ///< sqrt(pi/2) / m
};

/// The parameters of a qjl codec; nullopt for any other codec (defined in qjl.cpp).
std::optional<QjlParams> qjl_params(const Codec& codec);

struct TurboRvqParams {
  layout::TurboRvq layout;  ///< its bits: each stage's (the Lloyd–Max codebooks of lloyd_max.hpp, fp16-rounded)
  /// Per stage, the levels of the values 0..15 of a b-bit index (level e % 2^b); they live with the codec.
  const float* stage_levels[2];
};

/// The parameters of a turbo_rvq codec; nullopt for any other codec (defined in turbo_rvq.cpp).
std::optional<TurboRvqParams> turbo_rvq_params(const Codec& codec);

}  // namespace kvq

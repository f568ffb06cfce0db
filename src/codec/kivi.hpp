// What a fused attention kernel needs to know of a kivi codec beyond its block layout.
#pragma once

#include <optional>

#include "codec/block_layout.hpp"
#include "kvq/codec.hpp"

namespace kvq {

/// The block layout of a kivi codec; nullopt for any other codec.
std::optional<layout::Kivi> kivi_layout(const Codec& codec);

}  // namespace kvq

#include "codec/turbo_parts.hpp"

#include "codec/lane_norm.hpp"
#include "kvq/error.hpp"

namespace kvq {

uint16_t stored_norm(double norm, std::string_view codec) {
  KVQ_CHECK(norm <= 65504.0, codec, ": vector norm ", norm, " exceeds the fp16 range of the stored norm (65504)");
  return f32_to_f16(static_cast<float>(norm));
}

uint16_t split_norm(const Rotation& rotation, const float* x, float* u, std::string_view codec) {
  const int d = rotation.dim();
  const double norm = lane_norm(x, d);
  const uint16_t stored = stored_norm(norm, codec);
  if (norm == 0) {
    std::memset(u, 0, static_cast<size_t>(d) * sizeof(float));
    return stored;
  }
  float unit[kMaxCodecDim];
  for (int j = 0; j < d; ++j) unit[j] = static_cast<float>(x[j] / norm);
  rotation.apply(unit, u, 1);
  return stored;
}

}  // namespace kvq

// The device encoders' state on the device (rotations, per-channel scales) and the choice of an encoder per codec.
#include "cuda/device_encoder.hpp"

#include <cmath>
#include <vector>

#include "cuda/device_memory.hpp"

namespace kvq::cuda::detail {

std::shared_ptr<float> upload_floats(const float* host, size_t n) {
  std::shared_ptr<float> dev(device_alloc<float>(n, "a device encoder's state").release(), CudaFree{});
  KVQ_CUDA_CHECK(cudaMemcpy(dev.get(), host, n * sizeof(float), cudaMemcpyHostToDevice));
  return dev;
}

DeviceRotation upload_rotation(const Codec& codec) {
  const int d = codec.dim();
  const size_t n = static_cast<size_t>(d);
  DeviceRotation r;
  r.hadamard = codec.spec().option("rot", default_rotation(d)) == "hadamard";
  if (r.hadamard) {
    // R = H diag(s) / sqrt(d): row 0 of R, R^T e_0, is s / sqrt(d).
    std::vector<float> e0(n, 0.0f), row(n);
    e0[0] = 1.0f;
    codec.from_space(e0.data(), 1, row.data());
    std::vector<float> signs(n);
    for (size_t j = 0; j < n; ++j) signs[j] = row[j] < 0 ? -1.0f : 1.0f;
    r.signs = upload_floats(signs.data(), n);
    r.scale = 1.0f / std::sqrt(static_cast<float>(d));  // as src/rotation/hadamard.cpp
    return r;
  }
  std::vector<float> identity(n * n, 0.0f), columns(n * n);
  for (size_t i = 0; i < n; ++i) identity[i * n + i] = 1.0f;
  codec.to_space(identity.data(), d, columns.data());  // row i: R e_i
  r.columns = upload_floats(columns.data(), n * n);
  return r;
}

DeviceRotation upload_rotation(const Rotation& rotation) {
  const int d = rotation.dim();
  const size_t n = static_cast<size_t>(d);
  DeviceRotation r;
  r.hadamard = rotation.kind() == RotationKind::hadamard;
  if (r.hadamard) {
    // Row 0 of R = H diag(s) / sqrt(d) is R^T e_0 = s / sqrt(d).
    std::vector<float> e0(n, 0.0f), row(n);
    e0[0] = 1.0f;
    rotation.apply_inverse(e0.data(), row.data(), 1);
    std::vector<float> signs(n);
    for (size_t j = 0; j < n; ++j) signs[j] = row[j] < 0 ? -1.0f : 1.0f;
    r.signs = upload_floats(signs.data(), n);
    r.scale = 1.0f / std::sqrt(static_cast<float>(d));  // as src/rotation/hadamard.cpp
    return r;
  }
  std::vector<float> identity(n * n, 0.0f), columns(n * n);
  for (size_t i = 0; i < n; ++i) identity[i * n + i] = 1.0f;
  rotation.apply(identity.data(), columns.data(), n);  // row i: R e_i
  r.columns = upload_floats(columns.data(), n * n);
  return r;
}

DeviceInverseRotation upload_inverse_rotation(const Rotation& rotation) {
  const size_t n = static_cast<size_t>(rotation.dim());
  DeviceInverseRotation r;
  if (rotation.kind() == RotationKind::hadamard) {
    r.butterflies = upload_rotation(rotation);
    r.signs = std::move(r.butterflies.signs);
    const std::vector<float> ones(n, 1.0f);  // x * 1 is exact: the butterflies see x itself
    r.butterflies.signs = upload_floats(ones.data(), n);
    return r;
  }
  std::vector<float> identity(n * n, 0.0f), columns(n * n);
  for (size_t i = 0; i < n; ++i) identity[i * n + i] = 1.0f;
  rotation.apply_inverse(identity.data(), columns.data(), n);  // row i: R^T e_i
  r.butterflies.columns = upload_floats(columns.data(), n * n);
  return r;
}

std::unique_ptr<DeviceEncoder> make_device_encoder(const Codec& codec, std::string* why) {
  for (auto make : {make_float_encoder, make_int_group_encoder, make_kivi_encoder, make_turbo_mse_encoder,
                    make_qjl_encoder, make_turbo_prod_encoder, make_vecinfer_encoder, make_turbo_rvq_encoder})
    if (auto encoder = make(codec)) return encoder;
  if (why != nullptr)
    *why = "codec '" + codec.spec().str() +
           "' has no device encoder (device encoders: f32, f16, bf16, int8, int4, kivi, turbo_mse, qjl, turbo_prod, "
           "vecinfer, turbo_rvq)";
  return nullptr;
}

}  // namespace kvq::cuda::detail

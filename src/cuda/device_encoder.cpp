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

namespace {

// The device state of a rotation R of R^d from how it maps vectors: `inverse(x, y)` y = R^T x for one vector,
// `forward(rows, out, n)` out = R x for each of n rows.
template <class Inverse, class Forward>
DeviceRotation upload_rotation_of(int d, bool hadamard, Inverse inverse, Forward forward) {
  const size_t n = static_cast<size_t>(d);
  DeviceRotation r;
  r.hadamard = hadamard;
  if (r.hadamard) {
    // R = H diag(s) / sqrt(d): row 0 of R, R^T e_0, is s / sqrt(d).
    std::vector<float> e0(n, 0.0f), row(n);
    e0[0] = 1.0f;
    inverse(e0.data(), row.data());
    std::vector<float> signs(n);
    for (size_t j = 0; j < n; ++j) signs[j] = row[j] < 0 ? -1.0f : 1.0f;
    r.signs = upload_floats(signs.data(), n);
    r.scale = 1.0f / std::sqrt(static_cast<float>(d));  // as src/rotation/hadamard.cpp
    return r;
  }
  std::vector<float> identity(n * n, 0.0f), columns(n * n);
  for (size_t i = 0; i < n; ++i) identity[i * n + i] = 1.0f;
  forward(identity.data(), columns.data(), n);  // row i: R e_i
  r.columns = upload_floats(columns.data(), n * n);
  return r;
}

}  // namespace

DeviceRotation upload_rotation(const Codec& codec) {
  const int d = codec.dim();
  return upload_rotation_of(
      d, codec.spec().option("rot", default_rotation(d)) == "hadamard" && codec.spec().option("learn", "").empty(),
      [&](const float* x, float* y) { codec.from_space(x, 1, y); },
      [&](const float* x, float* y, size_t n) { codec.to_space(x, static_cast<int>(n), y); });
}

DeviceRotation upload_rotation(const Rotation& rotation) {
  return upload_rotation_of(
      rotation.dim(), rotation.kind() == RotationKind::hadamard,
      [&](const float* x, float* y) { rotation.apply_inverse(x, y, 1); },
      [&](const float* x, float* y, size_t n) { rotation.apply(x, y, n); });
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

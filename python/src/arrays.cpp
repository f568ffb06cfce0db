#include "arrays.hpp"

#include <cstdint>
#include <sstream>

#include "kvq/error.hpp"

namespace kvq::python {
namespace {

const char* device_name(int device_type) {
  switch (device_type) {
    case nb::device::cpu::value: return "cpu";
    case nb::device::cuda::value: return "cuda";
    case nb::device::cuda_host::value: return "cuda_host";
    case nb::device::cuda_managed::value: return "cuda_managed";
    case nb::device::rocm::value: return "rocm";
    case nb::device::metal::value: return "metal";
    default: return "another device";
  }
}

std::string where(const nb::ndarray<nb::ro>& a) {
  if (a.device_type() == nb::device::cpu::value) return "in CPU memory";
  return std::string("on ") + device_name(a.device_type()) + " (device " + std::to_string(a.device_id()) + ")";
}

std::string dtype_text(nb::dlpack::dtype t) {
  const char* kind = "?";
  switch (static_cast<nb::dlpack::dtype_code>(t.code)) {
    case nb::dlpack::dtype_code::Int: kind = "int"; break;
    case nb::dlpack::dtype_code::UInt: kind = "uint"; break;
    case nb::dlpack::dtype_code::Float: kind = "float"; break;
    case nb::dlpack::dtype_code::Bfloat: kind = "bfloat"; break;
    case nb::dlpack::dtype_code::Complex: kind = "complex"; break;
    case nb::dlpack::dtype_code::Bool: return "bool";
    default: break;
  }
  return kind + std::to_string(t.bits) + (t.lanes != 1 ? "x" + std::to_string(t.lanes) : "");
}

std::string shape_text(const nb::ndarray<nb::ro>& a) {
  std::ostringstream s;
  s << "[";
  for (size_t i = 0; i < a.ndim(); ++i) s << (i ? ", " : "") << a.shape(i);
  s << "]";
  return s.str();
}

// Row-major order with no gaps; extents of 1 may carry any stride (NumPy and torch give them several).
bool c_contiguous(const nb::ndarray<nb::ro>& a) {
  if (a.size() == 0) return true;
  int64_t expected = 1;
  for (size_t i = a.ndim(); i-- > 0;) {
    if (a.shape(i) != 1 && a.stride(i) != expected) return false;
    expected *= static_cast<int64_t>(a.shape(i));
  }
  return true;
}

}  // namespace

void check_kind(const nb::ndarray<nb::ro>& a, const char* name, nb::dlpack::dtype dtype, const char* dtype_name,
                int place) {
  if (a.dtype() != dtype)
    throw nb::type_error((std::string(name) + ": expected a " + dtype_name + " array, got " + dtype_text(a.dtype()))
                             .c_str());
  const bool in_place = place == kCpu ? a.device_type() == nb::device::cpu::value
                                      : a.device_type() == nb::device::cuda::value && a.device_id() == place;
  if (!in_place)
    throw nb::type_error((std::string(name) + ": expected an array " +
                          (place == kCpu ? std::string("in CPU memory") : "on CUDA device " + std::to_string(place)) +
                          ", got one " + where(a))
                             .c_str());
  if (reinterpret_cast<uintptr_t>(a.data()) % a.itemsize() != 0)
    throw nb::type_error((std::string(name) + ": expected an array aligned to its elements (" +
                          std::to_string(a.itemsize()) + " bytes); .copy() makes one")
                             .c_str());
  if (!c_contiguous(a))
    throw nb::type_error((std::string(name) + ": expected a C-contiguous array (strides of shape " + shape_text(a) +
                          " are not row-major; .copy() or .contiguous() makes one)")
                             .c_str());
}

void check_shape(const nb::ndarray<nb::ro>& a, const char* name, std::initializer_list<Extent> shape) {
  bool ok = a.ndim() == shape.size();
  for (size_t i = 0; ok && i < shape.size(); ++i) {
    const Extent& e = shape.begin()[i];
    ok = e.size == Extent::kAny || a.shape(i) == e.size;
  }
  if (ok) return;
  std::ostringstream want;
  want << "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    const Extent& e = shape.begin()[i];
    want << (i ? ", " : "") << e.name;
    if (e.size != Extent::kAny) want << "=" << e.size;
  }
  want << "]";
  throw Error(detail::concat(name, ": expected shape ", want.str(), ", got ", shape_text(a)));
}

const float* float_input(const InputArray& a, const char* name, std::initializer_list<Extent> shape, int place) {
  check_kind(a, name, nb::dtype<float>(), "float32", place);
  check_shape(a, name, shape);
  return static_cast<const float*>(a.data());
}

float* float_output(const OutputArray& a, const char* name, std::initializer_list<Extent> shape, int place) {
  const nb::ndarray<nb::ro> view(a);
  check_kind(view, name, nb::dtype<float>(), "float32", place);
  check_shape(view, name, shape);
  return static_cast<float*>(a.data());
}

void check_disjoint(const float* q, const float* out, size_t n) {
  const auto q_at = reinterpret_cast<uintptr_t>(q), out_at = reinterpret_cast<uintptr_t>(out), bytes = n * 4;
  KVQ_CHECK(out_at + bytes <= q_at || q_at + bytes <= out_at, "out: shares memory with q");
}

}  // namespace kvq::python

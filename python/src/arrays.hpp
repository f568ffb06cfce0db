// Arrays crossing the binding: inputs are taken as they come (any dtype, device and layout, through DLPack or the
// buffer protocol, never copied) and checked here with messages that name the argument; outputs are NumPy arrays
// that own their memory (filled with the GIL released, then handed to NumPy).
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <string>

namespace kvq::python {

namespace nb = nanobind;

/// An array argument as passed: NumPy, torch (DLPack), bytes; read-only allowed.
using InputArray = nb::ndarray<nb::ro>;
/// An array argument the binding writes into (out=).
using OutputArray = nb::ndarray<>;

/// One expected extent of an array: its name in messages and its size (kAny: whatever the array has).
struct Extent {
  static constexpr size_t kAny = static_cast<size_t>(-1);
  std::string name;
  size_t size = kAny;
};

/// Where an argument must lie: kCpu, or the id of a CUDA device.
inline constexpr int kCpu = -1;

/// The element type, place and layout an argument must have: raises TypeError, naming the argument, for another
/// dtype, memory elsewhere than `place` (CPU memory, or that CUDA device), data not aligned to its elements, or an
/// array that is not C-contiguous.
void check_kind(const nb::ndarray<nb::ro>& a, const char* name, nb::dlpack::dtype dtype, const char* dtype_name,
                int place = kCpu);
/// The shape an argument must have: raises kvq.Error naming the argument, the expected and the actual shape.
void check_shape(const nb::ndarray<nb::ro>& a, const char* name, std::initializer_list<Extent> shape);

/// A float32 C-contiguous array of the given shape at `place` (check_kind, check_shape): its data, read in place.
const float* float_input(const InputArray& a, const char* name, std::initializer_list<Extent> shape,
                         int place = kCpu);
/// The same for an out= array, which the binding writes.
float* float_output(const OutputArray& a, const char* name, std::initializer_list<Extent> shape, int place = kCpu);
/// Raises kvq.Error if out's n floats overlap q's (an output must not overwrite the queries it is computed from).
void check_disjoint(const float* q, const float* out, size_t n);

/// A C-contiguous NumPy array of the given shape that takes over `data` (shape's product elements).
template <class T>
nb::ndarray<nb::numpy, T> numpy_array(std::unique_ptr<T[]> data, std::initializer_list<size_t> shape) {
  nb::capsule owner(data.get(), [](void* p) noexcept { delete[] static_cast<T*>(p); });
  return nb::ndarray<nb::numpy, T>(data.release(), shape.size(), shape.begin(), owner);
}

/// Memory for an output of `n` elements that the binding overwrites whole.
template <class T>
std::unique_ptr<T[]> output_memory(size_t n) {
  return std::make_unique_for_overwrite<T[]>(n);
}

}  // namespace kvq::python

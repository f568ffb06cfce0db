// Long calls let other Python threads run; calls on one kvq object take turns, since the C++ objects must not be
// modified while anything else uses them (cache.hpp, codec.hpp).
#pragma once

#include <nanobind/nanobind.h>

#include <mutex>
#include <utility>

namespace kvq::python {

/// Runs fn() with the GIL released and `mutex` held. The mutex is taken after the GIL is given up and released
/// before it is taken back, so a thread waiting for one never holds the other.
template <class Fn>
decltype(auto) without_gil(std::mutex& mutex, Fn&& fn) {
  nanobind::gil_scoped_release release;
  std::lock_guard lock(mutex);
  return std::forward<Fn>(fn)();
}

}  // namespace kvq::python

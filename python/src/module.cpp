// The extension module kvq._kvq; the package kvq (python/kvq/__init__.py) re-exports what users call.
#include <nanobind/nanobind.h>
#include <nanobind/stl/string.h>

#include "bindings.hpp"
#include "kvq/version.hpp"

NB_MODULE(_kvq, m) {
  m.doc() = "kvq: KV-cache codecs, the paged compressed KV cache and attention over it (C++ extension).";
  m.attr("__version__") = kvq::version();
  kvq::python::bind_error(m);
  kvq::python::bind_codec(m);
  kvq::python::bind_cache(m);
  kvq::python::bind_measurements(m);
  kvq::python::bind_calibration(m);
}

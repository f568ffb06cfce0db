// The parts of the extension module kvq._kvq, one concept each (module.cpp puts them together).
#pragma once

#include <nanobind/nanobind.h>

#include <string>

#include "kvq/codec.hpp"

namespace kvq::python {

void bind_error(nanobind::module_& m);
void bind_codec(nanobind::module_& m);
void bind_cache(nanobind::module_& m);  // and, through it, the device-only parts (cache_objects.hpp)
void bind_measurements(nanobind::module_& m);
void bind_calibration(nanobind::module_& m);

/// "key" or "value" as a Role; kvq.Error for anything else.
Role parse_role(const std::string& role);

}  // namespace kvq::python

// kvq::Error as the Python exception kvq.Error, a ValueError: nearly every error the library raises is about an
// argument or a value (a bad spec or shape, a NaN, an unknown sequence), the rest about a file or a full pool.
#include "bindings.hpp"
#include "kvq/error.hpp"

namespace kvq::python {

void bind_error(nanobind::module_& m) {
  nanobind::exception<Error>(m, "Error", PyExc_ValueError);
}

}  // namespace kvq::python

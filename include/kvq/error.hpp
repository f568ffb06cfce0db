// Errors: every bad input to kvq raises kvq::Error with a message that names what is wrong.
#pragma once

#include <sstream>
#include <stdexcept>
#include <string>

namespace kvq {

class Error : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

namespace detail {
template <class... Parts>
std::string concat(const Parts&... parts) {
  std::ostringstream s;
  (s << ... << parts);
  return s.str();
}
}  // namespace detail

}  // namespace kvq

/// Throws kvq::Error built from the remaining arguments when `cond` is false.
#define KVQ_CHECK(cond, ...)                                            \
  do {                                                                  \
    if (!(cond)) throw ::kvq::Error(::kvq::detail::concat(__VA_ARGS__)); \
  } while (0)

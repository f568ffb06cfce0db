#include "attention/precision.hpp"

#include <cstdlib>
#include <string>

#include "kvq/error.hpp"

namespace kvq::detail {

Precision resolve_precision(std::string_view request) {
  if (request.empty() || request == "fast") return Precision::fast;
  if (request == "exact") return Precision::exact;
  throw Error("KVQ_ATTENTION=" + std::string(request) + ": unknown precision (use exact or fast)");
}

Precision active_precision() {
  const char* env = std::getenv("KVQ_ATTENTION");
  return resolve_precision(env ? std::string_view(env) : std::string_view());
}

}  // namespace kvq::detail

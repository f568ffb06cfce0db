#include "kvq/version.hpp"

namespace kvq {

std::string version() { return KVQ_VERSION; }

}  // namespace kvq

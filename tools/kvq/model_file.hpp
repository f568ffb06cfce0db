// Loading a model for a command, saying on stderr when its weights could not be copied into memory.
#pragma once

#include <string>

#include "kvq/model.hpp"

namespace kvq::cli {

/// LlamaModel::load(path); where the file was too large to copy into the memory available, a note on stderr (as
/// `command`) that its weights stay mapped from the file, so decode steps read them over 4 KiB pages (slower) and
/// from disk again where memory runs short.
LlamaModel load_model(const std::string& path, const char* command);

}  // namespace kvq::cli

#include "model_file.hpp"

#include <cstdio>
#include <filesystem>

namespace kvq::cli {

LlamaModel load_model(const std::string& path, const char* command) {
  LlamaModel model = LlamaModel::load(path);
  if (!model.weights_copied()) {
    std::fprintf(stderr,
                 "%s: %s (%.1f GB) is larger than 3/4 of the memory available: its weights stay mapped from the "
                 "file (decode steps read them over 4 KiB pages, and from disk again where memory runs short)\n",
                 command, path.c_str(), static_cast<double>(std::filesystem::file_size(path)) * 1e-9);
  }
  return model;
}

}  // namespace kvq::cli

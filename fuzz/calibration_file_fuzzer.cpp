// Calibration files (kvq::load_calibration), their checksum line appended by the harness so that every mutation
// reaches the fields' parser: any text either loads or raises kvq::Error, never a crash or a huge allocation (trained
// states' lengths, layer counts). A loaded calibration saves and loads back to itself.
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <string>

#include "core/crc32c.hpp"
#include "fuzz_check.hpp"
#include "input_file.hpp"
#include "kvq/detail/calibration.hpp"
#include "kvq/error.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string text(reinterpret_cast<const char*>(data), size);
  char crc[24];
  std::snprintf(crc, sizeof(crc), "crc32c %08x\n", kvq::crc32c(data, size));
  text += crc;
  kvq::Calibration c;
  try {
    c = kvq::load_calibration(
        kvq::fuzz::input_file().write(reinterpret_cast<const uint8_t*>(text.data()), text.size()));
  } catch (const kvq::Error&) {
    return 0;  // the expected outcome for a damaged file
  }
  const std::filesystem::path again =
      std::filesystem::temp_directory_path() / ("kvq_fuzz_calibration_" + std::to_string(::getpid()));
  kvq::save_calibration(c, again);
  const kvq::Calibration back = kvq::load_calibration(again);
  std::filesystem::remove(again);
  KVQ_FUZZ_CHECK(back.model == c.model && back.layers == c.layers, "a saved calibration loads back to itself");
  KVQ_FUZZ_CHECK(back.budget_bits == c.budget_bits && back.predicted_kld == c.predicted_kld &&
                     back.block_tokens == c.block_tokens && back.calibration_tokens == c.calibration_tokens &&
                     back.sink_tokens == c.sink_tokens,
                 "a saved calibration's figures load back as they were");
  return 0;
}

#include <unistd.h>

#include <cstdio>

#include "commands.hpp"

namespace kvq::cli {

Progress::Progress(std::string label) : label_(std::move(label)), active_(isatty(STDERR_FILENO) != 0) {}

Progress::~Progress() {
  if (active_ && last_permille_ >= 0) std::fprintf(stderr, "\r\033[K");
}

void Progress::update(size_t done, size_t total) {
  if (!active_ || total == 0) return;
  const int permille = static_cast<int>(1000 * done / total);
  if (permille == last_permille_) return;
  last_permille_ = permille;
  constexpr int kWidth = 30;
  const int filled = permille * kWidth / 1000;
  std::fprintf(stderr, "\r%s [%.*s%*s] %5.1f%%", label_.c_str(), filled, "##############################",
               kWidth - filled, "", permille / 10.0);
  std::fflush(stderr);
}

}  // namespace kvq::cli

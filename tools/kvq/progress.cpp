#include "progress.hpp"

#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdio>

namespace kvq::cli {
namespace {

// Seconds between plain lines, and before the first: work finishing sooner prints none.
constexpr double kLineInterval = 30;

}  // namespace

Progress::Progress(std::string label)
    : label_(std::move(label)), terminal_(isatty(STDERR_FILENO) != 0), next_line_seconds_(kLineInterval) {}

Progress::~Progress() {
  if (terminal_ && last_permille_ >= 0) std::fprintf(stderr, "\r\033[K");
}

void Progress::update(size_t done, size_t total) {
  if (total == 0) return;
  if (terminal_)
    draw_bar(done, total);
  else
    print_line(done, total);
}

void Progress::draw_bar(size_t done, size_t total) {
  const int permille = static_cast<int>(1000 * done / total);
  if (permille == last_permille_) return;
  last_permille_ = permille;
  constexpr int kWidth = 30;
  const int filled = permille * kWidth / 1000;
  std::fprintf(stderr, "\r%s [%.*s%*s] %5.1f%%", label_.c_str(), filled, "##############################",
               kWidth - filled, "", permille / 10.0);
  std::fflush(stderr);
}

void Progress::print_line(size_t done, size_t total) {
  const double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  if (elapsed < next_line_seconds_ || done >= total) return;
  next_line_seconds_ = elapsed + kLineInterval;
  std::fprintf(stderr, "%s\n", progress_line(label_, done, total, elapsed).c_str());
  std::fflush(stderr);
}

std::string progress_line(const std::string& label, size_t done, size_t total, double elapsed_seconds) {
  char fraction[64];
  std::snprintf(fraction, sizeof fraction, "%zu/%zu (%.1f%%)", done, total,
                100.0 * static_cast<double>(done) / static_cast<double>(total));
  const double remaining = done >= total ? 0.0 : static_cast<double>(total - done);
  const std::string left =
      done == 0 ? "time left unknown"
                : "about " + duration_text(elapsed_seconds * remaining / static_cast<double>(done)) + " left";
  return "kvq " + label + ": " + fraction + ", " + duration_text(elapsed_seconds) + " elapsed, " + left;
}

std::string duration_text(double seconds) {
  const long s = std::lround(std::max(seconds, 0.0));
  char text[48];
  if (s < 60)
    std::snprintf(text, sizeof text, "%ld s", s);
  else if (s < 3600)
    std::snprintf(text, sizeof text, "%ld min %02ld s", s / 60, s % 60);
  else
    std::snprintf(text, sizeof text, "%ld h %02ld min", s / 3600, s % 3600 / 60);
  return text;
}

}  // namespace kvq::cli

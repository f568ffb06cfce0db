// Progress of a long command on stderr: a bar redrawn in place on a terminal, a plain line every 30 s otherwise
// (a log file or a pipe: a background run that shows it is alive, without carriage returns).
#pragma once

#include <chrono>
#include <cstddef>
#include <string>

namespace kvq::cli {

class Progress {
 public:
  explicit Progress(std::string label);
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;
  void update(size_t done, size_t total);

 private:
  void draw_bar(size_t done, size_t total);
  void print_line(size_t done, size_t total);

  std::string label_;
  bool terminal_;
  int last_permille_ = -1;
  std::chrono::steady_clock::time_point start_ = std::chrono::steady_clock::now();
  double next_line_seconds_;
};

/// The plain progress line, e.g. "kvq ppl: 12/32 (37.5%), 5 min 02 s elapsed, about 8 min 23 s left" (no newline);
/// the time left is extrapolated from the rate so far (done > 0) or "time left unknown". total > 0.
std::string progress_line(const std::string& label, size_t done, size_t total, double elapsed_seconds);

/// "45 s", "5 min 02 s", "2 h 07 min": a duration rounded to what a person reads.
std::string duration_text(double seconds);

}  // namespace kvq::cli

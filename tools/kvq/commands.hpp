// Subcommands of the kvq program, one file each.
#pragma once

#include <CLI/CLI.hpp>

namespace kvq::cli {

void add_distortion_command(CLI::App& app);
void add_attention_error_command(CLI::App& app);
void add_demo_command(CLI::App& app);
void add_generate_command(CLI::App& app);
void add_ppl_command(CLI::App& app);
void add_calibrate_command(CLI::App& app);
void add_bench_command(CLI::App& app);
/// kvq bench decode, under the bench subcommand.
void add_decode_bench_command(CLI::App& bench);

/// A one-line progress bar on stderr, drawn only when stderr is a terminal.
class Progress {
 public:
  explicit Progress(std::string label);
  ~Progress();
  void update(size_t done, size_t total);

 private:
  std::string label_;
  bool active_;
  int last_permille_ = -1;
};

}  // namespace kvq::cli

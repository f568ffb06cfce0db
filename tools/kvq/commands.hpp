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

}  // namespace kvq::cli

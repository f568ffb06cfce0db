// kvq: the command-line program. Every subcommand that prints figures also speaks --json.
#include <cstdio>
#include <exception>

#include "commands.hpp"
#include "kvq/error.hpp"
#include "kvq/version.hpp"

int main(int argc, char** argv) {
  CLI::App app{"kvq: compressed KV caches with attention computed on the packed codes"};
  app.set_version_flag("--version", kvq::version());
  app.require_subcommand(1);
  kvq::cli::add_demo_command(app);
  kvq::cli::add_distortion_command(app);
  kvq::cli::add_attention_error_command(app);
  kvq::cli::add_generate_command(app);
  kvq::cli::add_ppl_command(app);
  kvq::cli::add_calibrate_command(app);
  kvq::cli::add_bench_command(app);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "kvq: error: %s\n", e.what());
    return 1;
  }
  return 0;
}

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>

#include "stitch/cli/commands.h"

int main(int argc, char** argv) {
  // Logs (wake warnings, ...) go to stderr: stdout carries command output.
  spdlog::set_default_logger(spdlog::stderr_color_mt("stitch"));
  spdlog::set_pattern("stitch: %l: %v");
  CLI::App app{"stitch: the versioned control plane for disaggregated reinforcement learning",
               "stitch"};
  app.require_subcommand(1);
  int exit_code = 0;
  stitch::AddClaimCommand(app, &exit_code);
  stitch::AddPublishCommand(app, &exit_code);
  stitch::AddPointerCommand(app, &exit_code);
  stitch::AddDeltaCommand(app, &exit_code);
  stitch::AddEngineCommand(app, &exit_code);
  stitch::AddSidecarCommand(app, &exit_code);
  stitch::AddGatewayCommand(app, &exit_code);
  stitch::AddFleetCommands(app, &exit_code);
  stitch::AddDemoCommand(app, &exit_code);
  stitch::AddChaosCommand(app, &exit_code);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    // CLI11 prints the usage error (or the help); a usage error exits 2.
    return app.exit(e) == 0 ? 0 : 2;
  }
  return exit_code;
}

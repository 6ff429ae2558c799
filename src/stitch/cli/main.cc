#include <CLI/CLI.hpp>

#include "stitch/cli/commands.h"

int main(int argc, char** argv) {
  CLI::App app{"stitch: the versioned control plane for disaggregated reinforcement learning",
               "stitch"};
  app.require_subcommand(1);
  int exit_code = 0;
  stitch::AddClaimCommand(app, &exit_code);
  stitch::AddPublishCommand(app, &exit_code);
  stitch::AddPointerCommand(app, &exit_code);
  stitch::AddDeltaCommand(app, &exit_code);
  CLI11_PARSE(app, argc, argv);
  return exit_code;
}

#include <spdlog/sinks/stdout_color_sinks.h>
#include <spdlog/spdlog.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <iostream>
#include <string>
#include <vector>

#include "stitch/cli/commands.h"

namespace {

// CLI11 lists what it did not expect last-first, flags mixed with their
// values; this names the unknown flags once, in the order given.
void ReportExtras(const CLI::App& app) {
  // The command whose arguments were not expected: the first, from the top,
  // left with some.
  const CLI::App* cmd = &app;
  std::string path = "stitch";
  while (cmd->remaining_size() == 0 && !cmd->get_subcommands().empty()) {
    cmd = cmd->get_subcommands().back();
    path += " " + cmd->get_name();
  }
  std::vector<std::string> extras = cmd->remaining();
  std::reverse(extras.begin(), extras.end());
  std::vector<std::string> flags;
  std::vector<std::string> others;
  for (const std::string& arg : extras) {
    if (arg.size() > 1 && arg[0] == '-') {
      std::string flag = arg.substr(0, arg.find('='));
      if (std::find(flags.begin(), flags.end(), flag) == flags.end()) flags.push_back(flag);
    } else {
      others.push_back(arg);
    }
  }
  auto join = [](const std::vector<std::string>& items) {
    std::string out;
    for (const std::string& item : items) out += (out.empty() ? "" : " ") + item;
    return out;
  };
  std::string message = path == "stitch" ? "stitch: " : "stitch: " + path.substr(7) + ": ";
  if (!flags.empty()) {
    message += (flags.size() > 1 ? "unknown flags " : "unknown flag ") + join(flags);
  } else {
    message += "unexpected arguments: " + join(others);
  }
  std::cerr << message << " (see `" << path << " --help`)\n";
}

}  // namespace

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
  stitch::AddRetentionCommands(app, &exit_code);
  stitch::AddDeltaCommand(app, &exit_code);
  stitch::AddEngineCommand(app, &exit_code);
  stitch::AddSidecarCommand(app, &exit_code);
  stitch::AddGatewayCommand(app, &exit_code);
  stitch::AddFleetCommands(app, &exit_code);
  stitch::AddDemoCommand(app, &exit_code);
  stitch::AddChaosCommand(app, &exit_code);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ExtrasError&) {
    ReportExtras(app);
    return 2;
  } catch (const CLI::ParseError& e) {
    // CLI11 prints the usage error (or the help); a usage error exits 2.
    return app.exit(e) == 0 ? 0 : 2;
  }
  return exit_code;
}

// The `stitch` command's subcommands. Each Add*Command registers one
// subcommand (and its own options) on `app`; when it is selected, its
// callback runs the command and sets `*exit_code`. A failure prints one line,
// "stitch: <what went wrong and what to do>", to stderr and exits non-zero.
#pragma once

namespace CLI {
class App;
}

namespace stitch {

void AddClaimCommand(CLI::App& app, int* exit_code);
void AddPublishCommand(CLI::App& app, int* exit_code);
void AddPointerCommand(CLI::App& app, int* exit_code);
// gc, hold and release.
void AddRetentionCommands(CLI::App& app, int* exit_code);
void AddDeltaCommand(CLI::App& app, int* exit_code);
void AddEngineCommand(CLI::App& app, int* exit_code);
void AddSidecarCommand(CLI::App& app, int* exit_code);
void AddGatewayCommand(CLI::App& app, int* exit_code);
// status, wait-ready and smoke.
void AddFleetCommands(CLI::App& app, int* exit_code);
// `stitch demo`: asynchronous RL on a local elastic fleet.
void AddDemoCommand(CLI::App& app, int* exit_code);
// `stitch chaos`: the fault-injection suite.
void AddChaosCommand(CLI::App& app, int* exit_code);

}  // namespace stitch

#include <CLI/CLI.hpp>
#include <cstdint>
#include <iostream>
#include <memory>
#include <string>

#include "stitch/cli/commands.h"
#include "stitch/cli/report.h"
#include "stitch/cli/store_args.h"
#include "stitch/publish/claim.h"
#include "stitch/store/store.h"

namespace stitch {
namespace {

struct ClaimArgs : StoreArgs {
  int64_t boot_version = 0;
};

int RunClaim(const ClaimArgs& args) {
  auto opened = OpenStoreArgs(args);
  if (!opened.ok()) return ReportFailure(opened.status());
  const std::unique_ptr<Store>& store = opened->store;
  auto outcome = ClaimRun(*store, args.boot_version, opened->pool.get());
  if (!outcome.ok()) return ReportFailure(outcome.status());
  if (outcome->moved) {
    std::cout << "claimed " << outcome->pointer.ToString() << " in " << store->uri()
              << " (the pointer was "
              << (outcome->previous ? outcome->previous->ToString() : std::string("unset"))
              << ")\n";
  } else {
    std::cout << "already claimed: " << outcome->pointer.ToString() << " in " << store->uri()
              << "\n";
  }
  return 0;
}

}  // namespace

void AddClaimCommand(CLI::App& app, int* exit_code) {
  static ClaimArgs args;
  CLI::App* cmd = app.add_subcommand(
      "claim", "Point the store at a run's boot version (a run change); repeating it is a no-op");
  AddStoreOptions(cmd, &args, "The run to claim");
  cmd->add_option("--boot-version", args.boot_version,
                  "Version of the checkpoint the run boots from (0 for a fresh run)")
      ->check(CLI::NonNegativeNumber);
  cmd->callback([exit_code] { *exit_code = RunClaim(args); });
}

}  // namespace stitch

#include <CLI/CLI.hpp>
#include <cstdint>
#include <iostream>
#include <memory>
#include <string>

#include "stitch/cli/commands.h"
#include "stitch/cli/report.h"
#include "stitch/pool/pool.h"
#include "stitch/publish/claim.h"
#include "stitch/store/store.h"

namespace stitch {
namespace {

struct ClaimArgs {
  std::string store;
  std::string run_id;
  int64_t boot_version = 0;
  std::string pool;
  std::string cache_dir;
};

int RunClaim(const ClaimArgs& args) {
  auto store = OpenStore(args.store, StoreOptions{args.run_id, args.cache_dir});
  if (!store.ok()) return ReportFailure(store.status());
  std::unique_ptr<Pool> pool;
  if (!args.pool.empty()) {
    auto made = MakePool(args.pool);
    if (!made.ok()) return ReportFailure(made.status());
    pool = *std::move(made);
  }
  auto outcome = ClaimRun(**store, args.boot_version, pool.get());
  if (!outcome.ok()) return ReportFailure(outcome.status());
  if (outcome->moved) {
    std::cout << "claimed " << outcome->pointer.ToString() << " in " << (*store)->uri()
              << " (the pointer was "
              << (outcome->previous ? outcome->previous->ToString() : std::string("unset"))
              << ")\n";
  } else {
    std::cout << "already claimed: " << outcome->pointer.ToString() << " in " << (*store)->uri()
              << "\n";
  }
  return 0;
}

}  // namespace

void AddClaimCommand(CLI::App& app, int* exit_code) {
  static ClaimArgs args;
  CLI::App* cmd = app.add_subcommand(
      "claim", "Point the store at a run's boot version (a run change); repeating it is a no-op");
  cmd->add_option("--store", args.store,
                  "Store URI: a path, file:///abs/path, mem://NAME or "
                  "s3://BUCKET/PREFIX[?endpoint=URL&region=R]")
      ->required();
  cmd->add_option("--run-id", args.run_id, "The run to claim")->required();
  cmd->add_option("--boot-version", args.boot_version,
                  "Version of the checkpoint the run boots from (0 for a fresh run)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--pool", args.pool, "Replicas to wake: static:URL,URL,...");
  cmd->add_option("--cache-dir", args.cache_dir,
                  "Where remote (s3://) stores download versions (unused by local stores)");
  cmd->callback([exit_code] { *exit_code = RunClaim(args); });
}

}  // namespace stitch

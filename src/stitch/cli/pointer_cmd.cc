#include <CLI/CLI.hpp>
#include <iostream>
#include <string>

#include "stitch/cli/commands.h"
#include "stitch/cli/report.h"
#include "stitch/cli/store_args.h"
#include "stitch/fetch/open_store.h"
#include "stitch/store/store.h"

namespace stitch {
namespace {

int RunPointer(const std::string& store_uri, const std::string& cache_dir) {
  // No run id: reading the pointer is not scoped to a run.
  auto store = OpenStore(store_uri, StoreOptions{{}, cache_dir});
  if (!store.ok()) return ReportFailure(store.status());
  auto pointer = ReadClaimedPointer(**store);
  if (!pointer.ok()) return ReportFailure(pointer.status());
  std::cout << pointer->ToString() << "\n";
  return 0;
}

}  // namespace

void AddPointerCommand(CLI::App& app, int* exit_code) {
  static std::string store_uri;
  static std::string cache_dir;
  CLI::App* cmd = app.add_subcommand(
      "pointer",
      "Print the version the store's pointer names (exit 1 if the store does not exist)");
  cmd->add_option("--store", store_uri, kStoreUriHelp)->required();
  cmd->add_option("--cache-dir", cache_dir,
                  "Where remote (s3://) stores download versions (unused by local stores)");
  cmd->callback([exit_code] { *exit_code = RunPointer(store_uri, cache_dir); });
}

}  // namespace stitch

#include <CLI/CLI.hpp>
#include <iostream>
#include <memory>
#include <optional>
#include <string>

#include "stitch/cli/commands.h"
#include "stitch/cli/report.h"
#include "stitch/cli/store_args.h"
#include "stitch/publish/publish.h"
#include "stitch/store/store.h"

namespace stitch {
namespace {

struct PublishArgs : StoreArgs {
  std::string dir;
  std::optional<std::string> base;
};

int RunPublish(const PublishArgs& args) {
  auto opened = OpenStoreArgs(args);
  if (!opened.ok()) return ReportFailure(opened.status());
  PublishOptions options;
  if (args.base) options.base_checkpoint = *args.base;
  auto published = PublishVersion(*opened->store, args.dir, opened->pool.get(), options);
  if (!published.ok()) return ReportFailure(published.status());
  std::cout << "published " << published->ToString() << " to " << opened->store->uri() << "\n";
  return 0;
}

}  // namespace

void AddPublishCommand(CLI::App& app, int* exit_code) {
  static PublishArgs args;
  CLI::App* cmd = app.add_subcommand(
      "publish",
      "Verify a version directory (weight_vNNNNNN: the pointer's version + 1) of a claimed run, "
      "publish it and move the pointer to it");
  AddStoreOptions(cmd, &args, "The claimed run the version belongs to");
  cmd->add_option("dir", args.dir,
                  "Version directory named weight_vNNNNNN, holding the index and its files")
      ->required();
  cmd->add_option("--base", args.base,
                  "Complete checkpoint of the pointer's version: a DELTA's every checksum is "
                  "verified against it before the pointer moves (without it, its frames are "
                  "decoded and checked, not their checksums)");
  cmd->callback([exit_code] { *exit_code = RunPublish(args); });
}

}  // namespace stitch

#include <CLI/CLI.hpp>
#include <iostream>
#include <memory>
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
};

int RunPublish(const PublishArgs& args) {
  auto opened = OpenStoreArgs(args);
  if (!opened.ok()) return ReportFailure(opened.status());
  auto published = PublishVersion(*opened->store, args.dir, opened->pool.get());
  if (!published.ok()) return ReportFailure(published.status());
  std::cout << "published " << published->ToString() << " to " << opened->store->uri() << "\n";
  return 0;
}

}  // namespace

void AddPublishCommand(CLI::App& app, int* exit_code) {
  static PublishArgs args;
  CLI::App* cmd = app.add_subcommand(
      "publish",
      "Publish a version directory (weight_vNNNNNN) of a claimed run and move the pointer to it");
  AddStoreOptions(cmd, &args, "The claimed run the version belongs to");
  cmd->add_option("dir", args.dir,
                  "Version directory named weight_vNNNNNN, holding the index and its files")
      ->required();
  cmd->callback([exit_code] { *exit_code = RunPublish(args); });
}

}  // namespace stitch

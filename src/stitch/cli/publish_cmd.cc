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
  if (published->already_published) {
    std::cout << "already published " << published->version.ToString() << " with these bytes in "
              << opened->store->uri() << "; nothing changed\n";
  } else {
    std::cout << "published " << published->version.ToString() << " to " << opened->store->uri()
              << "\n";
  }
  return 0;
}

}  // namespace

void AddPublishCommand(CLI::App& app, int* exit_code) {
  static PublishArgs args;
  CLI::App* cmd = app.add_subcommand(
      "publish",
      "Verify a version directory (weight_vNNNNNN: the pointer's version + 1) of a claimed run, "
      "publish it and move the pointer to it; the version the pointer names, with the bytes "
      "published, is a successful no-op (a retry)");
  AddStoreOptions(cmd, &args, "The claimed run the version belongs to");
  cmd->add_option("dir", args.dir,
                  "Version directory named weight_vNNNNNN, holding the index, its files and the "
                  "other files engines load with them (config.json, tokenizer files)")
      ->required();
  cmd->add_option("--base", args.base,
                  "Complete checkpoint of the pointer's version: a DELTA's every checksum is "
                  "verified against it before the pointer moves (without it, its frames are "
                  "decoded and checked, not their checksums)");
  cmd->callback([exit_code] { *exit_code = RunPublish(args); });
}

}  // namespace stitch

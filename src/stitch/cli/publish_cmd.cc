#include <CLI/CLI.hpp>
#include <iostream>
#include <memory>
#include <string>

#include "stitch/cli/commands.h"
#include "stitch/cli/report.h"
#include "stitch/pool/pool.h"
#include "stitch/publish/publish.h"
#include "stitch/store/store.h"

namespace stitch {
namespace {

struct PublishArgs {
  std::string store;
  std::string run_id;
  std::string dir;
  std::string pool;
  std::string cache_dir;
};

int RunPublish(const PublishArgs& args) {
  auto store = OpenStore(args.store, StoreOptions{args.run_id, args.cache_dir});
  if (!store.ok()) return ReportFailure(store.status());
  std::unique_ptr<Pool> pool;
  if (!args.pool.empty()) {
    auto made = MakePool(args.pool);
    if (!made.ok()) return ReportFailure(made.status());
    pool = *std::move(made);
  }
  auto published = PublishVersion(**store, args.dir, pool.get());
  if (!published.ok()) return ReportFailure(published.status());
  std::cout << "published " << published->ToString() << " to " << (*store)->uri() << "\n";
  return 0;
}

}  // namespace

void AddPublishCommand(CLI::App& app, int* exit_code) {
  static PublishArgs args;
  CLI::App* cmd = app.add_subcommand(
      "publish",
      "Publish a version directory (weight_vNNNNNN) of a claimed run and move the pointer to it");
  cmd->add_option("--store", args.store,
                  "Store URI: a path, file:///abs/path, mem://NAME or "
                  "s3://BUCKET/PREFIX[?endpoint=URL&region=R]")
      ->required();
  cmd->add_option("--run-id", args.run_id, "The claimed run the version belongs to")->required();
  cmd->add_option("dir", args.dir,
                  "Version directory named weight_vNNNNNN, holding the index and its files")
      ->required();
  cmd->add_option("--pool", args.pool, "Replicas to wake: static:URL,URL,...");
  cmd->add_option("--cache-dir", args.cache_dir,
                  "Where remote (s3://) stores download versions (unused by local stores)");
  cmd->callback([exit_code] { *exit_code = RunPublish(args); });
}

}  // namespace stitch

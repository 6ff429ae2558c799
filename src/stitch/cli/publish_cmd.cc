#include <CLI/CLI.hpp>
#include <filesystem>
#include <iostream>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <system_error>

#include "absl/time/clock.h"
#include "spdlog/spdlog.h"
#include "stitch/cli/commands.h"
#include "stitch/cli/report.h"
#include "stitch/cli/store_args.h"
#include "stitch/core/errors.h"
#include "stitch/format/index.h"
#include "stitch/publish/anchor.h"
#include "stitch/publish/publish.h"
#include "stitch/store/retention.h"
#include "stitch/store/store.h"

namespace stitch {
namespace {

namespace fs = std::filesystem;

struct PublishArgs : StoreArgs {
  std::string dir;
  std::optional<std::string> base;
  std::optional<int64_t> keep_last;
  int64_t keep_every = 0;
  AnchorBudget anchors;
};

// The payload bytes of the checkpoint in `dir` (its index's files).
absl::StatusOr<uint64_t> CheckpointBytes(const fs::path& dir) {
  auto index = ReadIndex(dir);
  if (!index.ok()) return index.status();
  std::set<std::string> files;
  for (const auto& [tensor, file] : index->weight_map) files.insert(file);
  return FilesBytes(dir, std::vector<std::string>(files.begin(), files.end()));
}

// With an anchor budget, the directory to publish in place of `dir`: a FULL
// anchor written under `scratch` when `dir` is a DELTA the budget makes
// FULL (and `why` says so); `dir` itself otherwise.
absl::StatusOr<fs::path> ApplyAnchorBudget(Store& store, const PublishArgs& args,
                                           const fs::path& scratch, std::string* why) {
  const fs::path dir(args.dir);
  auto index = ReadIndex(dir);
  if (!index.ok()) return dir;  // PublishVersion says what is wrong with it
  auto manifest = index->ToManifest();
  if (!manifest.ok() || manifest->kind != VersionKind::kDelta) return dir;
  auto pointer = ReadClaimedPointer(store);
  if (!pointer.ok()) return pointer.status();
  auto chain = MeasureChain(store, pointer->version);
  if (!chain.ok()) return chain.status();
  std::optional<uint64_t> full_bytes;
  if (args.base) {
    auto bytes = CheckpointBytes(*args.base);
    if (!bytes.ok()) return Annotate(bytes.status(), "--base");
    full_bytes = *bytes;
  }
  if (!AnchorDue(*chain, args.anchors, full_bytes)) return dir;
  std::optional<fs::path> base;
  if (args.base) base = fs::path(*args.base);
  auto full = WriteAnchorFor(store, dir, base, scratch);
  if (!full.ok()) return full.status();
  *why = absl::StrCat(" as a FULL anchor (", chain->deltas, " DELTAs, ", chain->delta_bytes,
                      " bytes, since ", VersionDirName(chain->anchor), ")");
  return *full;
}

// Retention after the publish (`stitch gc`'s rule). The version is
// published whatever happens here: a failure is a warning, and the next
// publish's retention tries again.
void Retain(Store& store, const PublishArgs& args) {
  if (!args.keep_last) return;
  auto report = ApplyRetention(store, RetentionRule{*args.keep_last, args.keep_every}, absl::Now());
  if (!report.ok()) {
    spdlog::warn("retention after publish failed: {}", std::string(report.status().message()));
    return;
  }
  for (int64_t v : report->deleted) std::cout << "deleted " << VersionDirName(v) << "\n";
  for (const std::string& f : report->failures) spdlog::warn("retention: {}", f);
  for (const std::string& w : report->plan.warnings) spdlog::warn("retention: {}", w);
}

int RunPublish(const PublishArgs& args) {
  if (args.keep_last) {
    if (absl::Status s = ValidateRetentionRule({*args.keep_last, args.keep_every}); !s.ok()) {
      ReportFailure(Annotate(s, "publish"));
      return 2;
    }
  }
  if (args.anchors.max_deltas < 0) {
    ReportFailure(absl::InvalidArgumentError("publish: --anchor-every must be 0 or positive"));
    return 2;
  }
  auto opened = OpenStoreArgs(args);
  if (!opened.ok()) return ReportFailure(opened.status());
  PublishOptions options;
  if (args.base) options.base_checkpoint = *args.base;
  const fs::path scratch = fs::path(args.dir).lexically_normal().parent_path() / ".stitch-anchor";
  std::string anchored;
  fs::path dir = args.dir;
  if (args.anchors.enabled()) {
    auto chosen = ApplyAnchorBudget(*opened->store, args, scratch, &anchored);
    if (!chosen.ok()) return ReportFailure(Annotate(chosen.status(), "publish"));
    dir = *chosen;
  }
  auto published = PublishVersion(*opened->store, dir, opened->pool.get(), options);
  if (!anchored.empty()) {
    std::error_code ec;
    fs::remove_all(scratch, ec);
  }
  if (!published.ok()) return ReportFailure(published.status());
  if (published->already_published) {
    std::cout << "already published " << published->version.ToString() << " with these bytes in "
              << opened->store->uri() << "; nothing changed\n";
  } else {
    std::cout << "published " << published->version.ToString() << " to " << opened->store->uri()
              << anchored << "\n";
  }
  Retain(*opened->store, args);
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
  cmd->add_option("--anchor-every", args.anchors.max_deltas,
                  "Anchor budget: publish a DELTA as a FULL version of the same weights once the "
                  "chain since the last FULL holds N DELTAs (0: no count budget)")
      ->capture_default_str();
  cmd->add_flag("--anchor-bytes", args.anchors.by_bytes,
                "Anchor budget: also publish a DELTA as a FULL version once the DELTAs since the "
                "last FULL weigh as much as one FULL version");
  cmd->add_option("--keep-last", args.keep_last,
                  "After publishing, apply retention (`stitch gc`): keep the last K versions");
  cmd->add_option("--keep-every", args.keep_every,
                  "With --keep-last: also keep every version that is a multiple of M")
      ->capture_default_str();
  cmd->callback([exit_code] { *exit_code = RunPublish(args); });
}

}  // namespace stitch

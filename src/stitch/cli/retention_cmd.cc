// `stitch gc`, `stitch hold`, `stitch release` and `stitch compact`: what a
// run of weeks keeps of its versions (store/retention.h), and anchors
// written after the fact (publish/anchor.h).
#include <unistd.h>
#include <CLI/CLI.hpp>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <iostream>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "spdlog/spdlog.h"
#include "stitch/api/replica_client.h"
#include "stitch/cli/commands.h"
#include "stitch/cli/report.h"
#include "stitch/cli/store_args.h"
#include "stitch/core/errors.h"
#include "stitch/fetch/open_store.h"
#include "stitch/net/auth.h"
#include "stitch/pool/pool.h"
#include "stitch/publish/anchor.h"
#include "stitch/store/retention.h"

namespace stitch {
namespace {

// Retention reads indexes and lists objects; it downloads no version, so
// it needs no cache directory.
struct StoreFlag {
  std::string store;
};

void AddStoreFlag(CLI::App* cmd, StoreFlag* flag) {
  cmd->add_option("--store", flag->store, kStoreUriHelp)->required();
}

// Retention acts on the run the pointer names: the store is opened without
// a run id, so that every check is against the pointer.
absl::StatusOr<std::unique_ptr<Store>> OpenForRetention(const StoreFlag& flag) {
  auto store = OpenStore(flag.store, StoreOptions{});
  if (!store.ok()) return store.status();
  if (auto pointer = ReadClaimedPointer(**store); !pointer.ok()) return pointer.status();
  return store;
}

struct GcArgs : StoreFlag {
  RetentionRule rule;
  bool dry_run = false;
};

int RunGc(const GcArgs& args) {
  if (absl::Status s = ValidateRetentionRule(args.rule); !s.ok()) {
    ReportFailure(Annotate(s, "gc"));
    return 2;
  }
  auto store = OpenForRetention(args);
  if (!store.ok()) return ReportFailure(Annotate(store.status(), "gc"));
  auto report = ApplyRetention(**store, args.rule, absl::Now(), args.dry_run);
  if (!report.ok()) return ReportFailure(Annotate(report.status(), "gc"));
  std::cout << DescribeRetention(*report, args.dry_run);
  spdlog::info("gc {}: {} deleted, {} kept, {} failed", (*store)->uri(), report->deleted.size(),
               report->plan.kept.size(), report->failures.size());
  return report->failures.empty() ? 0 : 1;
}

// A pool asked to keep replicas on a version, or to let them go.
struct PoolFlag {
  std::string pool;
  int replicas = 0;
  double wait_s = 600;
  std::string auth_token_file;
};

ReplicaCallOptions PoolCallOptions(const std::string& token) {
  ReplicaCallOptions options;
  options.timeout = std::chrono::seconds(5);
  options.bearer_token = token;
  return options;
}

absl::StatusOr<std::vector<std::string>> DiscoverPool(const std::string& spec) {
  auto pool = MakePool(spec);
  if (!pool.ok()) return Annotate(pool.status(), "--pool");
  auto urls = (*pool)->Discover();
  if (!urls.ok()) return Annotate(urls.status(), "--pool");
  return urls;
}

// Which replicas of the pool to hold for `holder` on `version`: those it
// holds already, then those at the version, then the others, all reachable
// and held by nobody else. FailedPrecondition when fewer than `want`.
absl::StatusOr<std::vector<std::string>> ChooseHeld(const std::vector<std::string>& urls,
                                                    const std::string& token, int64_t version,
                                                    const std::string& holder, int want) {
  const auto infos = ReadServerInfos(urls, PoolCallOptions(token));
  std::vector<std::pair<int, std::string>> ranked;
  for (size_t i = 0; i < urls.size(); ++i) {
    if (!infos[i].ok() || !infos[i]->applied.has_value()) continue;
    const ReplicaState& s = *infos[i];
    if (s.held.has_value() && s.held->holder != holder) continue;
    const int rank = s.held.has_value() ? 0 : s.applied->version == version ? 1 : 2;
    ranked.emplace_back(rank, urls[i]);
  }
  if (static_cast<int>(ranked.size()) < want) {
    return absl::FailedPreconditionError(
        absl::StrCat("the pool has ", ranked.size(),
                     " replica(s) that answer and are not held by another "
                     "holder; ",
                     want, " asked"));
  }
  std::stable_sort(ranked.begin(), ranked.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  std::vector<std::string> out;
  for (int i = 0; i < want; ++i) out.push_back(ranked[i].second);
  return out;
}

// Waits until every one of `urls` serves `version` held by `holder` and is
// ready; DeadlineExceeded naming those that do not.
absl::Status WaitHeld(const std::vector<std::string>& urls, const std::string& token,
                      int64_t version, const std::string& holder, double wait_s) {
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(int64_t(wait_s * 1000));
  for (;;) {
    const auto infos = ReadServerInfos(urls, PoolCallOptions(token));
    std::vector<std::string> waiting;
    for (size_t i = 0; i < urls.size(); ++i) {
      const bool there = infos[i].ok() && infos[i]->ready && infos[i]->held.has_value() &&
                         infos[i]->held->holder == holder && infos[i]->applied.has_value() &&
                         infos[i]->applied->version == version;
      if (!there) {
        waiting.push_back(absl::StrCat(urls[i], " (",
                                       infos[i].ok()
                                           ? (infos[i]->ready ? "loading" : infos[i]->reason)
                                           : std::string(infos[i].status().message()),
                                       ")"));
      }
    }
    if (waiting.empty()) return absl::OkStatus();
    if (std::chrono::steady_clock::now() >= deadline) {
      return absl::DeadlineExceededError(
          absl::StrCat("after ", wait_s, " s, not serving ", VersionDirName(version),
                       " yet: ", absl::StrJoin(waiting, ", "),
                       "; they are held and keep loading it (see `stitch status`)"));
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
}

struct HoldArgs : StoreFlag, PoolFlag {
  int64_t version = -1;
  int64_t ttl_s = 0;
  std::string holder;
};

int RunHold(const HoldArgs& args) {
  if (args.ttl_s <= 0) {
    ReportFailure(absl::InvalidArgumentError("hold: --ttl must be a positive number of seconds"));
    return 2;
  }
  if (!args.pool.empty() && args.replicas < 1) {
    ReportFailure(absl::InvalidArgumentError("hold: --pool needs --replicas (how many to keep)"));
    return 2;
  }
  auto store = OpenForRetention(args);
  if (!store.ok()) return ReportFailure(Annotate(store.status(), "hold"));
  // Which replicas, decided before anything is written: a pool that cannot
  // give them leaves no hold behind.
  std::string token;
  std::vector<std::string> chosen;
  if (!args.pool.empty()) {
    auto loaded = LoadBearerToken(args.auth_token_file, kAuthTokenEnv, "--auth-token-file");
    if (!loaded.ok()) return ReportFailure(Annotate(loaded.status(), "hold"));
    token = *loaded;
    auto urls = DiscoverPool(args.pool);
    if (!urls.ok()) return ReportFailure(Annotate(urls.status(), "hold"));
    auto picked = ChooseHeld(*urls, token, args.version, args.holder, args.replicas);
    if (!picked.ok()) return ReportFailure(Annotate(picked.status(), "hold"));
    chosen = *std::move(picked);
  }
  const absl::Time now = absl::Now();
  Hold hold;
  hold.holder = args.holder;
  hold.version = args.version;
  hold.expires = now + absl::Seconds(args.ttl_s);
  if (absl::Status s = PutHold(**store, hold, now); !s.ok()) {
    return ReportFailure(Annotate(s, "hold"));
  }
  std::cout << "held " << VersionDirName(hold.version) << " in " << (*store)->uri() << " for '"
            << hold.holder << "' until " << absl::FormatTime(hold.expires, absl::UTCTimeZone())
            << "\n";
  if (chosen.empty()) return 0;
  // The store keeps the chain; now the replicas.
  const auto answers = HoldEach(chosen, hold.version, hold.holder, PoolCallOptions(token));
  for (size_t i = 0; i < chosen.size(); ++i) {
    if (!answers[i].ok()) {
      return ReportFailure(Annotate(answers[i].status(), absl::StrCat("hold: ", chosen[i])));
    }
  }
  if (absl::Status s = WaitHeld(chosen, token, hold.version, hold.holder, args.wait_s); !s.ok()) {
    return ReportFailure(Annotate(s, "hold"));
  }
  for (const std::string& url : chosen) {
    std::cout << "replica " << url << " serves " << VersionDirName(hold.version) << " for '"
              << hold.holder << "'\n";
  }
  return 0;
}

struct ReleaseArgs : StoreFlag, PoolFlag {
  std::string holder;
};

int RunRelease(const ReleaseArgs& args) {
  auto store = OpenForRetention(args);
  if (!store.ok()) return ReportFailure(Annotate(store.status(), "release"));
  if (!args.pool.empty()) {
    // The replicas first: they go back to following the pointer whether
    // or not the store's hold is still there.
    auto token = LoadBearerToken(args.auth_token_file, kAuthTokenEnv, "--auth-token-file");
    if (!token.ok()) return ReportFailure(Annotate(token.status(), "release"));
    auto urls = DiscoverPool(args.pool);
    if (!urls.ok()) return ReportFailure(Annotate(urls.status(), "release"));
    const auto answers = ReleaseEach(*urls, args.holder, PoolCallOptions(*token));
    int released = 0;
    for (size_t i = 0; i < urls->size(); ++i) {
      if (answers[i].ok()) {
        ++released;
        std::cout << "replica " << (*urls)[i] << " released: it catches up with the pointer\n";
      } else if (!absl::IsNotFound(answers[i].status())) {
        return ReportFailure(Annotate(answers[i].status(), absl::StrCat("release: ", (*urls)[i])));
      }
    }
    std::cout << released << " replica(s) released\n";
  }
  auto hold = ReleaseHold(**store, args.holder);
  if (!hold.ok()) return ReportFailure(Annotate(hold.status(), "release"));
  std::cout << "released '" << args.holder << "' (" << VersionDirName(hold->version) << ") in "
            << (*store)->uri() << "\n";
  return 0;
}

void AddPoolFlags(CLI::App* cmd, PoolFlag* flag, bool hold) {
  if (hold) {
    CLI::Option* pool = cmd->add_option(
        "--pool", flag->pool,
        "Also keep replicas of this pool on the version (static:URL,..., file:PATH or "
        "dns:NAME:PORT): they stop following the pointer and the gateway routes them exact pins "
        "at it");
    cmd->add_option("--replicas", flag->replicas, "How many replicas the pool keeps on it")
        ->check(CLI::PositiveNumber)
        ->needs(pool);
    cmd->add_option("--wait", flag->wait_s,
                    "Seconds to wait for the held replicas to serve the version")
        ->capture_default_str();
  } else {
    cmd->add_option("--pool", flag->pool,
                    "Also let this pool's replicas held by the holder follow the pointer again "
                    "(each catches up before it re-enters rotation)");
  }
  cmd->add_option("--auth-token-file", flag->auth_token_file,
                  "File holding the fleet's bearer token (default: $STITCH_AUTH_TOKEN when set)");
}

struct CompactArgs : StoreFlag {
  int64_t version = -1;  // -1: the pointer's
  std::string cache_dir;
  std::string work_dir;
  std::string base;
  int64_t boot_version = 0;
};

int RunCompact(const CompactArgs& args) {
  auto fail = [](const absl::Status& s) { return ReportFailure(Annotate(s, "compact")); };
  StoreOptions options;
  options.cache_dir = args.cache_dir;
  auto view = OpenStore(args.store, options);
  if (!view.ok()) return fail(view.status());
  auto pointer = ReadClaimedPointer(**view);
  if (!pointer.ok()) return fail(pointer.status());
  // The anchor is written as the pointer's run's.
  options.run_id = pointer->run_id;
  auto store = OpenStore(args.store, options);
  if (!store.ok()) return fail(store.status());
  const int64_t version = args.version < 0 ? pointer->version : args.version;
  if (version > pointer->version) {
    return fail(absl::InvalidArgumentError(
        absl::StrCat(VersionDirName(version), " is past the pointer (", pointer->ToString(),
                     "); compact versions the pointer has reached")));
  }
  Store* anchors = (*store)->anchors();
  if (anchors == nullptr) {
    return fail(absl::FailedPreconditionError(
        absl::StrCat("store ", (*store)->uri(), " keeps no anchors")));
  }
  std::optional<BootCheckpoint> boot;
  if (!args.base.empty()) boot = BootCheckpoint{args.base, args.boot_version};
  const std::filesystem::path work =
      std::filesystem::path(args.work_dir.empty() ? std::filesystem::temp_directory_path()
                                                  : std::filesystem::path(args.work_dir)) /
      absl::StrCat(".stitch-compact-", ::getpid());
  struct Cleanup {
    std::filesystem::path path;
    ~Cleanup() {
      std::error_code ec;
      std::filesystem::remove_all(path, ec);
    }
  } cleanup{work};
  auto written = WriteAnchorOf(**store, version, boot, work);
  if (absl::IsAlreadyExists(written.status())) {
    std::cout << written.status().message() << ": nothing to do\n";
    return 0;
  }
  if (!written.ok()) return fail(written.status());
  if (absl::Status s = anchors->PublishFiles(version, *written); !s.ok()) return fail(s);
  auto bytes = MeasureChain(*anchors, version);
  std::cout << "wrote the anchor of " << VersionDirName(version) << " in " << anchors->uri();
  if (bytes.ok()) std::cout << " (" << bytes->anchor_bytes << " bytes)";
  std::cout << ": a replica joining at or after it starts there\n";
  spdlog::info("compact {}: anchored {}", (*store)->uri(), VersionDirName(version));
  return 0;
}

}  // namespace

void AddRetentionCommands(CLI::App& app, int* exit_code) {
  static CompactArgs compact;
  CLI::App* c = app.add_subcommand(
      "compact",
      "Write an anchor after the fact: a FULL copy of a DELTA version (default: the pointer's), "
      "built from its chain, that later joins start from and that lets gc delete the chain "
      "behind it");
  AddStoreFlag(c, &compact);
  c->add_option("--version", compact.version, "The version to anchor (default: the pointer's)");
  c->add_option("--cache-dir", compact.cache_dir,
                "Where a remote store's versions are downloaded to build the anchor");
  c->add_option("--work-dir", compact.work_dir,
                "Where the anchor is built before it is published; needs room for two copies of "
                "the weights (default: the system's temporary directory)");
  c->add_option("--base", compact.base,
                "The run's boot checkpoint, when the chain reaches it (no FULL version or anchor "
                "in the store before)");
  c->add_option("--boot-version", compact.boot_version, "The boot checkpoint's version")
      ->capture_default_str();
  c->callback([exit_code] { *exit_code = RunCompact(compact); });

  static GcArgs gc;
  CLI::App* g = app.add_subcommand(
      "gc",
      "Delete the versions nothing needs: all but the pointer's, the last K, the milestones and "
      "the held ones, each with its chain back to its anchor; prints what it deleted and why it "
      "kept the rest");
  AddStoreFlag(g, &gc);
  g->add_option("--keep-last", gc.rule.keep_last, "Keep the last K versions up to the pointer")
      ->required();
  g->add_option("--keep-every", gc.rule.keep_every,
                "Keep every version that is a multiple of M (milestones; 0: none)")
      ->capture_default_str();
  g->add_flag("--dry-run", gc.dry_run, "Print the plan, delete nothing");
  g->callback([exit_code] { *exit_code = RunGc(gc); });

  static HoldArgs hold;
  CLI::App* h = app.add_subcommand(
      "hold",
      "Keep a version (and its chain) from retention until a TTL, under a holder's name (a new "
      "hold by the same holder replaces its last one)");
  AddStoreFlag(h, &hold);
  h->add_option("--version", hold.version, "The version to keep")->required();
  h->add_option("--ttl", hold.ttl_s, "Seconds until the hold expires")->required();
  h->add_option("--holder", hold.holder,
                "Who holds it: [A-Za-z0-9._-], as `stitch release` names it")
      ->required();
  AddPoolFlags(h, &hold, /*hold=*/true);
  h->callback([exit_code] { *exit_code = RunHold(hold); });

  static ReleaseArgs release;
  CLI::App* r = app.add_subcommand("release", "Drop a holder's hold");
  AddStoreFlag(r, &release);
  r->add_option("--holder", release.holder, "The holder whose hold goes")->required();
  AddPoolFlags(r, &release, /*hold=*/false);
  r->callback([exit_code] { *exit_code = RunRelease(release); });
}

}  // namespace stitch

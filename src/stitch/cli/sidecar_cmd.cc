// `stitch sidecar`: the replica sidecar beside one inference engine
// (docs/sidecar.md). Exit status: 0 after SIGINT or SIGTERM, 1 when it could
// not start, 2 for refused flags, 3 after a terminal error (a failed commit,
// a dead engine), so that a supervisor replaces the replica. A --run-id
// other than the run the store holds at start is a refused flag.
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <csignal>
#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <memory>
#include <optional>
#include <thread>

#include <spdlog/spdlog.h>
#include <boost/asio/signal_set.hpp>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/notification.h"
#include "absl/time/time.h"
#include "stitch/api/routes.h"
#include "stitch/cli/commands.h"
#include "stitch/cli/report.h"
#include "stitch/cli/server_args.h"
#include "stitch/cli/sidecar_flags.h"
#include "stitch/core/errors.h"
#include "stitch/engine/sglang_engine.h"
#include "stitch/engine/vllm_engine.h"
#include "stitch/fetch/open_store.h"
#include "stitch/format/index.h"
#include "stitch/net/auth.h"
#include "stitch/net/clock.h"
#include "stitch/net/event_loop.h"
#include "stitch/net/server.h"
#include "stitch/net/worker_pool.h"
#include "stitch/pool/pool.h"
#include "stitch/replica/sidecar.h"
#include "stitch/store/store.h"

namespace stitch {
namespace {

constexpr int kExitRefused = 2;
constexpr int kExitTerminal = 3;
// How long an orderly shutdown may take before the process just ends.
constexpr auto kShutdownGrace = std::chrono::seconds(10);

// Where a remote store caches versions: --cache-dir (or the original's
// --bulletin-root), else beside the local checkpoint when there is one, else
// a fresh temporary directory.
absl::StatusOr<std::filesystem::path> CacheDir(const SidecarConfig& config) {
  if (!config.cache_dir.empty()) return config.cache_dir;
  if (!config.local_checkpoint.empty()) {
    std::filesystem::path local = std::filesystem::absolute(config.local_checkpoint);
    return local.parent_path() / absl::StrCat(".", local.filename().string(), ".store-cache");
  }
  std::string pattern = (std::filesystem::temp_directory_path() / "stitch-sidecar-XXXXXX").string();
  if (::mkdtemp(pattern.data()) == nullptr) {
    return absl::InternalError(absl::StrCat("sidecar: cannot create a cache directory under ",
                                            std::filesystem::temp_directory_path().string()));
  }
  return std::filesystem::path(pattern);
}

// Ends the process if an orderly shutdown hangs (an engine that never
// answers must not keep a dead replica around).
class ShutdownDeadline {
 public:
  explicit ShutdownDeadline(int exit_code)
      : thread_([this, exit_code] {
          if (!done_.WaitForNotificationWithTimeout(absl::FromChrono(kShutdownGrace))) {
            std::cerr << "stitch: sidecar: shutdown took longer than " << kShutdownGrace.count()
                      << " s; exiting now\n";
            std::_Exit(exit_code);
          }
        }) {}
  ~ShutdownDeadline() {
    done_.Notify();
    thread_.join();
  }

 private:
  absl::Notification done_;
  std::thread thread_;
};

// The adapter for the engine kind the flags name.
absl::StatusOr<std::unique_ptr<Engine>> MakeEngine(const SidecarConfig& config,
                                                   const std::string& engine_token,
                                                   const boost::asio::any_io_executor& executor,
                                                   WorkerPool& pool) {
  if (config.engine == EngineKind::kVllm) {
    VllmEngineOptions vllm_options;
    vllm_options.url = config.engine_url;
    vllm_options.base_checkpoint_dir = config.reconciler.base_checkpoint_dir;
    vllm_options.local_checkpoint_dir = config.local_checkpoint;
    vllm_options.pause_mode = config.reconciler.commit_mode == CommitMode::kQuiesce
                                  ? VllmPauseMode::kWait
                                  : VllmPauseMode::kKeep;
    vllm_options.api_key = engine_token;
    vllm_options.patch = config.patch_commits;
    vllm_options.patch_max_density = config.patch_max_density;
    vllm_options.patch_verify = config.patch_verify;
    auto made = VllmEngine::Make(executor, vllm_options, pool);
    if (!made.ok()) return made.status();
    return std::unique_ptr<Engine>(*std::move(made));
  }
  SglangEngineOptions engine_options;
  engine_options.url = config.engine_url;
  engine_options.base_checkpoint_dir = config.reconciler.base_checkpoint_dir;
  engine_options.local_checkpoint_dir = config.local_checkpoint;
  engine_options.destination = config.update_mode;
  engine_options.load_format = config.disk_load_format;
  engine_options.api_key = engine_token;
  engine_options.patch_max_density = config.patch_max_density;
  engine_options.patch_verify = config.patch_verify;
  if (config.engine == EngineKind::kSglangStock) {
    auto made = StockSglangEngine::Make(executor, engine_options, pool);
    if (!made.ok()) return made.status();
    return std::unique_ptr<Engine>(*std::move(made));
  }
  auto made = SglangEngine::Make(executor, engine_options);
  if (!made.ok()) return made.status();
  return std::unique_ptr<Engine>(*std::move(made));
}

// The sidecar's settings from its checked flags and tokens.
Sidecar::Settings SettingsFor(const SidecarConfig& config, bool auth_data_plane,
                              const std::string& auth_token, const std::string& engine_token) {
  Sidecar::Settings settings;
  settings.reconciler = config.reconciler;
  settings.watchdog = config.watchdog;
  settings.proxy.engine = config.engine_http.origin;
  settings.proxy.rid_field =
      config.engine == EngineKind::kVllm ? EngineRidField::kRequestId : EngineRidField::kRid;
  settings.proxy.dialect =
      config.engine == EngineKind::kVllm ? EngineDialect::kVllm : EngineDialect::kSglang;
  settings.proxy.engine_token = engine_token;
  settings.proxy.assemble_whole_generate = config.assemble_whole_generate;
  settings.proxy.own_authorization = !auth_token.empty();
  settings.auth_token = auth_token;
  settings.auth_data_plane = auth_data_plane;
  settings.log_requests = config.log_requests;
  settings.server = config.server;
  return settings;
}

// The fleet's token and the engine's key.
struct SidecarTokens {
  std::string fleet;
  std::string engine;
};

// Reads both tokens, and refuses (InvalidArgument) what needs a fleet token
// without one.
absl::StatusOr<SidecarTokens> LoadSidecarTokens(const SidecarFlags& flags) {
  auto fleet = LoadBearerToken(flags.auth_token_file, kAuthTokenEnv, "--auth-token-file");
  if (!fleet.ok()) return Annotate(fleet.status(), "sidecar");
  auto engine =
      LoadBearerToken(flags.engine_token_file, "STITCH_ENGINE_TOKEN", "--engine-token-file");
  if (!engine.ok()) return Annotate(engine.status(), "sidecar");
  if (flags.auth_data_plane && fleet->empty()) {
    return absl::InvalidArgumentError(
        "sidecar: --auth-data-plane needs a token: give --auth-token-file or set "
        "STITCH_AUTH_TOKEN");
  }
  // A sidecar in a fleet with peers serves every version its store verified
  // on GET /peer/v1/file; without a token that would be to anyone who can
  // reach it.
  if (!flags.peers.empty() && fleet->empty()) {
    return absl::InvalidArgumentError(
        "sidecar: --peers needs the fleet's token, which guards the version files this sidecar "
        "then serves its peers: give --auth-token-file or set STITCH_AUTH_TOKEN (the same on "
        "every replica)");
  }
  return SidecarTokens{*std::move(fleet), *std::move(engine)};
}

// Opens the store the sidecar follows, with its peers (asked with the
// fleet's token) and the index bounds of its base checkpoint; a store that
// was never claimed is FailedPrecondition.
absl::StatusOr<std::unique_ptr<Store>> OpenSidecarStore(const SidecarConfig& config,
                                                        const SidecarFlags& flags,
                                                        const std::string& fleet_token) {
  auto cache = CacheDir(config);
  if (!cache.ok()) return cache.status();
  StoreOptions store_options{config.reconciler.run_id, *cache, config.peers};
  if (!flags.peers.empty()) {
    auto pool = MakePool(flags.peers);
    if (!pool.ok()) return Annotate(pool.status(), "sidecar: --peers");
    std::shared_ptr<Pool> peers = *std::move(pool);
    store_options.peers.discover = [peers]() -> std::vector<std::string> {
      auto urls = peers->Discover();
      if (urls.ok()) return *std::move(urls);
      spdlog::warn("--peers {}: {}; fetching from the store", peers->spec(),
                   std::string(urls.status().message()));
      return {};
    };
  }
  // Peers are sidecars of the same fleet: the same token opens their routes.
  store_options.peers.token = fleet_token;
  // A version's index lists the model's tensors: one far larger than the
  // base checkpoint's is refused before it is read, whatever wrote it. A
  // base that cannot be read leaves the default bounds (the engine's
  // verification then says what is wrong with it).
  if (auto base = ReadIndex(config.reconciler.base_checkpoint_dir); base.ok()) {
    store_options.index_bounds = IndexBoundsFor(*base);
  }
  auto store = OpenStore(config.store_uri, store_options);
  if (!store.ok()) return Annotate(store.status(), "sidecar: --store");
  return store;
}

// Whether the store's run is the sidecar's: a store that was never claimed
// is a mistyped --store far more often than a trainer that has not started
// (following it would label whatever the engine holds as the boot version),
// FailedPrecondition; a --run-id naming another run than the store's at
// start is a mistake to refuse (InvalidArgument), not a run change to
// follow. Errors reading the pointer are left to the reconciler, which
// retries them.
absl::Status CheckStoreRun(const SidecarConfig& config, Store& store) {
  auto claimed = ReadClaimedPointer(store);
  if (!claimed.ok()) {
    if (absl::IsFailedPrecondition(claimed.status())) {
      return Annotate(claimed.status(), "sidecar: --store");
    }
    return absl::OkStatus();
  }
  return CheckRunMatchesStore(config.reconciler.run_id, store.uri(), *claimed);
}

// Runs the sidecar until SIGINT, SIGTERM or a terminal error, then shuts it
// down (within the shutdown deadline); the process's exit status.
int ServeUntilStopped(const SidecarConfig& config, const SidecarFlags& flags,
                      const SidecarTokens& tokens, std::unique_ptr<Store>& store) {
  WorkerPool pool(2);
  auto loop = std::make_unique<EventLoop>();
  SteadyClock clock;

  auto engine = MakeEngine(config, tokens.engine, loop->executor(), pool);
  if (!engine.ok()) return ReportFailure(Annotate(engine.status(), "sidecar"));

  Sidecar::Settings settings =
      SettingsFor(config, flags.auth_data_plane, tokens.fleet, tokens.engine);
  settings.serve_peers = !flags.peers.empty();
  settings.peer_id = store->peer_id();
  // Both callbacks run on the loop thread, so they never race each other.
  absl::Notification stop;
  std::optional<absl::Status> terminal;  // written on the loop before stop is notified
  settings.on_terminal = [&](const absl::Status& why) {
    if (!stop.HasBeenNotified()) {
      terminal = why;
      stop.Notify();
    }
  };
  Sidecar::Ports ports{loop->executor(), &pool, store.get(), engine->get(), &clock};
  auto started = loop->BlockOn(Sidecar::Start(settings, ports));
  if (!started.ok()) return ReportFailure(started.status());
  std::unique_ptr<Sidecar> sidecar = *std::move(started);
  auto signals = std::make_unique<boost::asio::signal_set>(loop->executor(), SIGINT, SIGTERM);
  signals->async_wait([&](const boost::system::error_code& ec, int) {
    if (!ec && !stop.HasBeenNotified()) stop.Notify();
  });

  std::cout << "stitch sidecar: listening on " << sidecar->url() << " (engine " << config.engine_url
            << " [" << (*engine)->name() << ", " << UpdateDestinationName(config.update_mode)
            << "], store " << store->uri() << ", run " << config.reconciler.run_id << ")"
            << std::endl;

  stop.WaitForNotification();
  const int exit_code = terminal.has_value() ? kExitTerminal : 0;
  if (terminal.has_value()) {
    std::cerr << "stitch: sidecar: terminal error, exiting so that the replica is replaced: "
              << terminal->message() << std::endl;
  }
  {
    ShutdownDeadline deadline(exit_code);
    loop->BlockOn([&]() -> boost::asio::awaitable<void> {
      signals.reset();
      co_await sidecar->Shutdown();
    }());
    // I/O objects go before their loop, once nothing uses them.
    sidecar.reset();
    engine->reset();
    loop.reset();
  }
  return exit_code;
}

// One process's wiring, in the order it happens: flags, tokens, store,
// then serving. A refusal exits 2 (kExitRefused), a failure 1.
int RunSidecar(const SidecarFlags& flags, const BodyLimitArgs& body_limits) {
  auto config = CheckSidecarFlags(flags);
  if (!config.ok()) {
    ReportFailure(config.status());
    return kExitRefused;
  }
  absl::StatusOr<ServerOptions> server = WithBodyLimits(config->server, body_limits, "sidecar");
  if (!server.ok()) {
    ReportFailure(server.status());
    return kExitRefused;
  }
  config->server = *std::move(server);
  RaiseOpenFileLimit();
  auto tokens = LoadSidecarTokens(flags);
  if (!tokens.ok()) {
    ReportFailure(tokens.status());
    return kExitRefused;
  }
  auto store = OpenSidecarStore(*config, flags, tokens->fleet);
  if (!store.ok()) return ReportFailure(store.status());
  if (absl::Status run = CheckStoreRun(*config, **store); !run.ok()) {
    ReportFailure(run);
    return absl::IsFailedPrecondition(run) ? kExitFailure : kExitRefused;
  }
  return ServeUntilStopped(*config, flags, *tokens, *store);
}

// Which store, where its versions are cached, and the peers asked first.
void AddStoreFlags(CLI::App* cmd, SidecarFlags* flags) {
  cmd->add_option("--store", flags->store,
                  "Store URI: a path, file:///abs/path, mem://NAME or "
                  "s3://BUCKET/PREFIX[?endpoint=URL&region=R&anonymous=true] (required unless "
                  "--store-opt names the store)");
  cmd->add_option("--store-opt", flags->store_opts,
                  "The original Stitch's store options, KEY=VALUE, repeatable, instead of "
                  "--store: backend=s3 with s3_root=s3://BUCKET/PREFIX and "
                  "s3_endpoint_url=URL, or backend=local (the store is --bulletin-root)")
      ->take_all()
      ->allow_extra_args(false);
  cmd->add_option("--store-factory", flags->store_factory,
                  std::string("The original Stitch's store factory: only ") +
                      std::string(kOriginalStoreFactory) +
                      " (its --store-opt keys) is understood; give --store otherwise");
  cmd->add_option("--cache-dir", flags->cache_dir,
                  "Where a remote (s3://) store caches versions (default: beside "
                  "--local-checkpoint, else a temporary directory)");
  cmd->add_option("--peers", flags->peers,
                  "Other replicas' sidecars that a remote store asks for a version's files before "
                  "the store itself, as a pool (static:URL,URL, file:PATH, dns:NAME:PORT); every "
                  "file is checked against the SHA-256 the store records, so a peer can delay but "
                  "never poison a replica (docs/deploy.md, \"Peers before the store\"); needs "
                  "the fleet's token (--auth-token-file), which opens the peers' files");
  cmd->add_option("--peer-min-rate", flags->peer_min_rate_mib_s,
                  "MiB/s a peer must send a file at (after --peer-allowance): a slower transfer "
                  "is left for the next peer or the store")
      ->capture_default_str();
  cmd->add_option("--peer-allowance", flags->peer_allowance_s,
                  "Seconds a transfer from a peer gets on top of the file's size at "
                  "--peer-min-rate (and the wait for a file's owner)")
      ->capture_default_str();
  cmd->add_option("--bulletin-root", flags->bulletin_root,
                  "The original Stitch's store root: the cache directory of an S3 store, or the "
                  "store itself with --store-opt backend=local");
}

// The run and the engine: its kind and URL, the checkpoints, how it loads versions.
void AddEngineFlags(CLI::App* cmd, SidecarFlags* flags) {
  cmd->add_option("--run-id", flags->run_id, "The run the base checkpoint belongs to")->required();
  cmd->add_option("--engine", flags->engine,
                  "sglang (stages by itself), sglang-stock or vllm (the sidecar stages)")
      ->capture_default_str();
  cmd->add_option("--engine-url,--upstream", flags->engine_url,
                  "The engine's URL, http://host:port")
      ->required();
  cmd->add_option("--base-checkpoint,--base-checkpoint-dir", flags->base_checkpoint,
                  "The checkpoint directory the engine was started with")
      ->required();
  cmd->add_option("--local-checkpoint,--local-checkpoint-dir", flags->local_checkpoint,
                  "Where versions are staged on disk (required for --update-mode disk and "
                  "sglang-stock)");
  cmd->add_option("--update-mode,--delta-update-mode", flags->update_mode, "disk or cpu")
      ->capture_default_str();
  cmd->add_option("--disk-load-format", flags->disk_load_format,
                  "The engine's load_format for loads from disk (update_weights_from_disk)")
      ->capture_default_str();
}

// How commits happen: in-place patches, the commit mode, the cache flush, how a whole /generate
// reaches the engine.
void AddCommitFlags(CLI::App* cmd, SidecarFlags* flags) {
  cmd->add_flag("--patch-commits", flags->patch_commits,
                "vLLM started with --worker-extension-cls stitch_vllm.WeightPatchExtension: commit "
                "DELTAs by patching the values that changed in place (staged while serving, "
                "undone if they fail), reloading the whole checkpoint when a patch does not fit. "
                "--engine sglang-stock does so without it, when SGLang was started with "
                "--custom-weight-loader stitch_sglang.apply_patch");
  cmd->add_option("--patch-max-density", flags->patch_max_density,
                  "In-place patches (vLLM's, stock SGLang's): reload instead when more than "
                  "this share of the values change")
      ->capture_default_str();
  cmd->add_option("--patch-verify", flags->patch_verify,
                  "In-place patches (vLLM's, stock SGLang's): checksums (hash every patched "
                  "tensor in the engine) or values (read the patched values back)")
      ->capture_default_str();
  cmd->add_option("--commit-mode", flags->commit_mode,
                  "in_place (exact pins drain) or quiesce (everything drains)")
      ->capture_default_str();
  cmd->add_option("--boot-version", flags->boot_version,
                  "The version the base checkpoint holds (a resumed run's saved version)")
      ->capture_default_str();
  cmd->add_flag("--flush-cache-on-commit", flags->flush_cache_on_commit,
                "Flush the engine's prefix cache with every commit");
  cmd->add_option("--whole-generate", flags->whole_generate,
                  "How a whole (not streamed) /generate reaches an SGLang engine: stream (the "
                  "engine streams it and the sidecar assembles the answer, so that version spans "
                  "across a commit are exact; not once the engine reports spans itself) or relay "
                  "(sent whole; spans across a commit are then \"unknown\")")
      ->capture_default_str();
}

// The clocks: the backstop reconcile, the store outage limit, the watchdog, the engine's timeouts.
void AddTimingFlags(CLI::App* cmd, SidecarFlags* flags) {
  cmd->add_option("--reconcile-interval", flags->reconcile_interval_s,
                  "Seconds between backstop reconciles (0 disables them)")
      ->capture_default_str();
  cmd->add_option("--reconcile-max-interval", flags->reconcile_max_interval_s,
                  "Seconds the backstop backs off to (doubling, with jitter) while the replica "
                  "stays at the pointer; publishes wake it at once (at most --reconcile-interval "
                  "disables the backoff)")
      ->capture_default_str();
  cmd->add_option("--store-outage-limit", flags->store_outage_limit_s,
                  "Seconds the store's pointer may stay unreadable before the replica leaves "
                  "rotation until caught up again (0: never)")
      ->capture_default_str();
  cmd->add_option(
         "--watchdog-interval", flags->watchdog_interval_s,
         "Seconds between engine checks: alive, and holding the weights the sidecar loaded (0 "
         "disables the periodic checks; a request that cannot reach the engine still "
         "triggers one)")
      ->capture_default_str();
  cmd->add_option("--watchdog-threshold,--watchdog-failure-threshold", flags->watchdog_threshold,
                  "Failed checks in a row, at least, before the replica ends (and only once the "
                  "start timeout or the restart grace has passed)")
      ->capture_default_str();
  cmd->add_option("--engine-start-timeout", flags->engine_start_timeout_s,
                  "Seconds a sidecar started before its engine waits for it to answer (out of "
                  "rotation, /health 503 saying so) before it ends")
      ->capture_default_str();
  cmd->add_option("--engine-restart-grace", flags->engine_restart_grace_s,
                  "Seconds an engine that went away while serving may take to come back; the "
                  "replica leaves rotation at once, re-verifies the engine when it is back, and "
                  "ends only when this runs out")
      ->capture_default_str();
  cmd->add_option("--engine-check-timeout", flags->engine_check_timeout_s,
                  "Seconds one engine check (health and report) may take")
      ->capture_default_str();
}

// Who may call the sidecar and how it calls the engine, where it listens, what it logs.
void AddAccessFlags(CLI::App* cmd, SidecarFlags* flags) {
  cmd->add_flag("--debug-requests", flags->debug_requests,
                "Log every request the sidecar receives (method and target) at info level");
  cmd->add_option("--auth-token-file", flags->auth_token_file,
                  "File holding a bearer token that POST /wake needs (default: "
                  "$STITCH_AUTH_TOKEN when set; none otherwise)");
  cmd->add_flag("--auth-data-plane", flags->auth_data_plane,
                "Require the token on every route but /health and /metrics (versioned "
                "requests, forwarded routes, /server_info)");
  cmd->add_option("--engine-token-file", flags->engine_token_file,
                  "File holding the engine's API key, sent to it as a bearer token (SGLang's "
                  "--api-key; default: $STITCH_ENGINE_TOKEN when set)");
  AddHostOption(cmd, &flags->host);
  cmd->add_option("--port", flags->port, "Port to listen on (0 picks a free one)")
      ->capture_default_str();
}

}  // namespace

// Long on purpose: the sidecar's flag declarations, one after another.
void AddSidecarCommand(CLI::App& app, int* exit_code) {
  static SidecarFlags flags;
  static BodyLimitArgs body_limits;
  CLI::App* cmd = app.add_subcommand(
      "sidecar",
      "Run the replica sidecar beside one inference engine: follow the store's pointer and serve "
      "the versioned rollout API");
  AddStoreFlags(cmd, &flags);
  AddEngineFlags(cmd, &flags);
  AddCommitFlags(cmd, &flags);
  AddTimingFlags(cmd, &flags);
  AddAccessFlags(cmd, &flags);
  AddBodyLimitOptions(cmd, &body_limits);
  cmd->callback([exit_code] { *exit_code = RunSidecar(flags, body_limits); });
}

}  // namespace stitch

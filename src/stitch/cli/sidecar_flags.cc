#include "stitch/cli/sidecar_flags.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "stitch/core/errors.h"
#include "stitch/core/state.h"
#include "stitch/core/version.h"
#include "stitch/net/clock.h"
#include "stitch/store/s3/s3_sigv4.h"
#include "stitch/store/s3/s3_uri.h"

namespace stitch {

namespace {

absl::Status Refuse(std::string_view message) {
  return absl::InvalidArgumentError(absl::StrCat("sidecar: ", AbslView(message)));
}

absl::StatusOr<Clock::Duration> Seconds(double seconds, std::string_view flag) {
  if (!std::isfinite(seconds) || seconds < 0 || seconds > 1e7) {
    return Refuse(absl::StrCat(AbslView(flag), " must be a number of seconds >= 0 (got ", seconds,
                               "); 0 disables it"));
  }
  return std::chrono::duration_cast<Clock::Duration>(std::chrono::duration<double>(seconds));
}

constexpr char kStoreForms[] =
    "--store URI (a path, file:///abs/path or s3://BUCKET/PREFIX?endpoint=URL)";

// Where the store is and where it caches versions, from --store or the
// original's --store-factory/--store-opt/--bulletin-root, which the
// original's cookbook factory turned into a Store as follows: backend=s3
// is an S3 store at s3_root (endpoint s3_endpoint_url) caching under the
// local root; backend=modal-volume a Modal Volume mounted at the local root.
// Long on purpose: one case per form of the original's store flags, each
// refused with the flag that replaces it.
absl::Status ResolveStore(const SidecarFlags& flags, SidecarConfig& config) {
  if (!flags.store_factory.empty() && flags.store_factory != kOriginalStoreFactory) {
    return Refuse(absl::StrCat("--store-factory ", flags.store_factory,
                               ": a Python store factory cannot back this sidecar; give ",
                               kStoreForms, " instead"));
  }
  if (!flags.store.empty() && !flags.store_opts.empty()) {
    return Refuse(
        absl::StrCat("--store and --store-opt both name a store: give ", kStoreForms, " alone"));
  }
  std::string cache = flags.cache_dir;
  if (!flags.bulletin_root.empty() && !cache.empty() && cache != flags.bulletin_root) {
    return Refuse(absl::StrCat("--cache-dir ", cache, " and --bulletin-root ", flags.bulletin_root,
                               " name two cache directories: give one"));
  }
  if (flags.store_opts.empty()) {
    if (flags.store.empty()) {
      return Refuse(absl::StrCat("--store is required: give ", kStoreForms,
                                 ", the store the trainer publishes to"));
    }
    config.store_uri = flags.store;
    config.cache_dir = cache.empty() ? flags.bulletin_root : cache;
    return absl::OkStatus();
  }

  absl::flat_hash_map<std::string, std::string> opts;
  for (const std::string& opt : flags.store_opts) {
    const size_t eq = opt.find('=');
    if (eq == std::string::npos || eq == 0) {
      return Refuse(absl::StrCat("--store-opt expects KEY=VALUE (got \"", opt, "\")"));
    }
    std::string key = opt.substr(0, eq);
    if (key != "backend" && key != "s3_root" && key != "s3_endpoint_url" && key != "volume_name") {
      return Refuse(absl::StrCat("--store-opt ", key,
                                 " is not a store option here (known: backend, s3_root, "
                                 "s3_endpoint_url, volume_name); or give ",
                                 kStoreForms));
    }
    if (!opts.emplace(key, opt.substr(eq + 1)).second) {
      return Refuse(absl::StrCat("--store-opt ", key, " is given more than once: give it once"));
    }
  }
  // The original's cookbook always names the backend; s3_root alone means S3.
  const std::string backend =
      opts.contains("backend") ? opts["backend"] : (opts.contains("s3_root") ? "s3" : "");
  if (backend == "s3") {
    std::string root = opts["s3_root"];
    if (root.empty()) {
      return Refuse(
          "--store-opt backend=s3 needs --store-opt s3_root=s3://BUCKET/PREFIX: give the "
          "bucket the trainer publishes to");
    }
    // The original's S3 store reads a bare "bucket/prefix" as s3://bucket/prefix.
    if (!absl::StrContains(root, "://")) root = absl::StrCat("s3://", root);
    if (absl::StrContains(root, "?")) {
      return Refuse(absl::StrCat("--store-opt s3_root=", root,
                                 " has a query; give s3_endpoint_url= for the endpoint"));
    }
    config.store_uri = root;
    if (!opts["s3_endpoint_url"].empty()) {
      absl::StrAppend(&config.store_uri,
                      "?endpoint=", SigV4Encode(opts["s3_endpoint_url"], SlashEncoding::kEncode));
    }
    config.cache_dir = cache.empty() ? flags.bulletin_root : cache;
    return absl::OkStatus();
  }
  if (backend == "local") {
    if (flags.bulletin_root.empty()) {
      return Refuse(
          "--store-opt backend=local needs --bulletin-root: give the store's directory (or give "
          "--store PATH)");
    }
    config.store_uri = flags.bulletin_root;
    config.cache_dir = flags.cache_dir;
    return absl::OkStatus();
  }
  if (backend == "modal-volume") {
    return Refuse(
        "--store-opt backend=modal-volume: the Modal Volume store is not provided (a Volume "
        "shows writes only after a commit and a reload); publish to S3 and give --store-opt "
        "backend=s3 --store-opt s3_root=s3://BUCKET/PREFIX, or --store PATH on a shared POSIX "
        "filesystem");
  }
  return Refuse(absl::StrCat("--store-opt backend=", backend.empty() ? "(none)" : backend,
                             " is not a store backend here: give backend=s3 (with s3_root) or "
                             "backend=local (with --bulletin-root), or ",
                             kStoreForms));
}

// The run: its id, the version the base checkpoint holds, request logging.
absl::Status CheckRunFlags(const SidecarFlags& flags, SidecarConfig& config) {
  config.log_requests = flags.debug_requests;
  if (flags.run_id.empty()) {
    return Refuse("--run-id must not be empty: give the run the base checkpoint belongs to");
  }
  if (absl::Status s = ValidateRunId(flags.run_id); !s.ok()) {
    return Refuse(absl::StrCat("--run-id: ", s.message()));
  }
  if (flags.boot_version < 0 || flags.boot_version > kMaxVersion) {
    return Refuse(absl::StrCat("--boot-version must be between 0 and ", kMaxVersion, " (got ",
                               flags.boot_version,
                               "): give the version the base checkpoint holds"));
  }
  config.reconciler.run_id = flags.run_id;
  config.reconciler.boot_version = flags.boot_version;
  return absl::OkStatus();
}

// The engine: its kind and URL, the checkpoints, where versions are staged
// and how the engine loads them.
absl::Status CheckEngineFlags(const SidecarFlags& flags, SidecarConfig& config) {
  if (flags.engine == "sglang") {
    config.engine = EngineKind::kSglang;
  } else if (flags.engine == "sglang-stock") {
    config.engine = EngineKind::kSglangStock;
  } else if (flags.engine == "vllm") {
    config.engine = EngineKind::kVllm;
  } else {
    return Refuse(
        absl::StrCat("--engine must be sglang, sglang-stock or vllm (got \"", flags.engine, "\")"));
  }
  const bool sidecar_stages = config.engine != EngineKind::kSglang;
  auto url = ParseHttpUrl(flags.engine_url);
  if (!url.ok()) return Refuse(absl::StrCat("--engine-url: ", url.status().message()));
  config.engine_url = flags.engine_url;
  config.engine_http = *url;
  if (flags.base_checkpoint.empty()) {
    return Refuse(
        "--base-checkpoint is required: give the checkpoint directory the engine was started "
        "with");
  }
  config.reconciler.base_checkpoint_dir = flags.base_checkpoint;
  auto mode = ParseUpdateDestination(flags.update_mode);
  if (!mode.ok()) return Refuse(absl::StrCat("--update-mode: ", mode.status().message()));
  config.update_mode = *mode;
  if (sidecar_stages && config.update_mode == UpdateDestination::kCpu) {
    return Refuse(absl::StrCat("--update-mode cpu needs an engine that stages by itself: --engine ",
                               flags.engine,
                               " loads versions only from disk (use --update-mode disk, or "
                               "--engine sglang)"));
  }
  if (flags.local_checkpoint.empty()) {
    if (sidecar_stages) {
      return Refuse(absl::StrCat("--engine ", flags.engine,
                                 " needs --local-checkpoint: give the directory the sidecar "
                                 "stages versions into"));
    }
    if (config.update_mode == UpdateDestination::kDisk) {
      return Refuse(
          "--update-mode disk needs --local-checkpoint: give the directory the engine stages "
          "versions into (or use --update-mode cpu)");
    }
  }
  config.local_checkpoint = flags.local_checkpoint;
  if (flags.disk_load_format.empty() ||
      !std::all_of(flags.disk_load_format.begin(), flags.disk_load_format.end(), [](char c) {
        return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-';
      })) {
    return Refuse(absl::StrCat("--disk-load-format \"", flags.disk_load_format,
                               "\" is not a load format name: give one the engine knows, such as "
                               "auto or safetensors"));
  }
  if (config.engine == EngineKind::kVllm && flags.disk_load_format != "auto") {
    return Refuse(absl::StrCat("--disk-load-format ", flags.disk_load_format,
                               " does not apply to --engine vllm: vLLM reloads with the loader it "
                               "was started with (give it to vllm serve as --load-format)"));
  }
  config.disk_load_format = flags.disk_load_format;
  return absl::OkStatus();
}

// How commits happen: in-place patches, the commit mode, the cache flush,
// and how a whole /generate reaches the engine. After CheckEngineFlags.
absl::Status CheckCommitFlags(const SidecarFlags& flags, SidecarConfig& config) {
  if (flags.patch_commits && config.engine != EngineKind::kVllm) {
    return Refuse(
        "--patch-commits needs --engine vllm (started with --worker-extension-cls "
        "stitch_vllm.WeightPatchExtension); --engine sglang-stock patches without it when SGLang "
        "was started with --custom-weight-loader stitch_sglang.apply_patch, and other engines "
        "decide for themselves");
  }
  if (!(flags.patch_max_density > 0 && flags.patch_max_density <= 1)) {
    return Refuse(
        absl::StrCat("--patch-max-density must be in (0, 1] (got ", flags.patch_max_density, ")"));
  }
  if (flags.patch_verify != "checksums" && flags.patch_verify != "values") {
    return Refuse(absl::StrCat("--patch-verify must be checksums or values (got \"",
                               flags.patch_verify, "\")"));
  }
  config.patch_commits = flags.patch_commits;
  config.patch_max_density = flags.patch_max_density;
  config.patch_verify = flags.patch_verify;
  auto commit = ParseCommitMode(flags.commit_mode);
  if (!commit.ok()) return Refuse(absl::StrCat("--commit-mode: ", commit.status().message()));
  config.reconciler.commit_mode = *commit;
  config.reconciler.flush_cache_on_commit = flags.flush_cache_on_commit;
  if (flags.whole_generate != "stream" && flags.whole_generate != "relay") {
    return Refuse(absl::StrCat("--whole-generate must be stream or relay (got \"",
                               flags.whole_generate, "\")"));
  }
  config.assemble_whole_generate =
      flags.whole_generate == "stream" && config.engine != EngineKind::kVllm;
  return absl::OkStatus();
}

// The clocks: the backstop reconcile, the store outage limit, the watchdog
// and the engine's start, restart and check timeouts.
absl::Status CheckTimingFlags(const SidecarFlags& flags, SidecarConfig& config) {
  auto reconcile = Seconds(flags.reconcile_interval_s, "--reconcile-interval");
  if (!reconcile.ok()) return reconcile.status();
  auto reconcile_max = Seconds(flags.reconcile_max_interval_s, "--reconcile-max-interval");
  if (!reconcile_max.ok()) return reconcile_max.status();
  auto outage = Seconds(flags.store_outage_limit_s, "--store-outage-limit");
  if (!outage.ok()) return outage.status();
  auto watchdog = Seconds(flags.watchdog_interval_s, "--watchdog-interval");
  if (!watchdog.ok()) return watchdog.status();
  if (flags.watchdog_threshold < 1 || flags.watchdog_threshold > 1000000) {
    return Refuse(absl::StrCat("--watchdog-threshold must be at least 1 (got ",
                               flags.watchdog_threshold,
                               "): it is how many failed health checks in a row end the replica"));
  }
  auto start_timeout = Seconds(flags.engine_start_timeout_s, "--engine-start-timeout");
  if (!start_timeout.ok()) return start_timeout.status();
  auto restart_grace = Seconds(flags.engine_restart_grace_s, "--engine-restart-grace");
  if (!restart_grace.ok()) return restart_grace.status();
  if (!std::isfinite(flags.engine_check_timeout_s) || flags.engine_check_timeout_s < 0.1 ||
      flags.engine_check_timeout_s > 3600) {
    return Refuse(absl::StrCat("--engine-check-timeout must be between 0.1 and 3600 seconds (got ",
                               flags.engine_check_timeout_s, ")"));
  }
  config.reconciler.reconcile_interval = *reconcile;
  config.reconciler.reconcile_max_interval = *reconcile_max;
  config.reconciler.store_outage_limit = *outage;
  config.watchdog.interval = *watchdog;
  config.watchdog.threshold = static_cast<int>(flags.watchdog_threshold);
  config.watchdog.start_timeout = *start_timeout;
  config.watchdog.restart_grace = *restart_grace;
  config.reconciler.engine_start_timeout = *start_timeout;
  config.watchdog.probe_timeout = std::chrono::duration_cast<std::chrono::milliseconds>(
      std::chrono::duration<double>(flags.engine_check_timeout_s));
  config.reconciler.report_timeout =
      std::max<std::chrono::milliseconds>(config.watchdog.probe_timeout, std::chrono::seconds(5));
  return absl::OkStatus();
}

// What a transfer from a peer must keep up with.
absl::Status CheckPeerFlags(const SidecarFlags& flags, SidecarConfig& config) {
  if (!std::isfinite(flags.peer_min_rate_mib_s) || flags.peer_min_rate_mib_s <= 0 ||
      flags.peer_min_rate_mib_s > 1e6) {
    return Refuse(absl::StrCat("--peer-min-rate must be a positive number of MiB/s (got ",
                               flags.peer_min_rate_mib_s,
                               "): a peer sending a file slower than that is left for the next "
                               "peer or the store"));
  }
  if (!std::isfinite(flags.peer_allowance_s) || flags.peer_allowance_s < 0 ||
      flags.peer_allowance_s > 3600) {
    return Refuse(absl::StrCat("--peer-allowance must be between 0 and 3600 seconds (got ",
                               flags.peer_allowance_s, ")"));
  }
  config.peers.min_rate = std::max<uint64_t>(
      1, static_cast<uint64_t>(flags.peer_min_rate_mib_s * static_cast<double>(1 << 20)));
  config.peers.allowance = std::chrono::duration_cast<std::chrono::milliseconds>(
      std::chrono::duration<double>(flags.peer_allowance_s));
  return absl::OkStatus();
}

// Where the sidecar listens.
absl::Status CheckListenFlags(const SidecarFlags& flags, SidecarConfig& config) {
  if (flags.port < 0 || flags.port > 65535) {
    return Refuse(absl::StrCat("--port must be between 0 and 65535 (got ", flags.port,
                               "); 0 picks a free port"));
  }
  if (flags.host.empty()) return Refuse("--host must not be empty: give an address to listen on");
  config.server.host = flags.host;
  config.server.port = static_cast<uint16_t>(flags.port);
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<SidecarConfig> CheckSidecarFlags(const SidecarFlags& flags) {
  // In this order: a command line with several mistakes is told of the
  // first, as they were always checked.
  using Step = absl::Status (*)(const SidecarFlags&, SidecarConfig&);
  static constexpr Step kSteps[] = {ResolveStore,     CheckRunFlags,    CheckEngineFlags,
                                    CheckCommitFlags, CheckTimingFlags, CheckPeerFlags,
                                    CheckListenFlags};
  SidecarConfig config;
  for (Step step : kSteps) {
    if (absl::Status s = step(flags, config); !s.ok()) return s;
  }
  return config;
}

absl::Status CheckRunMatchesStore(std::string_view run_id, std::string_view store_uri,
                                  const VersionRef& pointer) {
  if (pointer.run_id.empty() || pointer.run_id == run_id) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "sidecar: --run-id ", AbslView(run_id), ", but the store ", AbslView(store_uri),
      " holds run ", pointer.run_id, " (its pointer names ", pointer.ToString(),
      "); give --run-id ", pointer.run_id, " (or claim ", AbslView(run_id),
      " with `stitch claim`, which starts a new run at its boot weights and moves every replica "
      "to it)"));
}

}  // namespace stitch

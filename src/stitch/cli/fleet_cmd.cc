// Fleet tools: `stitch status`, `stitch wait-ready` and `stitch smoke`, for
// operators and launch scripts looking at a pool of replicas, directly or
// through a gateway.
#include <CLI/CLI.hpp>
#include <boost/json/object.hpp>
#include <boost/json/parse.hpp>
#include <boost/json/serialize.hpp>
#include <boost/json/value_from.hpp>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <iostream>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/time/clock.h"
#include "absl/time/time.h"
#include "stitch/api/replica_client.h"
#include "stitch/api/response.h"
#include "stitch/api/server_info.h"
#include "stitch/cli/commands.h"
#include "stitch/cli/report.h"
#include "stitch/core/errors.h"
#include "stitch/core/state.h"
#include "stitch/fetch/open_store.h"
#include "stitch/net/auth.h"
#include "stitch/net/client.h"
#include "stitch/pool/pool.h"
#include "stitch/store/materialize_chain.h"
#include "stitch/store/retention.h"
#include "stitch/store/store.h"

namespace stitch {
namespace {

using Clock = std::chrono::steady_clock;

constexpr auto kProbeTimeout = std::chrono::seconds(3);
constexpr size_t kProbeConcurrency = 64;

std::string TrimSlash(std::string url) {
  while (url.ends_with('/')) url.pop_back();
  return url;
}

// What one replica says about itself, from its answer to GET /server_info.
ReplicaStatus StatusFrom(const std::string& url, absl::StatusOr<ReplicaState> info) {
  ReplicaStatus s;
  s.url = url;
  if (!info.ok()) {
    s.last_error = std::string(info.status().message());
    return s;
  }
  s.reachable = true;
  s.state = *std::move(info);
  s.in_flight = s.state.active_requests;
  if (!s.state.ready) s.last_error = s.state.reason;
  return s;
}

// Probes every URL, kProbeConcurrency at a time: a replica that does not
// answer holds up only its own slot. The statuses keep the order of `urls`.
std::vector<ReplicaStatus> ProbeAll(const std::vector<std::string>& urls,
                                    const std::string& token) {
  ReplicaCallOptions options;
  options.timeout = kProbeTimeout;
  options.concurrency = kProbeConcurrency;
  options.bearer_token = token;
  std::vector<absl::StatusOr<ReplicaState>> infos = ReadServerInfos(urls, options);
  std::vector<ReplicaStatus> out;
  out.reserve(urls.size());
  for (size_t i = 0; i < urls.size(); ++i) out.push_back(StatusFrom(urls[i], std::move(infos[i])));
  return out;
}

absl::StatusOr<PoolState> FromPool(const std::string& spec, const std::string& token) {
  auto pool = MakePool(spec);
  if (!pool.ok()) return Annotate(pool.status(), "--pool");
  auto urls = (*pool)->Discover();
  if (!urls.ok()) return Annotate(urls.status(), "--pool");
  PoolState state;
  state.replicas = ProbeAll(*urls, token);
  return state;
}

absl::StatusOr<PoolState> FromGateway(const std::string& gateway, const std::string& token) {
  FetchOptions options;
  options.timeout = kProbeTimeout;
  if (!token.empty()) options.headers.Set("Authorization", BearerValue(token));
  const std::string url = TrimSlash(gateway) + "/replicas";
  auto response = HttpFetch("GET", url, {}, options);
  if (!response.ok()) {
    return absl::UnavailableError(absl::StrCat("gateway ", gateway, ": ",
                                               response.status().message(),
                                               "; is `stitch gateway` running there?"));
  }
  if (response->status != 200) {
    return absl::UnavailableError(
        absl::StrCat("gateway ", gateway, ": GET /replicas answered HTTP ", response->status));
  }
  absl::StatusOr<PoolState> state = ParseReplicas(response->body);
  if (!state.ok()) {
    return absl::DataLossError(absl::StrCat("gateway ", gateway, ": ", state.status().message()));
  }
  return state;
}

std::string Seconds(const std::map<std::string, double>& metrics, const std::string& key) {
  auto it = metrics.find(key);
  if (it == metrics.end()) return "-";
  return absl::StrFormat("%.3fs", it->second);
}

// --- status -----------------------------------------------------------------

struct StatusFlags {
  std::string gateway;
  std::string pool;
  std::string store;
  bool json = false;
  std::string auth_token_file;
};

// The fleet's bearer token for the fleet commands: --auth-token-file, else
// $STITCH_AUTH_TOKEN, else none.
absl::StatusOr<std::string> FleetToken(const std::string& file, std::string_view command) {
  auto token = LoadBearerToken(file, kAuthTokenEnv, "--auth-token-file");
  if (!token.ok()) return Annotate(token.status(), command);
  return token;
}

// What `status` says about a replica in its NOTE column: why it cannot be
// reached, why it is terminal, why it cannot apply the pointer's version, or
// why it is not ready; nothing for a ready replica with nothing wrong.
std::string ReplicaNote(const ReplicaStatus& r) {
  if (!r.reachable) return r.last_error;
  if (!r.state.terminal_error.empty()) return absl::StrCat("terminal: ", r.state.terminal_error);
  if (!r.state.sync_error.empty()) return absl::StrCat("cannot sync: ", r.state.sync_error);
  if (!r.state.ready) return r.state.reason;
  return "";
}

// The holds of a store (store/retention.h), as `status` prints them.
boost::json::array HoldsJson(const std::vector<Hold>& holds, absl::Time now) {
  boost::json::array out;
  for (const Hold& h : holds) {
    boost::json::object o;
    o["holder"] = h.holder;
    o["version"] = h.version;
    o["expires_unix"] = absl::ToUnixSeconds(h.expires);
    o["live"] = h.live(now);
    out.push_back(std::move(o));
  }
  return out;
}

void PrintHolds(const std::vector<Hold>& holds, absl::Time now) {
  if (holds.empty()) {
    std::printf("no holds\n");
    return;
  }
  std::printf("%-24s %-16s %s\n", "HOLDER", "VERSION", "EXPIRES");
  for (const Hold& h : holds) {
    std::printf("%-24s %-16s %s%s\n", h.holder.c_str(), VersionDirName(h.version).c_str(),
                absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", h.expires, absl::UTCTimeZone()).c_str(),
                h.live(now) ? "" : " (expired)");
  }
}

int RunStatus(const StatusFlags& flags) {
  if (!flags.gateway.empty() && !flags.pool.empty()) {
    ReportFailure(absl::InvalidArgumentError("status: give one of --gateway or --pool, not both"));
    return 2;
  }
  if (flags.gateway.empty() && flags.pool.empty() && flags.store.empty()) {
    ReportFailure(absl::InvalidArgumentError(
        "status: give --gateway or --pool (the replicas), --store (its pointer and holds), or "
        "both"));
    return 2;
  }
  const absl::Time now = absl::Now();
  std::optional<std::string> pointer;
  std::vector<Hold> holds;
  std::vector<int64_t> anchors;  // versions with an anchor written after the fact
  if (!flags.store.empty()) {
    const auto cache = std::filesystem::temp_directory_path() / "stitch-status-cache";
    auto store = OpenStore(flags.store, StoreOptions{{}, cache});
    if (!store.ok()) return ReportFailure(Annotate(store.status(), "status: --store"));
    auto p = ReadClaimedPointer(**store);
    if (!p.ok()) return ReportFailure(Annotate(p.status(), "status: --store"));
    pointer = p->ToString();
    auto listed = ListHolds(**store);
    if (!listed.ok()) return ReportFailure(Annotate(listed.status(), "status: --store"));
    holds = *std::move(listed);
    auto anchored = ListAnchors(**store);
    if (!anchored.ok()) return ReportFailure(Annotate(anchored.status(), "status: --store"));
    anchors = *std::move(anchored);
  }
  if (flags.gateway.empty() && flags.pool.empty()) {
    if (flags.json) {
      boost::json::object o;
      o["pointer"] = *pointer;
      o["holds"] = HoldsJson(holds, now);
      o["anchors"] = boost::json::value_from(anchors);
      std::cout << boost::json::serialize(o) << "\n";
    } else {
      std::printf("store pointer %s\n", pointer->c_str());
      PrintHolds(holds, now);
      if (!anchors.empty()) {
        std::vector<std::string> names;
        for (int64_t v : anchors) names.push_back(VersionDirName(v));
        std::printf("anchors (stitch compact): %s\n", absl::StrJoin(names, ", ").c_str());
      }
    }
    return 0;
  }

  auto token = FleetToken(flags.auth_token_file, "status");
  if (!token.ok()) return ReportFailure(token.status());
  absl::StatusOr<PoolState> state =
      flags.gateway.empty() ? FromPool(flags.pool, *token) : FromGateway(flags.gateway, *token);
  if (!state.ok()) return ReportFailure(Annotate(state.status(), "status"));

  if (flags.json) {
    if (!pointer.has_value()) {
      std::cout << ReplicasJson(*state) << "\n";
      return 0;
    }
    boost::json::value v = boost::json::parse(ReplicasJson(*state, *pointer));
    v.as_object()["holds"] = HoldsJson(holds, now);
    v.as_object()["anchors"] = boost::json::value_from(anchors);
    std::cout << boost::json::serialize(v) << "\n";
    return 0;
  }
  std::printf("%-32s %-5s %-26s %-10s %9s %10s %10s  %s\n", "URL", "READY", "APPLIED", "STATE",
              "IN_FLIGHT", "STAGE", "COMMIT", "NOTE");
  for (const ReplicaStatus& r : state->replicas) {
    const std::string applied = r.state.applied ? r.state.applied->ToString() : "-";
    const std::string sync =
        r.reachable ? std::string(SyncStateName(r.state.sync_state)) : "UNREACHABLE";
    std::printf("%-32s %-5s %-26s %-10s %9lld %10s %10s  %s\n", r.url.c_str(),
                r.state.ready ? "yes" : "no", applied.c_str(), sync.c_str(),
                static_cast<long long>(r.in_flight), Seconds(r.state.metrics, "stage_s").c_str(),
                Seconds(r.state.metrics, "commit_s").c_str(), ReplicaNote(r).c_str());
  }
  std::printf("%d of %zu replicas ready", state->ready_count(), state->replicas.size());
  if (pointer.has_value()) std::printf("; store pointer %s", pointer->c_str());
  std::printf("\n");
  if (pointer.has_value()) PrintHolds(holds, now);
  return 0;
}

// --- wait-ready ---------------------------------------------------------------

struct WaitFlags {
  std::string pool;
  int replicas = 1;
  double fraction = 0.75;
  double timeout_s = 600;
  std::string gateway;
  std::string auth_token_file;
};

int RunWaitReady(const WaitFlags& flags) {
  if (flags.replicas < 1 || flags.fraction <= 0 || flags.fraction > 1 || flags.timeout_s < 0) {
    ReportFailure(absl::InvalidArgumentError(
        "wait-ready: --replicas must be >= 1, --fraction in (0, 1] and --timeout >= 0"));
    return 2;
  }
  auto token = FleetToken(flags.auth_token_file, "wait-ready");
  if (!token.ok()) return ReportFailure(token.status());
  auto pool = MakePool(flags.pool);
  if (!pool.ok()) {
    ReportFailure(Annotate(pool.status(), "wait-ready: --pool"));
    return 2;
  }
  const int needed = std::max(1, static_cast<int>(std::ceil(flags.fraction * flags.replicas)));
  const auto deadline =
      Clock::now() + std::chrono::milliseconds(static_cast<int64_t>(flags.timeout_s * 1000));
  std::string last_progress;
  int ready = 0;
  size_t discovered = 0;
  bool gateway_ok = flags.gateway.empty();
  for (;;) {
    auto urls = (*pool)->Discover();
    ready = 0;
    discovered = 0;
    std::string discover_error;
    if (urls.ok()) {
      discovered = urls->size();
      for (const ReplicaStatus& r : ProbeAll(*urls, *token)) ready += r.state.ready ? 1 : 0;
    } else {
      discover_error = std::string(urls.status().message());
    }
    if (!flags.gateway.empty()) {
      FetchOptions options;
      options.timeout = kProbeTimeout;
      auto health = HttpFetch("GET", TrimSlash(flags.gateway) + "/health", {}, options);
      gateway_ok = health.ok() && health->status == 200;
    }
    std::string progress =
        absl::StrCat("wait-ready: ", ready, " of ", discovered, " discovered replicas ready (need ",
                     needed, " of ", flags.replicas, ")");
    if (!flags.gateway.empty()) {
      absl::StrAppend(&progress, "; gateway ", gateway_ok ? "healthy" : "not healthy yet");
    }
    if (!discover_error.empty()) absl::StrAppend(&progress, "; ", discover_error);
    if (progress != last_progress) {
      std::cout << progress << std::endl;
      last_progress = progress;
    }
    if (ready >= needed && gateway_ok) return 0;
    if (Clock::now() >= deadline) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(500));
  }
  return ReportFailure(absl::DeadlineExceededError(absl::StrCat(
      "wait-ready: timed out after ", flags.timeout_s, " s with ", ready, " of ", discovered,
      " replicas ready (needed ", needed, " of ", flags.replicas, ")",
      flags.gateway.empty() ? "" : (gateway_ok ? "; gateway healthy" : "; gateway not healthy"),
      "; check `stitch status --pool ", flags.pool, "`")));
}

// --- smoke --------------------------------------------------------------------

struct SmokeFlags {
  std::string gateway;
  int64_t version = -1;
  double timeout_s = 60;
  std::string auth_token_file;
};

// One exact-version generation against `url`; an empty string when it was
// served by `version`, else what went wrong.
std::string TryVersion(const std::string& url, int64_t version, std::chrono::milliseconds timeout,
                       const std::string& token) {
  const std::string body = absl::StrCat(
      R"({"text":"stitch smoke","sampling_params":{"max_new_tokens":1,"temperature":0},)",
      R"("weight_version":{"exact_version":)", version, "}}");
  FetchOptions options;
  options.timeout = timeout;
  if (!token.empty()) options.headers.Set("Authorization", BearerValue(token));
  auto response = HttpFetch("POST", url + "/generate", body, options);
  if (!response.ok()) return std::string(response.status().message());
  if (response->status != 200) {
    return absl::StrCat("HTTP ", response->status, ": ", response->body.substr(0, 300));
  }
  std::optional<int64_t> served = StampedEndVersion(response->body);
  if (!served.has_value()) return "the response carries no weight_version_end stamp";
  if (*served != version) return absl::StrCat("served by version ", *served);
  return "";
}

int RunSmoke(const SmokeFlags& flags) {
  if (flags.version < 0) {
    ReportFailure(absl::InvalidArgumentError("smoke: --version must be >= 0"));
    return 2;
  }
  const auto timeout =
      std::chrono::milliseconds(static_cast<int64_t>(std::max(0.1, flags.timeout_s) * 1000));
  auto token = FleetToken(flags.auth_token_file, "smoke");
  if (!token.ok()) return ReportFailure(token.status());
  const std::string gateway = TrimSlash(flags.gateway);
  int failures = 0;
  const std::string through = TryVersion(gateway, flags.version, timeout, *token);
  if (through.empty()) {
    std::cout << "ok    gateway " << gateway << " served version " << flags.version << "\n";
  } else {
    std::cout << "FAIL  gateway " << gateway << ": " << through << "\n";
    ++failures;
  }
  auto state = FromGateway(gateway, *token);
  if (!state.ok()) return ReportFailure(Annotate(state.status(), "smoke"));
  int live = 0;
  for (const ReplicaStatus& r : state->replicas) {
    if (!r.reachable) {
      std::cout << "skip  " << r.url << ": not reachable (" << r.last_error << ")\n";
      continue;
    }
    ++live;
    const std::string why = TryVersion(r.url, flags.version, timeout, *token);
    if (why.empty()) {
      std::cout << "ok    " << r.url << " served version " << flags.version << "\n";
    } else {
      std::cout << "FAIL  " << r.url << ": " << why << "\n";
      ++failures;
    }
  }
  std::cout.flush();
  if (live == 0) {
    return ReportFailure(
        absl::UnavailableError(absl::StrCat("smoke: gateway ", gateway, " knows no live replica")));
  }
  if (failures > 0) {
    return ReportFailure(absl::FailedPreconditionError(
        absl::StrCat("smoke: ", failures, " check(s) failed for version ", flags.version,
                     "; see `stitch status --gateway ", gateway, "`")));
  }
  return 0;
}

}  // namespace

void AddFleetCommands(CLI::App& app, int* exit_code) {
  static StatusFlags status;
  CLI::App* s = app.add_subcommand(
      "status",
      "Print the replicas of a pool (ready, applied version, sync state, in flight, "
      "last stage and commit times) and the store's pointer");
  s->add_option("--gateway", status.gateway, "A gateway's URL: show what it knows");
  s->add_option("--pool", status.pool, "A pool spec: ask each replica's /server_info");
  s->add_option("--store", status.store,
                "Store URI, to show its pointer and its holds (alone: only those)");
  s->add_flag("--json", status.json, "Print JSON instead of a table");
  s->add_option("--auth-token-file", status.auth_token_file,
                "File holding the fleet's bearer token (default: $STITCH_AUTH_TOKEN when set)");
  s->callback([exit_code] { *exit_code = RunStatus(status); });

  static WaitFlags wait;
  CLI::App* w = app.add_subcommand(
      "wait-ready",
      "Block until a fraction of N replicas report ready (and the gateway is healthy)");
  w->add_option("--pool", wait.pool, "Pool spec")->required();
  w->add_option("--replicas", wait.replicas, "How many replicas the fleet should have")->required();
  w->add_option("--fraction", wait.fraction, "Fraction of them that must be ready")
      ->capture_default_str();
  w->add_option("--timeout", wait.timeout_s, "Seconds before giving up")->capture_default_str();
  w->add_option("--gateway", wait.gateway, "A gateway's URL whose /health must answer 200");
  w->add_option("--auth-token-file", wait.auth_token_file,
                "File holding the fleet's bearer token (default: $STITCH_AUTH_TOKEN when set)");
  w->callback([exit_code] { *exit_code = RunWaitReady(wait); });

  static SmokeFlags smoke;
  CLI::App* k = app.add_subcommand(
      "smoke", "Check that the gateway and every live replica serve an exact-version request");
  k->add_option("--gateway", smoke.gateway, "The gateway's URL")->required();
  k->add_option("--version", smoke.version, "The version every live replica must serve")
      ->required();
  k->add_option("--timeout", smoke.timeout_s, "Seconds per request")->capture_default_str();
  k->add_option("--auth-token-file", smoke.auth_token_file,
                "File holding the fleet's bearer token (default: $STITCH_AUTH_TOKEN when set)");
  k->callback([exit_code] { *exit_code = RunSmoke(smoke); });
}

}  // namespace stitch

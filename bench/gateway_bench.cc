// The gateway's cost, against instant-answer replicas (each answers
// /server_info as ready at version 1 and /generate at once, stamped):
//   1. throughput and latency of POST /generate sent directly to a replica
//      and through a gateway in front of it, at 1 and 32 connections;
//   2. the gateway routing over 10, 100 and 1000 discovered replicas (one
//      instant server reached through 127.0.0.N loopback addresses, so every
//      replica is a distinct origin): the per-request cost must not grow
//      with the replica count; the 1000/10 ratio of mean latency and of
//      throughput is printed.
// Every gateway line also gives the CPU time the gateway's loop thread spent
// per answered request (`gw cpu us`), the figure to compare across changes
// on a noisy machine.
//
//   gateway_bench [--seconds S]
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <memory>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "http_load.h"
#include "stitch/api/server_info.h"
#include "stitch/core/state.h"
#include "stitch/gateway/gateway.h"
#include "stitch/net/client.h"
#include "stitch/net/clock.h"
#include "stitch/net/event_loop.h"
#include "stitch/net/server.h"
#include "stitch/net/worker_pool.h"
#include "stitch/pool/static_pool.h"

namespace stitch {
namespace {

using boost::asio::awaitable;
using Clock = std::chrono::steady_clock;

awaitable<void> InstantReplica(HttpExchange& ex) {
  const std::string_view path = TargetPath(ex.request().target);
  if (path == "/server_info") {
    ReplicaState s;
    s.ready = true;
    s.applied = VersionRef{"bench", 1};
    s.run_id = "bench";
    std::string body = ServerInfoJson(s);
    (void)co_await ex.Respond(JsonResponse(200, std::move(body)));
    co_return;
  }
  (void)co_await ex.Respond(JsonResponse(
      200,
      R"({"text":"ok","output_ids":[1],"meta_info":{"weight_version_start":1,"weight_version_end":1}})"));
}

using bench::LoadResult;
using Result = LoadResult;

// `watch`: the gateway's loop thread, whose CPU time is measured (none for
// the direct path).
Result Measure(const HttpOrigin& origin, int connections, double seconds,
               const std::vector<clockid_t>& watch = {}) {
  return bench::RunLoad(
      origin, connections, seconds,
      R"({"text":"hello","sampling_params":{"max_new_tokens":1},"weight_version":{"min_version":1}})",
      watch);
}

// CPU microseconds of the watched thread per answered request; 0 unwatched.
double CpuPerRequestUs(const Result& r) {
  if (r.watched_cpu_s.empty() || r.latencies_us.empty()) return 0;
  return r.watched_cpu_s[0] * 1e6 / static_cast<double>(r.latencies_us.size());
}

// A gateway over `replicas` instant-replica URLs, on its own loop.
class BenchGateway {
 public:
  BenchGateway(std::vector<std::string> urls) : pool_(std::move(urls), WakeOptions{}) {
    GatewayOptions options;
    options.poll_interval = std::chrono::hours(1);  // one poll at start: routing alone is measured
    options.admission_wait = std::chrono::seconds(5);
    auto g = Gateway::Start(loop_.executor(), pool_, workers_, clock_, options);
    if (!g.ok()) {
      std::fprintf(stderr, "gateway_bench: %s\n", std::string(g.status().message()).c_str());
      std::exit(1);
    }
    gateway_ = *std::move(g);
    cpu_clock_ = bench::LoopCpuClock(loop_);
  }
  ~BenchGateway() {
    loop_.BlockOn(gateway_->Shutdown());
    gateway_.reset();
  }
  HttpOrigin origin() const { return {"127.0.0.1", gateway_->port()}; }
  // The gateway's loop thread's CPU clock.
  std::vector<clockid_t> watch() const { return {cpu_clock_}; }
  // Waits until every replica is ready in the gateway's view.
  bool WaitReady(size_t n) {
    const auto deadline = Clock::now() + std::chrono::seconds(60);
    while (Clock::now() < deadline) {
      const PoolState s = loop_.BlockOn(Read(gateway_.get()));
      if (static_cast<size_t>(s.ready_count()) == n) return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return false;
  }

 private:
  static awaitable<PoolState> Read(const Gateway* g) {
    PoolState s = g->Snapshot();
    co_return s;
  }
  SteadyClock clock_;
  EventLoop loop_;
  WorkerPool workers_{1};
  StaticPool pool_;
  std::unique_ptr<Gateway> gateway_;
  clockid_t cpu_clock_{};
};

int Main(int argc, char** argv) {
  double seconds = 2;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--seconds" && i + 1 < argc && absl::SimpleAtod(argv[i + 1], &seconds) &&
        seconds > 0) {
      ++i;
    } else {
      std::fprintf(stderr, "usage: gateway_bench [--seconds S]\n");
      return 2;
    }
  }
  RaiseOpenFileLimit();

  // One instant server on every loopback address: 127.0.0.N:port are distinct
  // replicas to the gateway.
  EventLoop replica_loop;
  ServerOptions replica_options;
  replica_options.host = "0.0.0.0";
  std::unique_ptr<HttpServer> replicas_server =
      bench::StartInstantServer(replica_loop, replica_options, InstantReplica, "gateway_bench");
  if (replicas_server == nullptr) return 1;
  const uint16_t port = replicas_server->port();
  auto replica_urls = [&](int n) {
    std::vector<std::string> urls;
    for (int i = 0; i < n; ++i) {
      urls.push_back(
          absl::StrCat("http://127.0.", (i + 1) / 250, ".", (i + 1) % 250 + 1, ":", port));
    }
    return urls;
  };

  std::printf("gateway_bench: POST /generate, %.1f s per point, instant-answer replicas\n",
              seconds);
  std::printf("%-28s %6s %10s %9s %9s %9s %7s %10s\n", "path", "conns", "req/s", "mean us",
              "p50 us", "p99 us", "errors", "gw cpu us");
  auto line = [](const char* path, int conns, Result& r) {
    std::printf("%-28s %6d %10.0f %9.1f %9.1f %9.1f %7llu %10.1f\n", path, conns, r.rps(), r.mean(),
                r.quantile(0.5), r.quantile(0.99), static_cast<unsigned long long>(r.errors),
                CpuPerRequestUs(r));
    if (!r.first_error.empty()) std::printf("    first error: %s\n", r.first_error.c_str());
  };

  bool ok = true;
  {
    BenchGateway gateway(replica_urls(1));
    ok = gateway.WaitReady(1) && ok;
    for (int conns : {1, 32}) {
      Result direct = Measure(HttpOrigin{"127.0.0.2", port}, conns, seconds);
      Result through = Measure(gateway.origin(), conns, seconds, gateway.watch());
      line("direct to replica", conns, direct);
      line("gateway, 1 replica", conns, through);
      std::printf("    gateway/direct throughput %.2f, added mean latency %.1f us\n",
                  direct.rps() > 0 ? through.rps() / direct.rps() : 0,
                  through.mean() - direct.mean());
      ok = ok && direct.errors == 0 && through.errors == 0;
    }
  }

  // At 1 connection (pure per-request cost) and at 32 (throughput). The
  // three gateways are measured in alternating rounds and the best round of
  // each is kept, so that a burst of load from elsewhere on the machine does
  // not land on one replica count only.
  constexpr int kRounds = 2;
  double mean1_at[3] = {1e18, 1e18, 1e18};
  double mean_at[3] = {1e18, 1e18, 1e18};
  double rps_at[3] = {0, 0, 0};
  const int counts[3] = {10, 100, 1000};
  std::vector<std::unique_ptr<BenchGateway>> gateways;
  for (int k = 0; k < 3; ++k) {
    gateways.push_back(std::make_unique<BenchGateway>(replica_urls(counts[k])));
    if (!gateways.back()->WaitReady(static_cast<size_t>(counts[k]))) {
      std::printf("gateway with %d replicas: not all ready in time\n", counts[k]);
      return 1;
    }
    // Warm every origin's connections.
    (void)Measure(gateways.back()->origin(), 32, std::max(0.5, seconds / 2));
  }
  for (int round = 0; round < kRounds; ++round) {
    for (int k = 0; k < 3; ++k) {
      const std::string path = absl::StrCat("gateway, ", counts[k], " replicas");
      Result one = Measure(gateways[k]->origin(), 1, seconds, gateways[k]->watch());
      line(path.c_str(), 1, one);
      Result r = Measure(gateways[k]->origin(), 32, seconds, gateways[k]->watch());
      line(path.c_str(), 32, r);
      mean1_at[k] = std::min(mean1_at[k], one.mean());
      mean_at[k] = std::min(mean_at[k], r.mean());
      rps_at[k] = std::max(rps_at[k], r.rps());
      ok = ok && r.errors == 0 && one.errors == 0;
    }
  }
  gateways.clear();
  if (mean_at[0] > 0 && rps_at[0] > 0 && mean1_at[0] > 0) {
    std::printf(
        "routing cost 1000/10 replicas, best of %d rounds (1.00 = no growth): mean latency "
        "ratio %.2f at 1 connection, %.2f at 32; throughput ratio %.2f at 32\n",
        kRounds, mean1_at[2] / mean1_at[0], mean_at[2] / mean_at[0], rps_at[2] / rps_at[0]);
  }
  replica_loop.BlockOn(replicas_server->Shutdown());
  return ok ? 0 : 1;
}

}  // namespace
}  // namespace stitch

int main(int argc, char** argv) { return stitch::Main(argc, argv); }

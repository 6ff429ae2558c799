// What the HTTP benchmarks share: a load generator (`connections` coroutines
// on one event loop, each sending POST /generate with `body`) and the setup
// of the instant-answer servers they measure against. Header-only:
// benchmarks are single files.
//
// The load is a closed loop by default: each connection sends again as soon
// as its previous answer arrives, which finds the highest throughput, and
// the latency it reports is then mostly time spent queued behind a busy CPU.
// With a rate, each connection sends on a fixed schedule instead (the
// connections together send `rate` requests per second), and a request's
// latency counts from the moment the schedule said to send it, so a late
// answer also charges the requests it delayed (no coordinated omission).
#pragma once

#include <pthread.h>
#include <time.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <memory>
#include <numeric>
#include <string>
#include <thread>
#include <vector>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>

#include "absl/strings/str_cat.h"
#include "stitch/net/client.h"
#include "stitch/net/event_loop.h"
#include "stitch/net/server.h"

namespace stitch::bench {

struct LoadResult {
  double seconds = 0;
  std::vector<double> latencies_us;  // of the answered (200) requests, sorted
  uint64_t errors = 0;
  std::string first_error;
  // CPU seconds of the load generator's thread, and of each thread RunLoad
  // was asked to watch, during the measured window.
  double client_cpu_s = 0;
  std::vector<double> watched_cpu_s;

  double rps() const {
    return seconds > 0 ? static_cast<double>(latencies_us.size()) / seconds : 0;
  }
  double mean() const {
    if (latencies_us.empty()) return 0;
    return std::accumulate(latencies_us.begin(), latencies_us.end(), 0.0) /
           static_cast<double>(latencies_us.size());
  }
  double quantile(double q) const {
    if (latencies_us.empty()) return 0;
    const auto i = static_cast<size_t>(q * static_cast<double>(latencies_us.size()));
    return latencies_us[std::min(latencies_us.size() - 1, i)];
  }
};

namespace internal {

// Sends `request` and reads its streamed answer to the end, event by event
// as the server writes them.
inline boost::asio::awaitable<absl::StatusOr<HttpResponse>> SendAndReadStream(
    HttpClient& client, const HttpOrigin& origin, const HttpRequest& request) {
  auto stream = co_await client.SendStreamed(origin, request);
  if (!stream.ok()) co_return stream.status();
  HttpResponse response;
  response.status = stream->status();
  auto body = co_await stream->ReadAll();
  if (!body.ok()) co_return body.status();
  response.body = *std::move(body);
  co_return response;
}

// `period`: zero for a closed loop; else the time between this worker's
// scheduled sends, the first at `first`. `streamed`: the answers are read
// as streams.
inline boost::asio::awaitable<void> LoadWorker(HttpClient& client, HttpOrigin origin,
                                               const std::string& body, bool streamed,
                                               std::chrono::steady_clock::duration period,
                                               std::chrono::steady_clock::time_point first,
                                               const std::atomic<bool>& stop,
                                               const std::atomic<bool>& measuring,
                                               LoadResult& result, std::atomic<int>& running) {
  HttpRequest request;
  request.method = "POST";
  request.target = "/generate";
  request.headers.Set("Content-Type", "application/json");
  request.body = body;
  boost::asio::steady_timer timer(co_await boost::asio::this_coro::executor);
  std::chrono::steady_clock::time_point scheduled = first;
  while (!stop.load(std::memory_order_relaxed)) {
    auto start = std::chrono::steady_clock::now();
    if (period.count() > 0) {
      if (start < scheduled) {
        timer.expires_at(scheduled);
        co_await timer.async_wait(boost::asio::use_awaitable);
      }
      start = scheduled;
      scheduled += period;
    }
    absl::StatusOr<HttpResponse> response;
    if (streamed) {
      response = co_await SendAndReadStream(client, origin, request);
    } else {
      response = co_await client.Send(origin, request);
    }
    const double us =
        std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - start).count();
    if (!measuring.load(std::memory_order_relaxed)) continue;
    if (!response.ok() || response->status != 200) {
      if (result.errors++ == 0) {
        result.first_error = response.ok()
                                 ? absl::StrCat("HTTP ", response->status, " ", response->body)
                                 : std::string(response.status().message());
      }
      continue;
    }
    result.latencies_us.push_back(us);
  }
  running.fetch_sub(1);
}

}  // namespace internal

// The CPU-time clock of `loop`'s thread.
inline clockid_t LoopCpuClock(EventLoop& loop) {
  return loop.BlockOn([]() -> boost::asio::awaitable<clockid_t> {
    clockid_t clock{};
    pthread_getcpuclockid(pthread_self(), &clock);
    co_return clock;
  }());
}

inline double CpuSeconds(clockid_t clock) {
  timespec ts{};
  clock_gettime(clock, &ts);
  return static_cast<double>(ts.tv_sec) + static_cast<double>(ts.tv_nsec) * 1e-9;
}

// Warms up for min(0.5 s, seconds / 4), then measures for `seconds`, also
// the CPU time of the `watch` clocks (other loops' threads) in that window.
// `rate`: requests per second of all connections together on a fixed
// schedule; zero for a closed loop. `streamed`: each answer is read as a
// stream (SendStreamed) to its end.
inline LoadResult RunLoad(const HttpOrigin& origin, int connections, double seconds,
                          const std::string& body, const std::vector<clockid_t>& watch = {},
                          double rate = 0, bool streamed = false) {
  EventLoop loop;
  const clockid_t client_clock = LoopCpuClock(loop);
  ClientOptions options;
  options.max_idle_per_origin = static_cast<size_t>(connections) + 16;
  options.request_timeout = std::chrono::seconds(30);
  HttpClient client(loop.executor(), options);
  std::atomic<bool> stop{false};
  std::atomic<bool> measuring{false};
  std::atomic<int> running{connections};
  std::vector<LoadResult> per(static_cast<size_t>(connections));
  // On a schedule, the workers' sends are spread evenly over one period.
  const auto period = std::chrono::duration_cast<std::chrono::steady_clock::duration>(
      std::chrono::duration<double>(rate > 0 ? connections / rate : 0));
  const auto first = std::chrono::steady_clock::now();
  for (size_t i = 0; i < per.size(); ++i) {
    boost::asio::co_spawn(loop.executor(),
                          internal::LoadWorker(client, origin, body, streamed, period,
                                               first + period * static_cast<int64_t>(i) /
                                                           static_cast<int64_t>(per.size()),
                                               stop, measuring, per[i], running),
                          boost::asio::detached);
  }
  std::this_thread::sleep_for(std::chrono::duration<double>(std::min(0.5, seconds / 4)));
  std::vector<double> cpu_start;
  for (clockid_t c : watch) cpu_start.push_back(CpuSeconds(c));
  const double client_start = CpuSeconds(client_clock);
  measuring = true;
  const auto start = std::chrono::steady_clock::now();
  std::this_thread::sleep_for(std::chrono::duration<double>(seconds));
  measuring = false;
  LoadResult r;
  r.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  r.client_cpu_s = CpuSeconds(client_clock) - client_start;
  for (size_t i = 0; i < watch.size(); ++i) {
    r.watched_cpu_s.push_back(CpuSeconds(watch[i]) - cpu_start[i]);
  }
  stop = true;
  while (running.load() > 0) std::this_thread::sleep_for(std::chrono::milliseconds(2));
  for (LoadResult& p : per) {
    r.latencies_us.insert(r.latencies_us.end(), p.latencies_us.begin(), p.latencies_us.end());
    if (p.errors > 0 && r.first_error.empty()) r.first_error = p.first_error;
    r.errors += p.errors;
  }
  std::sort(r.latencies_us.begin(), r.latencies_us.end());
  return r;
}

// Starts an instant-answer server with `handler` on `loop`, with a backlog deep enough
// for the benchmarks' connection bursts; null (and a message naming
// `program`) when it cannot.
inline std::unique_ptr<HttpServer> StartInstantServer(EventLoop& loop, ServerOptions options,
                                                      HttpHandler handler, const char* program) {
  options.backlog = 8192;
  auto server = HttpServer::Start(loop.executor(), std::move(options), std::move(handler));
  if (!server.ok()) {
    std::fprintf(stderr, "%s: server: %s\n", program,
                 std::string(server.status().message()).c_str());
    return nullptr;
  }
  return *std::move(server);
}

}  // namespace stitch::bench

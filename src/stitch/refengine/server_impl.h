// The reference engine's server from the inside, for the files that add its
// routes: server.cc (lifecycle, generation, commits, the state both dialects
// share), sglang_routes.cc and vllm_routes.cc (one dialect each, selected by
// EngineOptions::api). Private to this folder.
//
// About the coroutines here: GCC 12 destroys the temporaries of a co_await
// expression twice when the expression suspends. So arguments of a co_await
// are named objects (moved, or bound by reference) or trivially
// destructible, never temporaries with resources.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <random>
#include <string>
#include <string_view>
#include <utility>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/async_result.hpp>
#include <boost/asio/awaitable.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/this_coro.hpp>
#include <boost/asio/use_awaitable.hpp>

#include "absl/functional/any_invocable.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "stitch/net/event_loop.h"
#include "stitch/net/http.h"
#include "stitch/net/server.h"
#include "stitch/net/worker_pool.h"
#include "stitch/refengine/server.h"
#include "stitch/refengine/staging.h"
#include "stitch/refengine/weights.h"

namespace stitch {
namespace refengine_internal {

// A scheduler command's completion callback, and what starts the command.
template <typename T>
using CommandDone = absl::AnyInvocable<void(T) &&>;
template <typename T>
using CommandStart = absl::AnyInvocable<void(CommandDone<T>) &&>;

// Runs `start(done)`, which hands `done` to the scheduler, and resumes on
// this coroutine's executor with the value `done` receives (from any thread).
// The initiation captures only pointers into this frame (see the comment at
// the top of this file).
template <typename T>
boost::asio::awaitable<T> SchedulerCall(CommandStart<T> start) {
  namespace asio = boost::asio;
  const asio::any_io_executor executor = co_await asio::this_coro::executor;
  CommandStart<T>* start_ptr = &start;
  const asio::any_io_executor* executor_ptr = &executor;
  auto initiation = [start_ptr, executor_ptr](auto handler) {
    std::move (*start_ptr)(
        [executor = *executor_ptr, handler = std::move(handler)](T value) mutable {
          asio::post(executor, [handler = std::move(handler), value = std::move(value)]() mutable {
            std::move(handler)(std::move(value));
          });
        });
  };
  co_return co_await asio::async_initiate<decltype(asio::use_awaitable), void(T)>(
      initiation, asio::use_awaitable);
}

int64_t UnixSeconds();
double SecondsSince(std::chrono::steady_clock::time_point start);

// A checkpoint loaded for a commit: its weights, and the version its index
// records (metadata.version), when it records one.
struct LoadedCheckpoint {
  std::shared_ptr<const ModelWeights> weights;
  std::optional<int64_t> recorded_version;
};

}  // namespace refengine_internal

struct EngineServer::Impl {
  template <typename T>
  using awaitable = boost::asio::awaitable<T>;

  explicit Impl(EngineOptions o) : options(std::move(o)), faults(options.faults) {}

  EngineOptions options;
  ModelConfig config;
  int64_t parameters = 0;
  std::chrono::steady_clock::time_point started = std::chrono::steady_clock::now();
  FaultInjector faults;

  // Destroyed in reverse: the HTTP server first (its handlers reference
  // everything), the event loop last.
  EventLoop loop;
  std::unique_ptr<WorkerPool> workers;
  std::unique_ptr<WeightStager> stager;
  std::unique_ptr<Scheduler> scheduler;
  std::unique_ptr<HttpServer> http;

  // Loop thread only.
  std::mt19937_64 random{std::random_device{}()};
  bool committing = false;
  // vLLM: the label /update_weight_version set; nullopt before the first.
  std::optional<std::string> vllm_weight_version;
  // vLLM: the cache_salt of the latest generation request (for /metrics).
  std::optional<std::string> last_cache_salt;
  const std::string instance_id = absl::StrFormat("%016x%016x", random(), random());

  mutable absl::Mutex mu;
  std::optional<CommitOutcome> last_commit ABSL_GUARDED_BY(mu);

  EngineStatus Status() const;
  // The routes of options.api's dialect.
  HttpRouter Routes();

  std::string NewRid() { return absl::StrFormat("%016x%016x", random(), random()); }

  // Callers pass named objects (see the comment at the top of this file).
  // The error body in the dialect's shape, its HTTP status from the code.
  awaitable<void> RespondError(HttpExchange& ex, const absl::Status& status);
  static awaitable<void> RespondJson(HttpExchange& ex, int status, const std::string& body);

  // Both dialects: POST /generate (SGLang), /v1/completions and
  // /v1/chat/completions.
  awaitable<void> Generate(HttpExchange& ex, ApiRoute route);

  // --- Commits (server.cc) ---------------------------------------------------
  // Starts a weight load (committing set): Aborted with `busy` while another
  // runs, or the fault injected into commits.
  absl::Status BeginCommit(std::string_view busy);
  // Loads the checkpoint in `dir` on a worker, with the version its index
  // records; InvalidArgument when it holds another model configuration than
  // the served one (the message ends with `mismatch_hint`).
  awaitable<absl::StatusOr<refengine_internal::LoadedCheckpoint>> LoadForCommit(
      std::filesystem::path dir, std::string_view mismatch_hint);
  // Swaps `weights` in as `version` (the scheduler holds between two
  // steps), frees the old ones off the loop: what the commit did, or the
  // scheduler's error. Records nothing.
  awaitable<absl::StatusOr<CommitOutcome>> SwapIn(std::shared_ptr<const ModelWeights> weights,
                                                  VersionRef version,
                                                  std::chrono::steady_clock::time_point start);
  // Applies `patch` in place (the scheduler holds between two steps), with
  // the fault injected into patches: what the commit did, or the
  // scheduler's error (Scheduler::PatchWeights). Records nothing.
  awaitable<absl::StatusOr<CommitOutcome>> PatchIn(std::shared_ptr<const WeightPatch> patch,
                                                   std::chrono::steady_clock::time_point start);
  // The last commit, as /server_info reports it.
  void RecordCommit(const CommitOutcome& outcome);

  // --- SGLang's routes (sglang_routes.cc) ------------------------------------
  HttpRouter SglangRoutes();
  awaitable<void> Pause(HttpExchange& ex);
  awaitable<void> Continue(HttpExchange& ex);
  awaitable<void> FlushCache(HttpExchange& ex);
  awaitable<void> AbortRequests(HttpExchange& ex);
  awaitable<void> Health(HttpExchange& ex);
  awaitable<void> Stage(HttpExchange& ex);
  awaitable<void> UpdateFromDisk(HttpExchange& ex);
  awaitable<void> UpdateFromCpu(HttpExchange& ex);
  // The steps /update_weights_from_disk and /update_weights_from_cpu share.
  // BeginCommit for a request that parsed as `parsed`: false when the parse
  // error or the refusal was answered (nothing to clear then).
  awaitable<bool> BeginCommitRoute(HttpExchange& ex, const absl::Status& parsed);
  // Ends a begun commit that failed before the swap: clears `committing`,
  // answers `error`.
  awaitable<void> AbandonCommit(HttpExchange& ex, const absl::Status& error);
  // SwapIn, then AnswerCommit.
  awaitable<void> FinishCommit(HttpExchange& ex, std::shared_ptr<const ModelWeights> weights,
                               VersionRef version, std::string what,
                               std::chrono::steady_clock::time_point start);
  // Records and answers the commit of `what` (SwapIn's or PatchIn's
  // outcome), or its error, and clears `committing`.
  awaitable<void> AnswerCommit(HttpExchange& ex, absl::StatusOr<CommitOutcome> outcome,
                               std::string_view what);

  // --- vLLM's routes (vllm_routes.cc; docs/engine.md, "The vLLM dialect") ---
  HttpRouter VllmRoutes();
  awaitable<void> VllmPause(HttpExchange& ex);
  awaitable<void> VllmResume(HttpExchange& ex);
  awaitable<void> VllmIsPaused(HttpExchange& ex);
  awaitable<void> VllmAbort(HttpExchange& ex);
  awaitable<void> VllmCollectiveRpc(HttpExchange& ex);
  awaitable<void> VllmUpdateWeightVersion(HttpExchange& ex);
  awaitable<void> VllmWeightInfo(HttpExchange& ex);
  awaitable<void> VllmResetPrefixCache(HttpExchange& ex);
  awaitable<void> VllmHealth(HttpExchange& ex);
  awaitable<void> VllmMetrics(HttpExchange& ex);
};

}  // namespace stitch

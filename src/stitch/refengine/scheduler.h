// The reference engine's scheduler: one thread that runs continuous batching
// over the model (sequence.h) and is the only place where weights change.
//
// Requests are submitted into a bounded waiting queue. At the top of every
// loop iteration the scheduler thread runs the control commands posted since
// the previous iteration (pause, continue, aborts, weight swaps, cache
// flushes), admits waiting requests into the running set (bounded), and then,
// unless generation is paused, advances every running request by one step
// of one batched forward pass (a new request first feeds its prompt, in
// chunks, then decodes one token per step). Finished and aborted requests
// leave between steps. So a weight swap always happens between two steps, and
// a step always sees one weights snapshot.
//
// Results reach the submitter through its GenerationSink, called on the
// scheduler thread after each step that changed the request. Sinks must not
// block; the HTTP layer posts the update to the request's own event loop.
//
// Control commands complete through callbacks, also called on the scheduler
// thread (or on the destroying thread at shutdown, with an error). None of the
// public methods blocks on the scheduler thread: they are safe to call from an
// event loop.
//
// Thread-safe: every public method may be called from any thread.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <thread>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/functional/any_invocable.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "stitch/core/version.h"
#include "stitch/refengine/prefix_cache.h"
#include "stitch/refengine/sampler.h"
#include "stitch/refengine/sequence.h"
#include "stitch/refengine/tokenizer.h"
#include "stitch/refengine/weights.h"

namespace stitch {

// What POST /pause_generation does with the requests it finds running.
enum class PauseMode {
  kAbort,    // abort every running and waiting request
  kRetract,  // drop their KV caches and put them back at the head of the
             // queue; after continue they recompute their prompt and the
             // tokens generated so far under the weights current then
  kInPlace,  // keep them resident with their KV caches; after continue they
             // go on under whatever weights are current then
  kWait,     // admit nothing submitted from now on; the requests running or
             // queued at the pause run to their end, then generation stops
             // (vLLM's `wait`)
};

// "abort", "retract", "in_place", "wait".
std::string_view PauseModeName(PauseMode mode);
// SGLang's modes: "abort", "retract", "in_place" (kWait is vLLM's, named by
// its own dialect).
[[nodiscard]] absl::StatusOr<PauseMode> ParsePauseMode(std::string_view name);

// One generation as the scheduler runs it.
struct GenerationRequest {
  // The caller's request id; POST /abort_request matches it by prefix.
  std::string rid;
  // The cache-isolation key (SGLang `extra_key`, vLLM `cache_salt`): only
  // requests with equal keys share prefix-cache entries.
  std::string extra_key;
  std::vector<int32_t> prompt;
  SamplingParams sampling;
  // Tokens to generate at most; generation also ends when the context is
  // full. 0 finishes at once.
  int64_t max_new_tokens = 128;
  // Text that ends the generation when it appears in the output. The output
  // text ends before it unless keep_stop_string.
  std::vector<std::string> stop;
  // Tokens that end the generation (besides EOS unless ignore_eos). Such a
  // token is in the output ids but adds no text unless keep_stop_string.
  std::vector<int32_t> stop_token_ids;
  bool ignore_eos = false;
  bool keep_stop_string = false;
};

enum class FinishType { kStop, kLength, kAbort };

struct FinishReason {
  FinishType type = FinishType::kLength;
  std::optional<int32_t> matched_token;     // kStop by EOS or a stop token
  std::optional<std::string> matched_text;  // kStop by a stop string
  std::string message;                      // kAbort: why
};

struct GeneratedToken {
  int32_t id = 0;
  double logprob = 0;  // SampledToken::logprob
};

// What one request gained since its previous update.
struct GenerationUpdate {
  std::vector<GeneratedToken> tokens;  // new tokens, in order
  // New output text, to append to the earlier updates' text. Always whole
  // UTF-8 characters; text that a stop string might still cut is held back
  // until it is certain.
  std::string text;
  // The weight version current when this update was produced.
  VersionRef weight_version;
  // Prompt tokens taken from the prefix cache instead of computed.
  int64_t cached_tokens = 0;
  // Set on the request's last update.
  std::optional<FinishReason> finish;
};

// Called on the scheduler thread; must not block.
using GenerationSink = absl::AnyInvocable<void(GenerationUpdate)>;

using SchedulerClock = std::function<std::chrono::steady_clock::time_point()>;

struct SchedulerOptions {
  // Requests that advance together (the running set).
  int64_t max_running = 64;
  // Requests admitted beyond the running set; more are refused (Unavailable).
  int64_t max_queued = 256;
  // Prompt tokens one request feeds per step (chunked prefill), so that a
  // long prompt does not stall the decoding requests; 0: all at once.
  int64_t prefill_chunk = 512;
  // Memory for the prefix cache (prefix_cache.h): finished generations'
  // keys and values, reused by requests whose prompts start with the same
  // tokens under the same cache key and weights. 0: off.
  size_t prefix_cache_bytes = 0;
  // How often an idle scheduler wakes up to update its heartbeat.
  std::chrono::milliseconds idle_tick = std::chrono::milliseconds(100);
  // Healthy() is false once the heartbeat is older than this.
  std::chrono::milliseconds stall_timeout = std::chrono::seconds(10);
  // Time source for the heartbeat (tests inject one).
  SchedulerClock clock = [] { return std::chrono::steady_clock::now(); };
  // For tests: called on the scheduler thread at the top of every loop
  // iteration, before it runs commands; it may block to hold the scheduler
  // between two steps.
  std::function<void()> before_iteration;
  // For tests: called by the destructor once the scheduler thread has been
  // told to stop (before joining it).
  std::function<void()> on_stopping;

  // InvalidArgument naming the field: max_running >= 1, max_queued >= 0,
  // prefill_chunk >= 0, positive idle_tick and stall_timeout.
  [[nodiscard]] absl::Status Validate() const;
};

struct SchedulerStats {
  int64_t running = 0;  // admitted requests (paused ones included)
  int64_t queued = 0;   // waiting for admission (retracted ones included)
  bool paused = false;
  PauseMode pause_mode = PauseMode::kInPlace;  // meaningful when paused
  bool draining = false;                       // a kWait pause is waiting for its requests to end
  VersionRef weight_version;
  Checksum128 weights_fingerprint;  // ModelWeights::fingerprint() of the serving weights
  int64_t pending_commands = 0;     // posted, not yet run
  uint64_t steps = 0;
  uint64_t tokens_generated = 0;
  uint64_t requests_finished = 0;  // every finish, aborts included
  uint64_t requests_aborted = 0;
  uint64_t weight_swaps = 0;
  double last_swap_pause_seconds = 0;  // how long the last swap held the scheduler
  std::chrono::steady_clock::time_point heartbeat;
};

struct SwapResult {
  // The weights that were serving, handed back so that the caller frees
  // them off the scheduler thread.
  std::shared_ptr<const ModelWeights> previous;
  VersionRef previous_version;
  // How long the scheduler was held by the swap itself.
  double pause_seconds = 0;
  // Requests that were resident (running) and continue on the new weights.
  int64_t resident_requests = 0;
};

class Scheduler {
 public:
  // Starts the scheduler thread serving `weights` as `version`.
  // REQUIRES: weights != nullptr, options.Validate() is OK.
  Scheduler(std::shared_ptr<const ModelWeights> weights, VersionRef version,
            SchedulerOptions options);
  // Stops the thread, then, on the destroying thread, runs the commands
  // still pending (so every callback is called) and aborts the requests
  // still running or waiting ("the engine is shutting down"). Calls made
  // after the destructor started are not allowed.
  ~Scheduler();
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  const ModelConfig& config() const { return config_; }

  // Queues a request; returns its id (for Abort). Errors, with nothing
  // queued: InvalidArgument for a prompt or sampling parameters the model
  // cannot take (Sequence::Create's message); Unavailable when the running
  // set and the queue are full, or the scheduler is shutting down.
  [[nodiscard]] absl::StatusOr<uint64_t> Submit(GenerationRequest request, GenerationSink sink);

  // Aborts one request (a client that went away). No-op once it finished.
  void Abort(uint64_t id);

  // Aborts every running or waiting request whose rid starts with `rid`
  // (kRidPrefix, SGLang's rule), whose rid is `rid` (kRidExact, vLLM's), or
  // every request (kAll); `done` gets how many.
  enum class AbortScope { kRidPrefix, kRidExact, kAll };
  void AbortMatching(AbortScope scope, std::string rid, absl::AnyInvocable<void(int64_t) &&> done);

  // Pauses generation between two steps (see PauseMode); `done` gets how
  // many requests the mode affected (aborted, retracted, held, or waited
  // for). Pausing an engine already paused switches the mode and applies it.
  // Requests submitted while paused wait in the queue. A kWait pause calls
  // `done` only once the requests it waits for have ended (or a Continue
  // cancelled it); until then stats().draining is true.
  void Pause(PauseMode mode, absl::AnyInvocable<void(int64_t) &&> done);
  // Resumes generation (and ends a kWait pause still draining); `done` gets
  // whether it was paused.
  void Continue(absl::AnyInvocable<void(bool) &&> done);

  // OK, and the prefix cache emptied, when no request is running or
  // waiting; FailedPrecondition naming the counts otherwise.
  void FlushCache(absl::AnyInvocable<void(absl::Status) &&> done);

  // Between two steps: calls `at_pause` (fault injection), then makes
  // `weights` the serving weights as `version`. Resident requests keep their
  // KV caches and continue on the new weights; the prefix cache is emptied
  // (its entries were computed by the previous weights). InvalidArgument when the
  // weights' configuration differs from the serving one.
  void SwapWeights(std::shared_ptr<const ModelWeights> weights, VersionRef version,
                   absl::AnyInvocable<void() &&> at_pause,
                   absl::AnyInvocable<void(absl::StatusOr<SwapResult>) &&> done);

  // Between two steps: calls `at_pause`, then applies `patch` to the
  // serving weights in place and labels them `patch->to`
  // (ModelWeights::ApplyPatch, with `fail_after_tensors`). Resident
  // requests continue on the patched weights; the prefix cache is emptied.
  // The result's `previous` is null. Errors: Aborted when nothing changed
  // (the serving weights are not patch->from's, or are held beyond the
  // scheduler) or the patch failed and was undone; DataLoss when undoing
  // failed too (the weights are then unknown; their label is kept, the
  // caller must not serve them).
  void PatchWeights(std::shared_ptr<const WeightPatch> patch, int64_t fail_after_tensors,
                    absl::AnyInvocable<void() &&> at_pause,
                    absl::AnyInvocable<void(absl::StatusOr<SwapResult>) &&> done);

  SchedulerStats stats() const;
  VersionRef weight_version() const;
  // Whether the scheduler thread updated its heartbeat within stall_timeout.
  bool Healthy() const;
  // Seconds since the last heartbeat.
  double SecondsSinceHeartbeat() const;

 private:
  struct Entry;
  using Command = absl::AnyInvocable<void() &&>;

  void Run();
  void Post(Command command);
  bool HasWork() const ABSL_SHARED_LOCKS_REQUIRED(mu_);
  // Scheduler thread only.
  void AdmitWaiting();
  void Step();
  void Finish(Entry& entry, FinishReason reason, std::vector<GeneratedToken> tokens);
  void AbortEntry(Entry& entry, std::string message);
  // Offers what the entry's cache holds to the prefix cache.
  void CacheComputedPrefix(const Entry& entry);
  // Removes finished entries from running_.
  void SweepFinished();
  // Aborts the running and waiting entries `match` selects; returns how many.
  int64_t AbortWhere(const std::function<bool(const Entry&)>& match, std::string_view message);
  // Completes a kWait pause once nothing it waits for is left.
  void MaybeFinishDrain();
  // After the serving weights changed (started at `start`): labels them
  // `version`, fills in the rest of `result` and empties the prefix cache.
  void Relabel(VersionRef version, std::chrono::steady_clock::time_point start, SwapResult& result);

  const ModelConfig config_;
  const SchedulerOptions options_;

  mutable absl::Mutex mu_;
  std::deque<std::unique_ptr<Entry>> waiting_ ABSL_GUARDED_BY(mu_);
  std::vector<Command> commands_ ABSL_GUARDED_BY(mu_);
  bool stopping_ ABSL_GUARDED_BY(mu_) = false;
  bool paused_ ABSL_GUARDED_BY(mu_) = false;
  PauseMode pause_mode_ ABSL_GUARDED_BY(mu_) = PauseMode::kInPlace;
  int64_t running_count_ ABSL_GUARDED_BY(mu_) = 0;
  VersionRef version_ ABSL_GUARDED_BY(mu_);
  Checksum128 fingerprint_ ABSL_GUARDED_BY(mu_);
  double last_swap_pause_seconds_ ABSL_GUARDED_BY(mu_) = 0;
  std::chrono::steady_clock::time_point heartbeat_ ABSL_GUARDED_BY(mu_);
  uint64_t next_id_ ABSL_GUARDED_BY(mu_) = 1;
  // While a kWait pause drains: only requests with smaller ids are admitted.
  std::optional<uint64_t> drain_before_ ABSL_GUARDED_BY(mu_);

  std::atomic<uint64_t> steps_{0};
  std::atomic<uint64_t> tokens_generated_{0};
  std::atomic<uint64_t> requests_finished_{0};
  std::atomic<uint64_t> requests_aborted_{0};
  std::atomic<uint64_t> weight_swaps_{0};

  // Scheduler thread only.
  PrefixCache prefix_cache_{options_.prefix_cache_bytes};
  absl::AnyInvocable<void(int64_t) &&> drain_done_;  // the kWait pause's callback
  int64_t drain_affected_ = 0;
  std::shared_ptr<const ModelWeights> weights_;
  VersionRef serving_version_;  // version_'s value, without the lock
  std::vector<std::unique_ptr<Entry>> running_;

  std::thread thread_;
};

}  // namespace stitch

// The reference engine's HTTP bodies: parsing requests into our own types and
// writing responses, in SGLang's shapes (/generate and the control routes) and
// OpenAI's (/v1/completions, /v1/chat/completions). No I/O; the HTTP layer
// (server.h) routes and streams. docs/engine.md documents every field.
//
// Request parsing rules, shared by every route:
//   - the body must be one JSON object (malformed JSON is an error);
//   - a known field of the wrong type or out of range is an error naming the
//     field and what it accepts;
//   - SGLang sampling parameters are honoured or refused: an unknown name in
//     `sampling_params`, or a parameter this engine does not implement set to
//     anything but its neutral value (say presence_penalty 0.5), is an error;
//   - the same for the top-level features it does not implement (images,
//     LoRA, prompt log-probabilities, top alternatives, n > 1, ...);
//   - other unknown top-level fields are ignored (clients add their own).
// All parse errors are InvalidArgument, one line, naming the field.
#pragma once

#include <cstdint>
#include <filesystem>
#include <initializer_list>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "stitch/api/routes.h"
#include "stitch/core/version.h"
#include "stitch/refengine/config.h"
#include "stitch/refengine/dialect.h"
#include "stitch/refengine/faults.h"
#include "stitch/refengine/scheduler.h"
#include "stitch/refengine/staging.h"

namespace stitch {

struct ApiRequest {
  ApiRoute route = ApiRoute::kGenerate;
  EngineApi api = EngineApi::kSglang;
  // vLLM: the id the response names (`request_id`, or one the server
  // draws); generation.rid is then the id vLLM derives from it
  // (VllmEngineRid). Empty for SGLang, whose responses name generation.rid.
  std::string response_rid;
  // Prompt tokens (text prompts get BOS first), limits, stops, rid (empty
  // when the client sent none) and cache key. sampling.seed is only
  // meaningful when `seed` is set.
  GenerationRequest generation;
  std::optional<uint64_t> seed;  // the client's seed; else the server draws one
  bool stream = false;
  bool return_logprob = false;           // output_token_logprobs / logprobs
  bool return_text_in_logprobs = false;  // SGLang: token text as the triple's third item
  bool include_usage = false;            // OpenAI stream_options.include_usage
  // vLLM's return_tokens_as_token_ids: completion log-probabilities name
  // each token "token_id:<id>" instead of its text.
  bool tokens_as_ids = false;
  std::string model;  // OpenAI `model`, echoed back
  // `weight_version_spans` on the response and its events (off: as stock
  // SGLang and vLLM, which report none; EngineOptions::report_spans).
  bool report_spans = true;
};

// Parses a generation request for `route` in the `api` dialect: SGLang
// reads the request id from `rid` and the cache key from `extra_key` or
// `cache_salt`; vLLM reads `request_id` and `cache_salt` only. The prompt is
// checked against the model (vocabulary, context) later, when it is
// submitted.
[[nodiscard]] absl::StatusOr<ApiRequest> ParseApiRequest(ApiRoute route, std::string_view body,
                                                         const ModelConfig& config,
                                                         EngineApi api = EngineApi::kSglang);

// The id vLLM runs a request under, from the request id the client gave:
// "cmpl-<id>-0" for /v1/completions (one prompt), "chatcmpl-<id>" for
// /v1/chat/completions. /abort_requests matches these exactly.
std::string VllmEngineRid(ApiRoute route, std::string_view request_id);

// One generation as the HTTP layer accumulates it from GenerationUpdates.
struct GenerationProgress {
  std::string rid;
  int64_t prompt_tokens = 0;
  std::vector<GeneratedToken> tokens;
  std::string text;
  VersionRef weight_version;  // of the latest update
  // Where the weight version changed: (output token offset, version number)
  // pairs, the first at offset 0; each token carries the version of the
  // update that brought it (the weights of the step that sampled it). Empty
  // while no token was generated.
  std::vector<std::pair<int64_t, int64_t>> spans;
  int64_t cached_tokens = 0;  // prompt tokens from the prefix cache
  std::optional<FinishReason> finish;
  double e2e_latency_seconds = 0;  // set by the caller when finished

  void Apply(GenerationUpdate update);
};

struct ResponseContext {
  std::string model;    // the served model name
  int64_t created = 0;  // Unix seconds, for OpenAI's `created`
};

// The complete (non-streamed) response body. REQUIRES: progress.finish.
// Every response form, and every streamed event, carries
// `weight_version_spans` (progress.spans so far, as [offset, version] pairs):
// in `meta_info` on /generate, at the top level on the OpenAI routes.
std::string FormatResponse(const ApiRequest& request, const GenerationProgress& progress,
                           const ResponseContext& context);

// What a stream has sent so far.
struct StreamCursor {
  size_t text_sent = 0;
  size_t tokens_sent = 0;
  bool role_sent = false;  // chat: the first chunk carries the role
  bool done = false;       // the final chunk went out
};

// The SSE `data` payloads to send now for `progress` (none when there is
// nothing new), and advances the cursor. /generate chunks carry the cumulative text, ids and
// meta_info, like SGLang; OpenAI chunks carry deltas, then the finish reason,
// then, when asked, the usage. The caller sends "[DONE]" after the last.
std::vector<std::string> FormatStreamEvents(const ApiRequest& request,
                                            const GenerationProgress& progress,
                                            StreamCursor* cursor, const ResponseContext& context);

// {"success": false, "type": type, "message": message}.
std::string ErrorJson(std::string_view type, std::string_view message);
// vLLM's error body: {"error": {"message", "type", "param": null, "code":
// http_status}}, `type` from the status (BadRequestError, NotFoundError,
// InternalServerError, ...).
std::string VllmErrorJson(int http_status, std::string_view message);
// {"success": true, "message": message, <name>: <number>...}.
std::string SuccessJson(std::string_view message,
                        std::initializer_list<std::pair<std::string_view, int64_t>> numbers = {});

// --- Control routes ---------------------------------------------------------

// POST /pause_generation: {"mode": "abort"|"retract"|"in_place"}; an empty
// body or a missing mode means "abort" (SGLang's default).
[[nodiscard]] absl::StatusOr<PauseMode> ParsePauseRequest(std::string_view body);

// POST /abort_request: {"rid": "<prefix>"} or {"abort_all": true}.
struct AbortRequest {
  Scheduler::AbortScope scope = Scheduler::AbortScope::kRidPrefix;
  std::string rid_prefix;
};
[[nodiscard]] absl::StatusOr<AbortRequest> ParseAbortRequest(std::string_view body);

// POST /stage_weight_update. Versions are integers or version identities
// ("run/weight_v000007"); the runs named by base_version, target_version and
// run_id must agree.
[[nodiscard]] absl::StatusOr<StageRequest> ParseStageRequest(std::string_view body);
std::string FormatStageResult(const StageResult& result);

// POST /update_weights_from_disk.
struct UpdateFromDiskRequest {
  std::filesystem::path model_path;
  // The version the weights become; nullopt: the directory's index
  // metadata.version, else the serving version number stays.
  std::optional<VersionRef> weight_version;
  bool flush_cache = true;
  bool abort_all_requests = false;
};
[[nodiscard]] absl::StatusOr<UpdateFromDiskRequest> ParseUpdateFromDiskRequest(
    std::string_view body);

// POST /update_weights_from_cpu.
struct UpdateFromCpuRequest {
  VersionRef target_version;
  bool flush_cache = true;
};
[[nodiscard]] absl::StatusOr<UpdateFromCpuRequest> ParseUpdateFromCpuRequest(std::string_view body);

struct CommitOutcome {
  std::string message;
  VersionRef weight_version;
  VersionRef previous_version;
  double pause_seconds = 0;  // the scheduler's hold
  double seconds = 0;        // the whole commit (loading included for disk)
  int64_t resident_requests = 0;
  // /update_weights_from_cpu: "patch" (applied in place) or "swap" (whole
  // weights swapped in, for `reason`: PreparedWeights::reason), and a
  // patch's changed values; "" for disk.
  std::string path;
  std::string reason;
  uint64_t values_changed = 0;
};
std::string FormatCommitResult(const CommitOutcome& outcome);
// A commit the engine undid (409): {"success": false, "undone": true,
// "type": "Conflict", "message", "weight_version", "weight_version_id"} with
// the version it serves as before.
std::string UndoneJson(const absl::Status& error, const VersionRef& serving);

// GET /server_info, /model_info. Besides SGLang's fields, both carry
// `weight_version_id` (the identity, with its run), `instance_id` and
// `weights_fingerprint` (WeightsFingerprint of the serving weights, 32 hex
// digits), which let a sidecar verify what this engine holds.
struct EngineStatus {
  std::string model_path;
  std::string served_model_name;
  ModelConfig config;
  int64_t parameters = 0;
  int64_t boot_version = 0;
  SchedulerOptions scheduler_options;
  SchedulerStats scheduler;
  WeightStager::Info staging;
  FaultOptions faults;
  bool healthy = true;
  double seconds_since_heartbeat = 0;
  double uptime_seconds = 0;
  std::optional<CommitOutcome> last_commit;
  // Random per process: a new value means the engine restarted.
  std::string instance_id;
};
std::string FormatServerInfo(const EngineStatus& status);
std::string FormatModelInfo(const EngineStatus& status);
// GET /metrics: Prometheus text with SGLang's family names for what the
// reference engine has (sglang:num_running_reqs, sglang:num_queue_reqs,
// sglang:generation_tokens_total, sglang:num_requests_total).
std::string FormatMetrics(const EngineStatus& status);
// GET /v1/models.
std::string FormatModelList(const EngineStatus& status);
// GET /health: {"healthy": true, "weight_version": "..."}.
std::string FormatHealth(const EngineStatus& status);

// The served version as SGLang reports it: the version number as a string.
std::string WeightVersionString(const VersionRef& version);

}  // namespace stitch

// `stitch engine`: the reference inference engine's HTTP server. It speaks
// one dialect (dialect.h): SGLang's HTTP API with the staged-update
// extension (sglang_routes.cc), or vLLM's (vllm_routes.cc); docs/engine.md
// documents every route, docs/design.md ("Engines") how the sidecar uses
// them.
//
// Threads: one event loop runs every connection and handler (net/server.h);
// one scheduler thread runs the model (scheduler.h), and the loop never does
// model math; a small worker pool loads and stages checkpoints. Generation
// results flow from the scheduler thread to the request's coroutine on the
// loop; control routes post commands to the scheduler and await their
// completion on the loop.
//
// Routes of the SGLang dialect (the vLLM dialect's: vllm_routes.cc):
//   POST /generate, /v1/completions, /v1/chat/completions   generation
//   GET  /v1/models
//   POST /pause_generation, /continue_generation, /abort_request
//   GET|POST /flush_cache
//   GET  /health, /server_info (/get_server_info), /model_info (/get_model_info)
//   POST /stage_weight_update, /update_weights_from_disk, /update_weights_from_cpu
//
// HTTP status of an error body ({"success": false, "type", "message"}):
//   400 bad input (InvalidArgument, NotFound, FailedPrecondition), 409 a
//   commit already in progress, 422 corrupt version bytes (DataLoss), 503 the
//   engine is full or a staging is already running (Retry-After: 1), 500
//   internal errors and injected faults.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "stitch/refengine/faults.h"
#include "stitch/refengine/protocol.h"
#include "stitch/refengine/scheduler.h"

namespace stitch {

struct EngineOptions {
  // The checkpoint served at start (config.json plus safetensors).
  std::filesystem::path model_dir;
  std::string host = "127.0.0.1";
  uint16_t port = 0;  // 0 picks a free port (EngineServer::port() tells)
  // The version reported for the boot checkpoint, and its run ("" unknown).
  int64_t boot_version = 0;
  std::string run_id;
  // The model name in OpenAI responses; default: model_dir's last component.
  std::string served_model_name;
  // Whose HTTP API it speaks (dialect.h).
  EngineApi api = EngineApi::kSglang;
  SchedulerOptions scheduler;
  FaultOptions faults;
  // Threads loading and staging checkpoints.
  int worker_threads = 2;
  // Threads for the delta codec inside one staging (0: its default).
  int codec_threads = 0;
  // cpu stagings prepare an in-place patch when it changes at most this
  // share of the model's values (0: always whole weights).
  double patch_max_density = 0.3;
  // As SGLang's --api-key: when not empty, every route but /health needs
  // "Authorization: Bearer <api_key>" (401 otherwise).
  std::string api_key;
  // Whether responses carry `weight_version_spans` (protocol.h). Off, the
  // engine answers as stock SGLang does: a label per response and event,
  // no spans (for testing what a sidecar derives from that).
  bool report_spans = true;

  // InvalidArgument naming the option.
  [[nodiscard]] absl::Status Validate() const;
};

class EngineServer {
 public:
  // Loads the model, starts the scheduler and listens. Errors name the model
  // directory (a bad checkpoint) or the address (Unavailable when it cannot
  // be bound).
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<EngineServer>> Start(EngineOptions options);

  // Shutdown().
  ~EngineServer();
  EngineServer(const EngineServer&) = delete;
  EngineServer& operator=(const EngineServer&) = delete;

  uint16_t port() const;
  // "http://host:port".
  std::string url() const;

  const Scheduler& scheduler() const;
  // The scheduler itself, for tests that swap weights at a chosen step
  // (bypassing the commit routes and their checks).
  Scheduler& mutable_scheduler();
  // A snapshot of what GET /server_info reports.
  EngineStatus Status() const;

  // Stops listening, disconnects clients (their requests are aborted), waits
  // for every handler, then stops the scheduler and the workers. Blocks;
  // idempotent. Must not be called on the server's own threads.
  void Shutdown();

  struct Impl;

 private:
  explicit EngineServer(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace stitch

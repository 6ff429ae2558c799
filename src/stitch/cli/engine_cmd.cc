// `stitch engine`: the reference CPU inference engine. `stitch engine --model
// DIR --port P` serves it over HTTP (docs/engine.md); `stitch engine
// init-model DIR` writes a deterministic random checkpoint for it.
#include <signal.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdint>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "stitch/cli/commands.h"
#include "stitch/cli/report.h"
#include "stitch/cli/server_args.h"
#include "stitch/core/errors.h"
#include "stitch/refengine/config.h"
#include "stitch/refengine/init_model.h"
#include "stitch/refengine/server.h"

namespace stitch {
namespace {

struct InitModelArgs {
  std::string dir;
  int64_t layers = 4;
  int64_t hidden = 256;
  int64_t heads = 4;
  int64_t kv_heads = 0;      // 0: as many as --heads
  int64_t intermediate = 0;  // 0: derived from --hidden
  int64_t vocab = 258;
  int64_t max_positions = 2048;
  double rope_theta = 10000.0;
  uint64_t seed = 0;
  std::string dtype = "float32";
  bool tie = false;
  bool force = false;
};

// Llama's MLP width: 8/3 of the hidden size, rounded up to a multiple of 16.
int64_t DefaultIntermediate(int64_t hidden) { return (8 * hidden / 3 + 15) / 16 * 16; }

int RunInitModel(const InitModelArgs& args) {
  ModelConfig config;
  config.num_hidden_layers = args.layers;
  config.hidden_size = args.hidden;
  config.num_attention_heads = args.heads;
  config.num_key_value_heads = args.kv_heads > 0 ? args.kv_heads : args.heads;
  config.intermediate_size =
      args.intermediate > 0 ? args.intermediate : DefaultIntermediate(args.hidden);
  config.vocab_size = args.vocab;
  config.max_position_embeddings = args.max_positions;
  config.rope_theta = args.rope_theta;
  config.tie_word_embeddings = args.tie;
  absl::StatusOr<DType> dtype = ParseTorchDType(args.dtype);
  if (!dtype.ok()) return ReportFailure(Annotate(dtype.status(), "engine init-model: --dtype"));
  config.weight_dtype = *dtype;
  if (absl::Status s = config.Validate(); !s.ok()) {
    return ReportFailure(absl::InvalidArgumentError(
        absl::StrCat("engine init-model: ", s.message(), "; adjust the size options")));
  }

  const std::vector<HostTensor> tensors = RandomCheckpointTensors(config, args.seed);
  std::vector<TensorView> views;
  views.reserve(tensors.size());
  for (const HostTensor& t : tensors) views.push_back(t.view());
  if (absl::Status s = WriteCheckpoint(args.dir, config, views,
                                       args.force ? ExistingDir::kOverwrite : ExistingDir::kRefuse);
      !s.ok()) {
    return ReportFailure(Annotate(s, "engine init-model"));
  }
  std::cout << "wrote " << args.dir << ": LlamaForCausalLM, " << config.num_hidden_layers
            << " layers, hidden " << config.hidden_size << ", " << config.num_attention_heads
            << " heads, vocab " << config.vocab_size << ", " << config.ParameterCount()
            << " parameters as " << TorchDTypeName(config.weight_dtype) << ", seed " << args.seed
            << "\n";
  return 0;
}

void AddInitModelCommand(CLI::App& engine, int* exit_code) {
  static InitModelArgs args;
  CLI::App* cmd = engine.add_subcommand(
      "init-model",
      "Write a deterministic randomly initialised checkpoint (config.json, model.safetensors and "
      "its index) for the reference engine; the same options give identical bytes");
  cmd->add_option("dir", args.dir, "Directory to create (absent or empty unless --force)")
      ->required();
  cmd->add_option("--layers", args.layers, "Decoder layers")->capture_default_str();
  cmd->add_option("--hidden", args.hidden, "Hidden size")->capture_default_str();
  cmd->add_option("--heads", args.heads,
                  "Attention heads (hidden must split into an even head size)")
      ->capture_default_str();
  cmd->add_option("--kv-heads", args.kv_heads,
                  "Key/value heads for grouped-query attention (default: --heads)");
  cmd->add_option("--intermediate", args.intermediate,
                  "MLP size (default: 8/3 of --hidden rounded up to a multiple of 16)");
  cmd->add_option("--vocab", args.vocab, "Vocabulary size, at least 258 (bytes, BOS, EOS)")
      ->capture_default_str();
  cmd->add_option("--max-positions", args.max_positions, "Context length")->capture_default_str();
  cmd->add_option("--rope-theta", args.rope_theta, "Rotary base")->capture_default_str();
  cmd->add_option("--seed", args.seed, "Random seed")->capture_default_str();
  cmd->add_option("--dtype", args.dtype, "Weight storage: float32 or bfloat16")
      ->check(CLI::IsMember({"float32", "bfloat16"}))
      ->capture_default_str();
  cmd->add_flag("--tie,!--no-tie", args.tie,
                "Tie the LM head to the token embeddings (default: untied, so that training the "
                "LM head leaves the embeddings alone)");
  cmd->add_flag("--force", args.force,
                "Overwrite the checkpoint files of a non-empty DIR (other files stay)");
  cmd->callback([exit_code] { *exit_code = RunInitModel(args); });
}

struct ServeArgs {
  std::string model;
  std::string host = kDefaultListenHost;
  int port = 30000;
  int64_t boot_version = 0;
  std::string run_id;
  std::string served_model_name;
  std::string api = "sglang";
  int64_t max_running = 64;
  int64_t max_queued = 256;
  int64_t prefill_chunk = 512;
  uint64_t prefix_cache_bytes = 0;
  double stall_timeout_seconds = 10;
  int worker_threads = 2;
  double patch_max_density = 0.3;
  std::string api_key;
  bool report_spans = true;
  FaultOptions faults;
};

// Serves until SIGINT or SIGTERM, then shuts down cleanly (exit 0).
int RunServe(const ServeArgs& args) {
  EngineOptions options;
  options.model_dir = args.model;
  options.host = args.host;
  options.port = static_cast<uint16_t>(args.port);
  options.boot_version = args.boot_version;
  options.run_id = args.run_id;
  options.served_model_name = args.served_model_name;
  absl::StatusOr<EngineApi> api = ParseEngineApi(args.api);
  if (!api.ok()) return ReportFailure(Annotate(api.status(), "engine: --api"));
  options.api = *api;
  options.scheduler.max_running = args.max_running;
  options.scheduler.max_queued = args.max_queued;
  options.scheduler.prefill_chunk = args.prefill_chunk;
  options.scheduler.prefix_cache_bytes = args.prefix_cache_bytes;
  options.scheduler.stall_timeout =
      std::chrono::milliseconds(static_cast<int64_t>(args.stall_timeout_seconds * 1000.0));
  options.worker_threads = args.worker_threads;
  options.patch_max_density = args.patch_max_density;
  options.faults = args.faults;
  options.api_key = args.api_key;
  options.report_spans = args.report_spans;

  // Every thread the engine starts inherits this mask, so the signals reach
  // only the sigwait below.
  sigset_t signals;
  sigemptyset(&signals);
  sigaddset(&signals, SIGINT);
  sigaddset(&signals, SIGTERM);
  pthread_sigmask(SIG_BLOCK, &signals, nullptr);

  absl::StatusOr<std::unique_ptr<EngineServer>> server = EngineServer::Start(options);
  if (!server.ok()) return ReportFailure(server.status());
  const EngineStatus status = (*server)->Status();
  std::cout << "stitch engine: serving " << args.model << " (" << status.parameters
            << " parameters, " << EngineApiName(options.api) << " API, weight_version "
            << WeightVersionString(status.scheduler.weight_version)
            << (args.faults.any() ? ", fault injection on" : "") << ") on " << (*server)->url()
            << std::endl;
  int received = 0;
  sigwait(&signals, &received);
  std::cout << "stitch engine: " << (received == SIGINT ? "SIGINT" : "SIGTERM") << ", shutting down"
            << std::endl;
  (*server)->Shutdown();
  return 0;
}

void AddServeOptions(CLI::App& engine, ServeArgs& args) {
  engine.add_option("--model", args.model, "Checkpoint directory to serve (config.json + weights)");
  AddHostOption(&engine, &args.host);
  engine.add_option("--port", args.port, "Port to listen on (0 picks a free one)")
      ->check(CLI::Range(0, 65535))
      ->capture_default_str();
  engine
      .add_option("--boot-version", args.boot_version,
                  "The version number reported for the boot checkpoint")
      ->capture_default_str();
  engine.add_option("--run-id", args.run_id, "The run the boot checkpoint belongs to");
  engine
      .add_option("--api", args.api,
                  "Whose HTTP API to speak: sglang (its routes and Stitch's staging routes) or "
                  "vllm (vLLM's OpenAI server with its development and RL routes)")
      ->capture_default_str();
  engine.add_option("--served-model-name", args.served_model_name,
                    "Model name in OpenAI responses (default: the model directory's name)");
  engine
      .add_option("--max-running", args.max_running,
                  "Requests decoded together (the running batch)")
      ->capture_default_str();
  engine
      .add_option("--max-queued", args.max_queued,
                  "Requests waiting beyond the running batch; more get 503")
      ->capture_default_str();
  engine
      .add_option("--prefill-chunk", args.prefill_chunk,
                  "Prompt tokens one request feeds per step (0: all at once)")
      ->capture_default_str();
  engine
      .add_option("--prefix-cache-bytes", args.prefix_cache_bytes,
                  "Memory for the prefix cache: finished generations' keys and values, reused by "
                  "prompts that start with the same tokens under the same cache key and weights "
                  "(bytes, or with a unit: 256MiB; 0: off)")
      ->transform(CLI::AsSizeValue(false))
      ->capture_default_str();
  engine
      .add_option("--stall-timeout", args.stall_timeout_seconds,
                  "Seconds without scheduler progress before /health answers 503")
      ->capture_default_str();
  engine
      .add_option("--worker-threads", args.worker_threads,
                  "Threads that load and stage checkpoints")
      ->capture_default_str();
  engine
      .add_option("--patch-max-density", args.patch_max_density,
                  "cpu commits apply the values that changed in place when a version follows the "
                  "serving one by DELTAs changing at most this share of the values, else swap "
                  "whole weights in (0: always whole weights)")
      ->capture_default_str();
  engine.add_option("--api-key", args.api_key,
                    "As SGLang's: every route but /health needs \"Authorization: Bearer KEY\"");
  engine
      .add_flag("--weight-version-spans,!--no-weight-version-spans", args.report_spans,
                "Report weight_version_spans on every response and event (off: answer as "
                "stock SGLang does, a label per response and event and no spans)")
      ->capture_default_str();
  engine.add_option("--fault-fail-stagings,--fail-stagings", args.faults.fail_stagings,
                    "Fault injection: the next N /stage_weight_update calls fail (500)");
  engine.add_option("--fault-fail-commits,--fail-commits", args.faults.fail_commits,
                    "Fault injection: the next N commits (update_weights_from_disk/_cpu) fail "
                    "(500), leaving the weights unchanged");
  engine.add_option("--fault-hang-health-after,--hang-health-after", args.faults.hang_health_after,
                    "Fault injection: answer the first N /health requests, then hang every "
                    "later one (-1: never)");
  engine.add_option("--fault-exit-on-commit,--exit-on-commit", args.faults.exit_on_commit,
                    "Fault injection: the N-th commit exits the process (_exit(86)) while "
                    "generation is paused for it (0: never)");
  engine.add_option("--fault-fail-patches,--fail-patches", args.faults.fail_patches,
                    "Fault injection: the next N in-place patches fail half-way and are undone "
                    "(the commit answers \"undone\": true)");
}

}  // namespace

void AddEngineCommand(CLI::App& app, int* exit_code) {
  static ServeArgs serve;
  CLI::App* engine = app.add_subcommand(
      "engine",
      "The reference CPU inference engine: `stitch engine --model DIR --port P` serves SGLang's "
      "HTTP API with staged weight updates (docs/engine.md)");
  engine->require_subcommand(0, 1);
  AddServeOptions(*engine, serve);
  AddInitModelCommand(*engine, exit_code);
  engine->callback([engine, exit_code] {
    if (engine->got_subcommand("init-model")) return;
    if (serve.model.empty()) {
      *exit_code = ReportFailure(absl::InvalidArgumentError(
          "engine: --model DIR is required to serve (or use `stitch engine init-model DIR` to "
          "write a checkpoint)"));
      return;
    }
    *exit_code = RunServe(serve);
  });
}

}  // namespace stitch

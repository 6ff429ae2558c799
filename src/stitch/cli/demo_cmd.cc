// `stitch demo`: asynchronous RL on a local elastic fleet (src/stitch/demo/demo.h).
// Exit status: 0 when every check passed, 1 when one failed or the demo could
// not run, 2 for refused flags, 130 after Ctrl-C.
#include <pthread.h>
#include <signal.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "stitch/cli/commands.h"
#include "stitch/cli/report.h"
#include "stitch/cli/stop_signals.h"
#include "stitch/core/errors.h"
#include "stitch/demo/demo.h"
#include "stitch/demo/engine_command.h"

namespace stitch {
namespace {

constexpr int kExitRefused = 2;

int RunDemoCommand(DemoOptions options, const std::string& engine_api, bool dtype_given) {
  absl::StatusOr<EngineApi> api = ParseEngineApi(engine_api);
  if (!api.ok()) {
    ReportFailure(Annotate(api.status(), "demo: --engine-api"));
    return kExitRefused;
  }
  options.engine_api = *api;
  if (!options.engine_command.empty()) {
    if (absl::Status s = CheckEngineCommand(options.engine_command); !s.ok()) {
      ReportFailure(s);
      return kExitRefused;
    }
    // Real engines load bfloat16 checkpoints.
    if (!dtype_given) options.model_dtype = "bfloat16";
  }
  if (options.replicas < 2 || options.steps < 3 || options.lag < 0 || options.targets.empty()) {
    ReportFailure(absl::InvalidArgumentError(
        "demo: --replicas must be at least 2 (one is killed on stage), --steps at least 3, "
        "--lag at least 0 and --targets non-empty"));
    return kExitRefused;
  }
  // Ctrl-C and SIGTERM ask the demo to stop; it then stops every process it
  // started.
  return RunDemo(options, StopOnSignals());
}

}  // namespace

void AddDemoCommand(CLI::App& app, int* exit_code) {
  static DemoOptions options;
  static std::string engine_api = "sglang";
  CLI::App* cmd = app.add_subcommand(
      "demo",
      "Asynchronous RL on a local elastic fleet: a trainer learning and publishing, reference "
      "engines (or real ones: --engine-cmd) with sidecars following behind a gateway, one replica "
      "joining and one killed, "
      "then a summary, DIR/report.html and self-checks");
  cmd->add_option("--replicas", options.replicas, "Replicas at the start (one more joins)")
      ->capture_default_str();
  cmd->add_option("--steps", options.steps, "Training steps (one published version each)")
      ->capture_default_str();
  cmd->add_option("--lag", options.lag,
                  "Rollouts ask for min_version = latest - LAG (bounded staleness)")
      ->capture_default_str();
  cmd->add_option("--dir", options.dir,
                  "Directory for the store, checkpoints, logs and report.html (new or empty; "
                  "default: a fresh temporary directory)");
  cmd->add_flag("--keep", options.keep,
                "Leave the fleet running after the summary and print what to try, until Ctrl-C");
  cmd->add_option("--targets", options.targets,
                  "The task: completions are rewarded for the fraction of these bytes")
      ->capture_default_str();
  cmd->add_option("--engine-api", engine_api,
                  "Whose API the replicas speak: sglang (rollouts on /generate) or vllm (engines "
                  "with --api vllm behind sidecars with --engine vllm; rollouts on "
                  "/v1/completions)")
      ->capture_default_str();
  cmd->add_option("--engine-cmd", options.engine_command,
                  "Start each replica's engine with this command (run by /bin/sh -c in a process "
                  "group of its own) instead of `stitch engine`: a real engine speaking "
                  "--engine-api's API. Placeholders, replaced by shell-quoted values: {model} "
                  "(the base checkpoint's directory), {host}, {port} (picked free), "
                  "{served_model_name}, {name} (r0, r1, ...), {dir} (the replica's directory); "
                  "{{ and }} for braces. Its sidecar waits for it (--engine-start-timeout)");
  cmd->add_option("--engine-start-timeout", options.engine_start_timeout_s,
                  "Seconds a replica may take to start and catch up before the demo gives up")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--seed", options.seed, "Seed of the base checkpoint and the sampling")
      ->capture_default_str();
  cmd->add_option("--anchor-every", options.anchor_every,
                  "Publish a FULL anchor every K versions (XOR deltas between)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  cmd->add_option("--learning-rate", options.learning_rate, "The trainer's step size")
      ->capture_default_str();
  cmd->add_option("--entropy-bonus", options.entropy_bonus,
                  "Weight of the policy's entropy, up to --entropy-floor, in the trainer's "
                  "objective (keeps it from collapsing onto one byte)")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_option("--entropy-floor", options.entropy_floor,
                  "Entropy (nats) below which the bonus pulls the policy back")
      ->check(CLI::NonNegativeNumber)
      ->capture_default_str();
  cmd->add_option("--model-hidden", options.model_hidden,
                  "Hidden size of the demo's model (4 heads: a real vLLM on CPU needs a head "
                  "dimension of at least 32, so 128 or more)")
      ->capture_default_str();
  cmd->add_option("--model-layers", options.model_layers, "Decoder layers of the demo's model")
      ->capture_default_str();
  CLI::Option* dtype =
      cmd->add_option("--model-dtype", options.model_dtype,
                      "Weight storage of the demo's model: float32 or bfloat16 (default: "
                      "bfloat16 with --engine-cmd, which real engines load, else float32)")
          ->check(CLI::IsMember({"float32", "bfloat16"}));
  cmd->add_option("--prompts", options.prompts_per_step, "Prompts per step")->capture_default_str();
  cmd->add_option("--group", options.group_size,
                  "Completions per prompt (their rewards are compared with each other)")
      ->capture_default_str();
  cmd->add_option("--tokens", options.max_new_tokens, "Tokens per completion")
      ->capture_default_str();
  cmd->callback(
      [exit_code, dtype] { *exit_code = RunDemoCommand(options, engine_api, dtype->count() > 0); });
}

}  // namespace stitch

// `stitch demo`: asynchronous RL on a local elastic fleet, end to end.
//
// One supervising process starts, on loopback: a filesystem store, a base
// checkpoint (`stitch engine init-model`), N engines (reference engines, or
// real ones started by a command template: engine_command.h) each with its
// sidecar, and a gateway over a `file:` pool. It then runs a real
// asynchronous RL loop (policy_gradient.h): rollouts go through the gateway
// with min_version = latest - lag while the trainer learns from the previous
// batch and publishes every step (XOR delta; FULL anchor every
// `anchor_every`). A third of the way in one more replica joins; two thirds
// of the way in, once the joining replica is in rotation, one is killed with
// SIGKILL (its sidecar's and its engine's process groups). It prints a status line per step,
// a summary table and DIR/report.html, checks its invariants (report.h,
// CheckDemo) and stops everything it started.
#pragma once

#include <atomic>
#include <cstdint>
#include <string>

#include "stitch/refengine/dialect.h"

namespace stitch {

struct DemoOptions {
  int replicas = 3;  // at the start; one more joins, one is killed
  int steps = 40;
  int lag = 1;      // rollouts ask for min_version = latest - lag
  std::string dir;  // empty: a fresh temporary directory
  // Leave the fleet running after the summary, until `stop`.
  bool keep = false;
  // The task: the bytes a completion is rewarded for.
  // Letters, digits, space, '.' and ',': a quarter of the byte vocabulary,
  // so a random policy already earns some reward and the group-relative
  // advantages have something to compare from the first step.
  std::string targets = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 .,";
  uint64_t seed = 0;
  int anchor_every = 10;
  // Whose API the replicas' engines speak: SGLang's (rollouts on /generate)
  // or vLLM's (`stitch engine --api vllm` behind `stitch sidecar --engine
  // vllm`; rollouts on /v1/completions).
  EngineApi engine_api = EngineApi::kSglang;
  // Empty: the replicas' engines are `stitch engine --api <engine_api>`.
  // Otherwise the command template each replica's engine runs (a real vLLM
  // or SGLang speaking `engine_api`; engine_command.h).
  std::string engine_command;
  // How long the fleet's replicas may take to start and catch up (a real
  // engine takes a minute or more on a small machine).
  double engine_start_timeout_s = 600;
  // The base checkpoint's size (`stitch engine init-model --hidden --layers`,
  // 4 heads) and storage: "float32" or "bfloat16" (what real engines load).
  int model_hidden = 128;
  int model_layers = 2;
  std::string model_dtype = "float32";
  int prompts_per_step = 16;
  int group_size = 4;  // completions per prompt (group-relative advantages)
  int max_new_tokens = 16;
  double learning_rate = 3.0;
  // The trainer's entropy bonus and floor in nats (TrainerOptions): without
  // them the policy collapses onto one target byte ("oooo..."); with them it
  // keeps writing a spread of letters (the floor is about 25 equally likely
  // bytes).
  double entropy_bonus = 0.3;
  double entropy_floor = 3.2;
  int epochs = 2;  // gradient steps per batch
  // The reward must rise by this much from the first to the last quarter.
  double min_improvement = 0.05;
};

// Runs the demo, printing to stdout (a live status line when stdout is a
// terminal, plain lines otherwise). Returns the process exit status: 0 when
// every check passed, 1 when a check failed or the demo could not run (said
// on stderr, one line), 130 when `stop` was set (Ctrl-C) before the end.
int RunDemo(const DemoOptions& options, const std::atomic<bool>& stop);

}  // namespace stitch

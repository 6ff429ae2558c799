// `stitch chaos`: a real fleet on loopback under rollout load and a seeded
// fault schedule, with an oracle that knows which weights produced every
// answer (docs/chaos.md).
//
// One run: a store (a directory on a small tmpfs, or an S3 server), N
// reference engines with their sidecars, a gateway; a trainer publishing
// FULL and DELTA versions through `stitch publish` processes; a rollout
// client sending constrained requests through the gateway and directly to
// sidecars; the faults of MakeSchedule(seed, duration). Everything is
// recorded in DIR/history.jsonl; at the end the fleet must converge, every
// process stops, and the checker (checker.h) prints the figures and the
// checks into DIR/report.txt. A failing run prints its seed and the command
// that replays it.
#pragma once

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <string>

namespace stitch {

struct ChaosOptions {
  uint64_t seed = 1;
  double minutes = 2;        // of load and faults
  std::string store = "fs";  // "fs" or "s3"
  int replicas = 3;
  std::string dir;  // empty: a fresh directory under $TMPDIR (or /tmp)
  // Keep the whole run directory even when every check passed (by default
  // only history.jsonl and report.txt stay).
  bool keep = false;
  // The S3 configuration's server: the project's Python (with moto) and
  // tests/s3_moto.py.
  std::filesystem::path python;
  std::filesystem::path moto_script;
  // "reference": every engine is the reference engine. "vllm" or "sglang":
  // replica r0's engine is that real engine, started by `engine_command` (a
  // template: demo/engine_command.h), every request uses the one API it
  // shares with the reference engine (vLLM: /v1/completions with token ids;
  // SGLang: /generate), and its answers are judged by transformers
  // (`judge_script` run by `judge_python`, the engine's Python: judge.h).
  std::string engine = "reference";
  std::string engine_command;
  std::filesystem::path judge_python;
  std::filesystem::path judge_script;
};

// The command that replays a run: "make chaos CHAOS_SEED=... ...".
std::string ReplayCommand(const ChaosOptions& options);

// Runs it, printing progress and the figures to stdout. Returns the exit
// status: 0 when every check passed, 1 when one failed or the run could not
// be set up (said on stderr, one line), 130 when `stop` was set.
int RunChaos(const ChaosOptions& options, const std::atomic<bool>& stop);

}  // namespace stitch

// `stitch chaos`: the fault-injection suite (src/stitch/chaos/chaos.h,
// docs/chaos.md). Exit status: 0 when every check passed, 1 when one failed
// or the run could not be set up, 2 for refused flags, 130 after Ctrl-C.
#include <pthread.h>
#include <signal.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <atomic>
#include <iostream>
#include <random>
#include <string>
#include <thread>

#include "absl/status/status.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "stitch/chaos/chaos.h"
#include "stitch/cli/commands.h"
#include "stitch/cli/report.h"
#include "stitch/cli/stop_signals.h"
#include "stitch/demo/engine_command.h"

namespace stitch {
namespace {

constexpr int kExitRefused = 2;

struct ChaosFlags {
  std::string seed = "random";
  ChaosOptions options;
};

int RunChaosCommand(ChaosFlags& flags) {
  ChaosOptions& options = flags.options;
  if (flags.seed == "random") {
    std::random_device rd;
    options.seed = (static_cast<uint64_t>(rd()) << 32 | rd()) % 1000000000;
  } else if (!absl::SimpleAtoi(flags.seed, &options.seed)) {
    ReportFailure(absl::InvalidArgumentError(absl::StrCat(
        "chaos: --seed must be a non-negative integer or \"random\" (got \"", flags.seed, "\")")));
    return kExitRefused;
  }
  std::string refused;
  if (!(options.minutes >= 0.25 && options.minutes <= 24 * 60)) {
    refused = absl::StrCat("--minutes must be between 0.25 and 1440 (got ", options.minutes, ")");
  } else if (options.store != "fs" && options.store != "s3") {
    refused = absl::StrCat("--store must be fs or s3 (got \"", options.store, "\")");
  } else if (options.replicas < 2 || options.replicas > 16) {
    refused = absl::StrCat("--replicas must be between 2 and 16 (got ", options.replicas, ")");
  } else if (options.engine != "reference" && options.engine != "vllm" &&
             options.engine != "sglang") {
    refused =
        absl::StrCat("--engine must be reference, vllm or sglang (got \"", options.engine, "\")");
  } else if (options.engine != "reference") {
    if (absl::Status s = CheckEngineCommand(options.engine_command); !s.ok()) {
      refused = absl::StrCat("--engine ", options.engine, " needs --engine-cmd: ", s.message());
    } else if (::access(options.judge_python.c_str(), X_OK) != 0 ||
               ::access(options.judge_script.c_str(), R_OK) != 0) {
      refused = absl::StrCat(
          "--engine ", options.engine, " needs the engine's Python, with transformers (",
          "--judge-python ", options.judge_python.string(), "), and the judge (--judge-script ",
          options.judge_script.string(), "); run scripts/install-engines ", options.engine);
    }
  } else if (!options.engine_command.empty()) {
    refused = "--engine-cmd needs --engine vllm or --engine sglang";
  }
  if (!refused.empty()) {
    ReportFailure(absl::InvalidArgumentError(absl::StrCat("chaos: ", refused)));
    return kExitRefused;
  }
  if (options.store == "s3" && (::access(options.python.c_str(), X_OK) != 0 ||
                                ::access(options.moto_script.c_str(), R_OK) != 0)) {
    ReportFailure(absl::FailedPreconditionError(absl::StrCat(
        "chaos: the S3 configuration needs the project's Python with moto (--python ",
        options.python.string(), ") and tests/s3_moto.py (--moto-script ",
        options.moto_script.string(), "); run scripts/install-deps or give their paths")));
    return kExitRefused;
  }
  std::cout << "chaos: seed " << options.seed << " (replay: " << ReplayCommand(options) << ")"
            << std::endl;
  // Ctrl-C and SIGTERM ask the run to stop; it then stops every process it
  // started.
  return RunChaos(options, StopOnSignals());
}

}  // namespace

void AddChaosCommand(CLI::App& app, int* exit_code) {
  static ChaosFlags flags;
  flags.options.python = ".venv/bin/python";
  flags.options.moto_script = "tests/s3_moto.py";
  CLI::App* cmd = app.add_subcommand(
      "chaos",
      "Run a fleet on loopback under rollout load and a seeded fault schedule, judge every "
      "answer against the weights that produced it, and print the figures");
  cmd->add_option("--seed", flags.seed,
                  "Seed of the fault schedule and the request mix (\"random\" draws one and "
                  "prints it)")
      ->capture_default_str();
  cmd->add_option("--minutes", flags.options.minutes, "Minutes of load and faults")
      ->capture_default_str();
  cmd->add_option("--store", flags.options.store,
                  "fs (a directory on a small tmpfs) or s3 (a local S3 server, moto)")
      ->capture_default_str();
  cmd->add_option("--replicas", flags.options.replicas, "Engines with their sidecars")
      ->capture_default_str();
  cmd->add_option("--dir", flags.options.dir,
                  "Run directory (new or empty; default: a fresh one under $TMPDIR or /tmp)");
  cmd->add_flag("--keep", flags.options.keep,
                "Keep the whole run directory (store, logs) even when every check passed");
  cmd->add_option("--python", flags.options.python, "The Python with moto, for --store s3")
      ->capture_default_str();
  cmd->add_option("--moto-script", flags.options.moto_script,
                  "tests/s3_moto.py, which runs the S3 server, for --store s3")
      ->capture_default_str();
  flags.options.judge_script = "tests/engines/chaos_judge.py";
  cmd->add_option("--engine", flags.options.engine,
                  "reference: every replica on the reference engine; vllm or sglang: replica r0 on "
                  "that real engine, started by --engine-cmd, its answers judged by transformers")
      ->capture_default_str();
  cmd->add_option("--engine-cmd", flags.options.engine_command,
                  "The real engine's command, a template run with /bin/sh -c: {model} and {port} "
                  "(required), {host}, {served_model_name}, {name}, {dir}; the engine's API key "
                  "follows as --api-key KEY");
  cmd->add_option("--judge-python", flags.options.judge_python,
                  "The real engine's Python (with torch and transformers), which runs the judge");
  cmd->add_option("--judge-script", flags.options.judge_script,
                  "tests/engines/chaos_judge.py, the transformers judge")
      ->capture_default_str();
  cmd->callback([exit_code] { *exit_code = RunChaosCommand(flags); });
}

}  // namespace stitch

// Running a program (the `stitch` binary) and capturing what it prints.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <vector>

namespace stitch::testing {

struct ProcessResult {
  int exit_code = -1;  // the exit status, or 128 + signal number
  std::string out;     // stdout
  std::string err;     // stderr
};

// Runs `argv` (argv[0] is a path) with stdin closed, waits for it, and
// returns its exit code and output. A failure to start it is reported as
// exit code 127 with the reason in `err`. With a `timeout`, a process still
// running when it passes is killed (SIGKILL): exit code 137, and `err` ends
// with a line saying it timed out.
ProcessResult RunProcess(const std::vector<std::string>& argv,
                         std::optional<std::chrono::milliseconds> timeout = std::nullopt);

// Starts `argv` without waiting; pair with WaitProcess. Returns the pid, or
// -1 when it could not start.
struct RunningProcess {
  int pid = -1;
  int out_fd = -1;
  int err_fd = -1;
};
RunningProcess StartProcess(const std::vector<std::string>& argv);
ProcessResult WaitProcess(RunningProcess process,
                          std::optional<std::chrono::milliseconds> timeout = std::nullopt);

// The `stitch` binary under test: $STITCH_BIN (set by CTest).
std::string StitchBinary();

// RunProcess of the `stitch` binary with `args`.
ProcessResult RunStitch(std::vector<std::string> args);

}  // namespace stitch::testing

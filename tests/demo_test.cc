// `stitch demo` end to end: a short run (few steps, two replicas) of the
// whole system, checked from the outside: its exit status, its report, and
// what its summary and log say about joins, kills and violations.
#include <algorithm>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/support/browser.h"
#include "tests/support/subprocess.h"
#include "tests/support/temp_dir.h"

namespace stitch {
namespace {

using ::stitch::testing::ProcessResult;
using ::stitch::testing::RunStitch;
using ::stitch::testing::TempDir;
using ::testing::HasSubstr;
using ::testing::Not;

std::string Slurp(const std::filesystem::path& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// Processes whose command line mentions `text`.
std::vector<std::string> ProcessesMentioning(const std::string& text) {
  std::vector<std::string> out;
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    const std::string name = entry.path().filename().string();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    std::string cmdline = Slurp(entry.path() / "cmdline");
    std::replace(cmdline.begin(), cmdline.end(), '\0', ' ');
    if (cmdline.find(text) != std::string::npos) out.push_back(name + ": " + cmdline);
  }
  return out;
}

TEST(DemoTest, AShortRunPassesItsChecksAndWritesTheReport) {
  ASSERT_FALSE(testing::StitchBinary().empty()) << "STITCH_BIN is not set";
  TempDir tmp;
  const std::filesystem::path dir = tmp / "demo";
  ProcessResult r = RunStitch({"demo", "--replicas", "2", "--steps", "6", "--dir", dir.string()});
  ASSERT_EQ(r.exit_code, 0) << "stdout:\n" << r.out << "\nstderr:\n" << r.err;
  // Not a terminal: plain lines, no cursor control.
  EXPECT_THAT(r.out, Not(HasSubstr("\033[K")));
  for (int step = 1; step <= 6; ++step) {
    const std::string n = std::to_string(step);
    EXPECT_THAT(r.out, HasSubstr(n + "/6  published v" + n + " ")) << r.out;
  }
  EXPECT_THAT(r.out, ::testing::ContainsRegex("stitch demo: dashboard http://[0-9.]+:[0-9]+/ui "));
  EXPECT_THAT(r.out, HasSubstr("join: starting replica r2"));
  EXPECT_THAT(r.out, HasSubstr("kill: SIGKILL to replica r1"));
  EXPECT_THAT(r.out, HasSubstr("3 started, 1 joined, 1 killed"));
  EXPECT_THAT(r.out, HasSubstr("6 published"));
  EXPECT_THAT(r.out, HasSubstr(" 0 constraint violations"));
  EXPECT_THAT(r.out, HasSubstr("checks         all passed"));
  EXPECT_THAT(r.out, HasSubstr("report: " + (dir / "report.html").string()));

  const std::string html = Slurp(dir / "report.html");
  EXPECT_THAT(html, HasSubstr("<svg"));
  EXPECT_THAT(html, HasSubstr("All checks passed"));
  EXPECT_THAT(html, HasSubstr("r2 (joined)"));
  EXPECT_THAT(html, HasSubstr("<h2>Samples</h2>"));
  EXPECT_THAT(html, HasSubstr("<h2>Staleness</h2>"));
  EXPECT_TRUE(std::filesystem::exists(dir / "logs" / "gateway.log"));
  // Every process the demo started (they all name the directory) is gone.
  EXPECT_THAT(ProcessesMentioning(dir.string()), ::testing::IsEmpty());

  // What a person sees: the report rendered by a real browser.
  ASSERT_FALSE(testing::ChromiumBinary().empty())
      << "no chromium: install Debian's chromium package (scripts/install-deps)";
  const std::filesystem::path png = testing::ArtifactsDir() / "demo-report.png";
  ProcessResult shot =
      testing::Screenshot("file://" + (dir / "report.html").string(),
                          std::chrono::milliseconds(500), png, 1000, 2600, tmp / "browser");
  EXPECT_EQ(shot.exit_code, 0) << shot.err;
  EXPECT_GT(std::filesystem::file_size(png), 10000u);
}

// The same run on vLLM's API: engines with --api vllm behind sidecars with
// --engine vllm (the sidecars stage), rollouts on /v1/completions.
TEST(DemoTest, AShortRunOnTheVllmApiPassesItsChecks) {
  ASSERT_FALSE(testing::StitchBinary().empty()) << "STITCH_BIN is not set";
  TempDir tmp;
  const std::filesystem::path dir = tmp / "demo";
  ProcessResult r = RunStitch(
      {"demo", "--engine-api", "vllm", "--replicas", "2", "--steps", "10", "--dir", dir.string()});
  ASSERT_EQ(r.exit_code, 0) << "stdout:\n" << r.out << "\nstderr:\n" << r.err;
  EXPECT_THAT(r.out, HasSubstr("10/10  published v10 "));
  EXPECT_THAT(r.out, HasSubstr("kill: SIGKILL to replica r1"));
  EXPECT_THAT(r.out, HasSubstr(" 0 constraint violations"));
  EXPECT_THAT(r.out, HasSubstr("checks         all passed"));
  const std::string engine_log = Slurp(dir / "logs" / "engine-r0.log");
  EXPECT_THAT(engine_log, HasSubstr("vllm API"));
  EXPECT_THAT(ProcessesMentioning(dir.string()), ::testing::IsEmpty());
}

// The same on engines started by a command template (--engine-cmd), as
// `make demo-vllm` starts real vLLM servers: here the template runs `stitch
// engine --api vllm` on the port the fleet picked, after starting a helper
// in the engine's process group that outlives the shell, so that the kill
// and the final stop are seen to reach every process the command started.
TEST(DemoTest, AShortRunOnEnginesStartedByACommandTemplatePassesItsChecks) {
  ASSERT_FALSE(testing::StitchBinary().empty()) << "STITCH_BIN is not set";
  TempDir tmp;
  const std::filesystem::path dir = tmp / "demo";
  const std::string command = "touch {dir}/helper; tail -f {dir}/helper & exec '" +
                              testing::StitchBinary() +
                              "' engine --model {model} --host {host} --port {port} --api vllm "
                              "--served-model-name {served_model_name} --worker-threads 1";
  ProcessResult r = RunStitch({"demo", "--engine-api", "vllm", "--engine-cmd", command,
                               "--replicas", "2", "--steps", "10", "--dir", dir.string()});
  ASSERT_EQ(r.exit_code, 0) << "stdout:\n" << r.out << "\nstderr:\n" << r.err;
  EXPECT_THAT(r.out, HasSubstr("engines: vllm API, started by --engine-cmd touch {dir}/helper"));
  EXPECT_THAT(r.out, HasSubstr("10/10  published v10 "));
  EXPECT_THAT(r.out, HasSubstr("join: starting replica r2"));
  EXPECT_THAT(r.out, HasSubstr("kill: SIGKILL to replica r1"));
  EXPECT_THAT(r.out, HasSubstr("3 started, 1 joined, 1 killed"));
  EXPECT_THAT(r.out, HasSubstr(" 0 constraint violations"));
  EXPECT_THAT(r.out, HasSubstr("checks         all passed"));
  // Each engine served the base checkpoint, stored as real engines load it,
  // on the port its sidecar was given.
  EXPECT_THAT(Slurp(dir / "base" / "config.json"), HasSubstr("bfloat16"));
  for (const std::string name : {"r0", "r1", "r2"}) {
    const std::string engine_log = Slurp(dir / "logs" / ("engine-" + name + ".log"));
    EXPECT_THAT(engine_log, HasSubstr("serving " + (dir / "base").string()));
    EXPECT_THAT(engine_log, HasSubstr("vllm API"));
    const size_t at = engine_log.find("on http://127.0.0.1:");
    ASSERT_NE(at, std::string::npos) << engine_log;
    const std::string port =
        engine_log.substr(at + 20, engine_log.find_first_not_of("0123456789", at + 20) - at - 20);
    EXPECT_THAT(Slurp(dir / "logs" / ("sidecar-" + name + ".log")), HasSubstr("127.0.0.1:" + port));
    EXPECT_TRUE(std::filesystem::exists(dir / "replicas" / name / "helper"));
  }
  EXPECT_THAT(ProcessesMentioning(dir.string()), ::testing::IsEmpty());
}

TEST(DemoTest, RefusesAnEngineCommandWithoutItsPort) {
  ASSERT_FALSE(testing::StitchBinary().empty()) << "STITCH_BIN is not set";
  ProcessResult r = RunStitch({"demo", "--engine-cmd", "vllm serve {model} --port 8000"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("--engine-cmd"));
  EXPECT_THAT(r.err, HasSubstr("{port}"));
}

TEST(DemoTest, RefusesAnUnknownEngineApi) {
  ASSERT_FALSE(testing::StitchBinary().empty()) << "STITCH_BIN is not set";
  ProcessResult r = RunStitch({"demo", "--engine-api", "trtllm"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("--engine-api"));
  EXPECT_THAT(r.err, HasSubstr("expected sglang|vllm"));
}

TEST(DemoTest, RefusesANonEmptyDirectory) {
  ASSERT_FALSE(testing::StitchBinary().empty()) << "STITCH_BIN is not set";
  TempDir tmp;
  std::ofstream(tmp / "precious.txt") << "keep me";
  ProcessResult r = RunStitch({"demo", "--dir", tmp.path().string()});
  EXPECT_EQ(r.exit_code, 1);
  EXPECT_THAT(r.err, HasSubstr("is not empty"));
  EXPECT_EQ(Slurp(tmp / "precious.txt"), "keep me");
}

TEST(DemoTest, RefusesTooFewReplicas) {
  ASSERT_FALSE(testing::StitchBinary().empty()) << "STITCH_BIN is not set";
  ProcessResult r = RunStitch({"demo", "--replicas", "1"});
  EXPECT_EQ(r.exit_code, 2);
  EXPECT_THAT(r.err, HasSubstr("--replicas must be at least 2"));
}

}  // namespace
}  // namespace stitch

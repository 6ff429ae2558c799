#include "stitch/demo/supervisor.h"

#include <signal.h>

#include <fstream>
#include <iterator>
#include <sstream>
#include <thread>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "tests/support/temp_dir.h"

namespace stitch {
namespace {

using ::testing::HasSubstr;

constexpr auto kTimeout = std::chrono::seconds(30);

std::string Slurp(const std::filesystem::path& path) {
  std::ifstream in(path);
  return std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
}

// Gone, or a zombie nobody reaped yet: either way no longer running.
bool Dead(int pid) {
  std::ifstream stat("/proc/" + std::to_string(pid) + "/stat");
  if (!stat) return true;
  std::string line;
  std::getline(stat, line);
  const size_t paren = line.rfind(')');
  return paren != std::string::npos && paren + 2 < line.size() && line[paren + 2] == 'Z';
}

// Children run /bin/sh with the script as `-c`.
std::vector<std::string> Shell(const std::string& script) { return {"-c", script}; }

TEST(ProcessSupervisor, ReadsTheAnnouncedUrlAndStopsTheChild) {
  testing::TempDir tmp;
  ProcessSupervisor supervisor("/bin/sh");
  auto pid = supervisor.Start(
      "server", Shell("echo 'server: listening on http://127.0.0.1:4321 (pool x)'; exec sleep 600"),
      tmp / "server.log");
  ASSERT_TRUE(pid.ok()) << pid.status();
  auto url = supervisor.WaitForUrl(*pid, kTimeout, nullptr);
  ASSERT_TRUE(url.ok()) << url.status();
  EXPECT_EQ(*url, "http://127.0.0.1:4321");
  EXPECT_FALSE(supervisor.ExitStatus(*pid).has_value());
  supervisor.StopAll(kTimeout);
  EXPECT_EQ(supervisor.ExitStatus(*pid), 128 + SIGTERM);
}

TEST(ProcessSupervisor, RunsAnotherProgramWithItsPathAsArgv0) {
  testing::TempDir tmp;
  ProcessSupervisor supervisor("/bin/false", "chaos");
  auto pid =
      supervisor.StartProgram("shell", "/bin/sh", Shell("echo \"argv0 $0\""), tmp / "shell.log");
  ASSERT_TRUE(pid.ok()) << pid.status();
  EXPECT_EQ(supervisor.WaitForExit(*pid, kTimeout).value_or(-1), 0);
  EXPECT_THAT(Slurp(tmp / "shell.log"), HasSubstr("argv0 /bin/sh"));
  auto never = supervisor.WaitForUrl(*pid, kTimeout, nullptr);
  EXPECT_THAT(never.status().message(), HasSubstr("chaos: shell exited with status 0"));
}

TEST(ProcessSupervisor, AChildThatExitsBeforeListeningIsAnError) {
  testing::TempDir tmp;
  ProcessSupervisor supervisor("/bin/sh");
  auto pid =
      supervisor.Start("broken", Shell("echo 'no port for you' >&2; exit 3"), tmp / "broken.log");
  ASSERT_TRUE(pid.ok()) << pid.status();
  auto url = supervisor.WaitForUrl(*pid, kTimeout, nullptr);
  ASSERT_FALSE(url.ok());
  EXPECT_EQ(url.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(url.status().message(), HasSubstr("exited with status 3"));
  EXPECT_THAT(url.status().message(), HasSubstr("broken.log"));
}

TEST(ProcessSupervisor, WaitForUrlGivesUpWhenCancelled) {
  testing::TempDir tmp;
  ProcessSupervisor supervisor("/bin/sh");
  auto pid = supervisor.Start("silent", Shell("exec sleep 600"), tmp / "silent.log");
  ASSERT_TRUE(pid.ok()) << pid.status();
  std::atomic<bool> cancel{true};
  auto url = supervisor.WaitForUrl(*pid, kTimeout, &cancel);
  EXPECT_EQ(url.status().code(), absl::StatusCode::kCancelled);
}

TEST(ProcessSupervisor, SignalReachesTheWholeProcessGroup) {
  testing::TempDir tmp;
  ProcessSupervisor supervisor("/bin/sh");
  // The shell waits on a grandchild; killing only the shell would leave the
  // grandchild behind, holding the log open.
  auto pid = supervisor.Start("group", Shell("sleep 600 & echo \"on http://h:1 $!\"; wait"),
                              tmp / "group.log");
  ASSERT_TRUE(pid.ok()) << pid.status();
  ASSERT_TRUE(supervisor.WaitForUrl(*pid, kTimeout, nullptr).ok());
  std::istringstream words(Slurp(tmp / "group.log"));
  std::string on, url;
  int grandchild = -1;
  words >> on >> url >> grandchild;
  ASSERT_GT(grandchild, 0);
  EXPECT_FALSE(Dead(grandchild));
  supervisor.Signal(*pid, SIGKILL);
  auto status = supervisor.WaitForExit(*pid, kTimeout);
  ASSERT_TRUE(status.ok()) << status.status();
  EXPECT_EQ(*status, 128 + SIGKILL);
  const auto deadline = std::chrono::steady_clock::now() + kTimeout;
  while (!Dead(grandchild) && std::chrono::steady_clock::now() < deadline) {
    std::this_thread::yield();
  }
  EXPECT_TRUE(Dead(grandchild));
}

TEST(ProcessSupervisor, ChildrenGetOnlyTheirStandardDescriptors) {
  testing::TempDir tmp;
  ProcessSupervisor supervisor("/bin/sh");
  auto pid =
      supervisor.Start("fds", Shell("ls /proc/self/fd; echo on http://h:2 done"), tmp / "fds.log");
  ASSERT_TRUE(pid.ok()) << pid.status();
  ASSERT_TRUE(supervisor.WaitForExit(*pid, kTimeout).ok());
  // 0, 1, 2 and the one `ls` opened to list the directory, whatever the
  // test process holds open.
  std::ifstream open_here("/dev/null");
  EXPECT_EQ(Slurp(tmp / "fds.log"), "0\n1\n2\n3\non http://h:2 done\n");
}

}  // namespace
}  // namespace stitch

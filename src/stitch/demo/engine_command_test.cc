#include "stitch/demo/engine_command.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <fstream>
#include <set>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace stitch {
namespace {

using ::testing::HasSubstr;

EngineCommandValues Values() {
  EngineCommandValues v;
  v.model = "/tmp/demo/base";
  v.port = 23456;
  v.name = "r1";
  v.dir = "/tmp/demo dir/replicas/r1";
  return v;
}

TEST(EngineCommand, ReplacesEveryPlaceholderWithItsQuotedValue) {
  auto expanded = ExpandEngineCommand(
      "python serve.py serve {model} --host {host} --port {port} --served-model-name "
      "{served_model_name} --log {dir}/{name}.log",
      Values());
  ASSERT_TRUE(expanded.ok()) << expanded.status();
  EXPECT_EQ(*expanded,
            "python serve.py serve /tmp/demo/base --host 127.0.0.1 --port 23456 "
            "--served-model-name policy --log '/tmp/demo dir/replicas/r1'/r1.log");
}

TEST(EngineCommand, DoubledBracesAreLiteralBraces) {
  auto expanded = ExpandEngineCommand("echo '{{\"port\": {port}}}' {model}", Values());
  ASSERT_TRUE(expanded.ok()) << expanded.status();
  EXPECT_EQ(*expanded, "echo '{\"port\": 23456}' /tmp/demo/base");
}

TEST(EngineCommand, QuotesWhatTheShellWouldInterpret) {
  EXPECT_EQ(ShellQuote("/a/b-c_d.e:1"), "/a/b-c_d.e:1");
  EXPECT_EQ(ShellQuote(""), "''");
  EXPECT_EQ(ShellQuote("a b"), "'a b'");
  EXPECT_EQ(ShellQuote("it's $HOME"), "'it'\\''s $HOME'");
}

TEST(EngineCommand, RefusesUnknownPlaceholdersAndLoneBraces) {
  auto unknown = ExpandEngineCommand("serve {modle} --port {port}", Values());
  EXPECT_FALSE(unknown.ok());
  EXPECT_THAT(unknown.status().message(), HasSubstr("unknown placeholder {modle}"));
  EXPECT_THAT(ExpandEngineCommand("serve {model", Values()).status().message(),
              HasSubstr("without its"));
  EXPECT_THAT(ExpandEngineCommand("serve } {model}", Values()).status().message(),
              HasSubstr("lone"));
}

TEST(EngineCommand, ATemplateMustNameTheModelAndThePort) {
  EXPECT_TRUE(CheckEngineCommand("serve {model} --port {port}").ok());
  EXPECT_THAT(CheckEngineCommand("serve /elsewhere --port {port}").message(), HasSubstr("{model}"));
  EXPECT_THAT(CheckEngineCommand("serve {model} --port 8000").message(), HasSubstr("{port}"));
  EXPECT_THAT(CheckEngineCommand("serve {model} {prot}").message(), HasSubstr("{prot}"));
}

TEST(EngineCommand, PicksAFreePortBelowTheEphemeralRangeAndSkipsTakenOnes) {
  auto first = PickEnginePort({});
  ASSERT_TRUE(first.ok()) << first.status();
  std::ifstream range("/proc/sys/net/ipv4/ip_local_port_range");
  int ephemeral_low = 0;
  ASSERT_TRUE(range >> ephemeral_low);
  EXPECT_GE(*first, 1024);
  EXPECT_LT(*first, ephemeral_low);
  // Held by a listener: never picked again while it listens.
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in addr{};
  addr.sin_family = AF_INET;
  addr.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  addr.sin_port = htons(static_cast<uint16_t>(*first));
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&addr), sizeof(addr)), 0);
  ASSERT_EQ(::listen(fd, 1), 0);
  std::set<int> taken;
  for (int i = 0; i < 50; ++i) {
    auto port = PickEnginePort(taken);
    ASSERT_TRUE(port.ok()) << port.status();
    EXPECT_NE(*port, *first);
    EXPECT_FALSE(taken.contains(*port));
    taken.insert(*port);
  }
  ::close(fd);
}

}  // namespace
}  // namespace stitch

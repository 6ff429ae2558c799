// Bearer tokens end to end (docs/sidecar.md, "Bearer tokens"): a reference
// engine started with an API key, its sidecar and a gateway closed with the
// fleet's token, `stitch publish` waking the fleet and `stitch status`
// reading it with that token.
#include <poll.h>

#include <atomic>
#include <chrono>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <memory>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "stitch/core/version.h"
#include "stitch/net/client.h"
#include "stitch/net/net_test_util.h"
#include "tests/sidecar_process.h"
#include "tests/support/subprocess.h"
#include "tests/support/temp_dir.h"

namespace stitch {
namespace {

using ::stitch::testing::ProcessResult;
using ::stitch::testing::ServerProcess;
using ::stitch::testing::TempDir;
using ::testing::HasSubstr;
using namespace std::chrono_literals;

constexpr auto kStartTimeout = std::chrono::seconds(60);
constexpr auto kConverge = std::chrono::seconds(60);

ProcessResult Stitch(std::vector<std::string> args) {
  args.insert(args.begin(), testing::StitchBinary());
  return testing::RunProcess(args);
}

void ExpectOk(const ProcessResult& r, std::string_view what) {
  EXPECT_EQ(r.exit_code, 0) << what << "\nstdout: " << r.out << "\nstderr: " << r.err;
}

int Status(const std::string& method, const std::string& url, const std::string& token = "",
           std::string body = "") {
  FetchOptions options;
  options.timeout = 30s;
  if (!token.empty()) options.headers.Set("Authorization", "Bearer " + token);
  auto r = HttpFetch(method, url, std::move(body), options);
  return r.ok() ? r->status : 0;
}

std::string Metric(const std::string& url, const std::string& name) {
  auto r = HttpFetch("GET", url + "/metrics");
  if (!r.ok()) return "";
  const size_t at = r->body.find("\n" + name + " ");
  if (at == std::string::npos) return "";
  const size_t begin = at + name.size() + 2;
  return r->body.substr(begin, r->body.find('\n', begin) - begin);
}

// Holds connections from one loopback address to a server, as an attacker
// of its body budget would: each declares a body of `body` bytes, half of
// them send none of it and half all but its last byte. A connection the
// server answers or closes is opened again at once, until destroyed.
class BodyHolder {
 public:
  BodyHolder(uint16_t port, std::string address, int connections, size_t body)
      : thread_([this, port, address = std::move(address), connections, body] {
          Run(port, address, connections, body);
        }) {}
  ~BodyHolder() {
    stop_ = true;
    thread_.join();
  }
  BodyHolder(const BodyHolder&) = delete;
  BodyHolder& operator=(const BodyHolder&) = delete;

  int opened() const { return opened_.load(); }

 private:
  void Run(uint16_t port, const std::string& address, int connections, size_t body) {
    const std::string head =
        absl::StrCat("POST /generate HTTP/1.1\r\nHost: x\r\nContent-Length: ", body, "\r\n\r\n");
    const std::string most(body - 1, 'a');
    std::vector<std::unique_ptr<testing::RawSocket>> held(static_cast<size_t>(connections));
    while (!stop_) {
      for (size_t i = 0; i < held.size() && !stop_; ++i) {
        if (held[i] != nullptr) continue;
        held[i] = std::make_unique<testing::RawSocket>(port, address.c_str());
        held[i]->Send(head);
        if (i % 2 == 1) held[i]->Send(most);
        ++opened_;
      }
      // Wait for an answer or a close on any of them; reopen those.
      if (stop_) break;
      std::vector<pollfd> fds;
      for (const auto& socket : held) fds.push_back(pollfd{socket->fd(), POLLIN, 0});
      if (::poll(fds.data(), fds.size(), 100) <= 0) continue;
      for (size_t i = 0; i < fds.size(); ++i) {
        if (fds[i].revents != 0) held[i].reset();
      }
    }
  }

  std::atomic<bool> stop_{false};
  std::atomic<int> opened_{0};
  std::thread thread_;
};

// The URL of a server of stitch's once its /health answers 200; nullopt
// (with the failure and the server's stderr recorded) when it never does.
std::optional<std::string> WaitHealthy(ServerProcess& server) {
  std::optional<std::string> url = server.WaitForUrl(kStartTimeout);
  if (!url.has_value() ||
      !testing::Eventually([&] { return Status("GET", *url + "/health") == 200; }, kConverge)) {
    ADD_FAILURE() << "no healthy server: " << server.err();
    return std::nullopt;
  }
  return url;
}

class AuthIntegrationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_FALSE(testing::StitchBinary().empty()) << "STITCH_BIN is not set";
    base_ = (tmp_ / "base").string();
    store_ = (tmp_ / "store").string();
    ExpectOk(Stitch({"engine", "init-model", base_, "--layers", "1", "--hidden", "32", "--heads",
                     "2", "--seed", "1", "--max-positions", "512"}),
             "init-model");
    ExpectOk(Stitch({"claim", "--store", store_, "--run-id", "r1"}), "claim");
    std::filesystem::create_directories(tmp_ / "out");
    version1_ = (tmp_ / "out" / VersionDirName(1)).string();
    ExpectOk(Stitch({"delta", "full", "--checkpoint", base_, "--out", version1_, "--version", "1",
                     "--run-id", "r1"}),
             "delta full");
    std::ofstream(token_file_) << kFleetToken << "\n";
    std::ofstream(engine_token_file_) << kEngineKey << "\n";
  }

  static constexpr const char* kFleetToken = "fleet-token-0123";
  static constexpr const char* kEngineKey = "engine-key-4567";

  TempDir tmp_;
  std::string base_;
  std::string store_;
  std::string version1_;
  std::string token_file_ = (tmp_ / "fleet.token").string();
  std::string engine_token_file_ = (tmp_ / "engine.token").string();
};

TEST_F(AuthIntegrationTest, ATokenClosedFleetServesOnlyThoseWhoPresentIt) {
  ServerProcess engine({testing::StitchBinary(), "engine", "--model", base_, "--port", "0",
                        "--run-id", "r1", "--api-key", kEngineKey});
  std::optional<std::string> engine_url = engine.WaitForUrl(kStartTimeout);
  ASSERT_TRUE(engine_url.has_value()) << engine.err();
  EXPECT_EQ(Status("POST", *engine_url + "/generate", "", R"({"text":"x"})"), 401);

  ServerProcess sidecar({testing::StitchBinary(), "sidecar", "--store", store_, "--run-id", "r1",
                         "--engine-url", *engine_url, "--base-checkpoint", base_, "--update-mode",
                         "cpu", "--reconcile-interval", "0", "--auth-token-file", token_file_,
                         "--auth-data-plane", "--engine-token-file", engine_token_file_});
  // It reaches the engine with the engine's key: it verifies and serves.
  std::optional<std::string> sidecar_url = WaitHealthy(sidecar);
  ASSERT_TRUE(sidecar_url.has_value());

  const std::string pool = (tmp_ / "pool.txt").string();
  std::ofstream(pool) << *sidecar_url << "\n";
  ServerProcess gateway({testing::StitchBinary(), "gateway", "--pool", "file:" + pool, "--port",
                         "0", "--poll-interval", "0.1", "--admission-wait", "5",
                         "--auth-token-file", token_file_, "--auth-data-plane"});
  // It polls the replica with the token, so the replica enters its rotation.
  std::optional<std::string> gateway_url = WaitHealthy(gateway);
  ASSERT_TRUE(gateway_url.has_value());

  const std::string generate =
      R"({"text":"hi","sampling_params":{"max_new_tokens":2},"weight_version":{"min_version":0}})";
  for (const std::string& url : {*sidecar_url, *gateway_url}) {
    EXPECT_EQ(Status("POST", url + "/generate", "", generate), 401) << url;
    EXPECT_EQ(Status("POST", url + "/generate", "wrong", generate), 401) << url;
    EXPECT_EQ(Status("POST", url + "/generate", kFleetToken, generate), 200) << url;
    EXPECT_EQ(Status("GET", url + "/metrics"), 200) << url;
  }
  EXPECT_EQ(Status("POST", *sidecar_url + "/wake", "", "{}"), 401);
  EXPECT_EQ(Status("GET", *sidecar_url + "/server_info"), 401);
  EXPECT_EQ(Status("GET", *gateway_url + "/replicas"), 401);
  EXPECT_EQ(Status("GET", *gateway_url + "/replicas", kFleetToken), 200);

  // `stitch status` reads the fleet with the token, and only with it.
  ProcessResult refused = Stitch({"status", "--gateway", *gateway_url});
  EXPECT_NE(refused.exit_code, 0);
  EXPECT_THAT(refused.err, HasSubstr("401"));
  ProcessResult status =
      Stitch({"status", "--pool", "file:" + pool, "--auth-token-file", token_file_});
  ExpectOk(status, "status");
  EXPECT_THAT(status.out, HasSubstr(*sidecar_url));

  // With no backstop reconcile, only the publish's wake, which carries the
  // token, makes the sidecar look at the store again (a 409 would too, so
  // nothing versioned is sent until the wake was seen).
  const std::string passes_before = Metric(*sidecar_url, "stitch_sidecar_reconcile_passes_total");
  ASSERT_FALSE(passes_before.empty());
  ExpectOk(Stitch({"publish", "--store", store_, "--run-id", "r1", "--pool", "file:" + pool,
                   "--auth-token-file", token_file_, version1_}),
           "publish");
  EXPECT_TRUE(testing::Eventually(
      [&] {
        return Metric(*sidecar_url, "stitch_sidecar_reconcile_passes_total") != passes_before;
      },
      kConverge))
      << "the wake did not reach the sidecar: " << sidecar.err();
  EXPECT_TRUE(testing::Eventually(
      [&] {
        return Status("POST", *sidecar_url + "/generate", kFleetToken,
                      R"({"text":"hi","sampling_params":{"max_new_tokens":2},)"
                      R"("weight_version":{"exact_version":1}})") == 200;
      },
      kConverge))
      << sidecar.err();
}

// Strangers from three addresses holding request bodies (declared and not
// sent, or sent but for the last byte), with the data plane open, leave the
// requests that present the fleet's token their share of the body budget, on
// the sidecar and on the gateway in front of it.
TEST_F(AuthIntegrationTest, StrangersHoldingBodiesFromThreeAddressesLeaveTokenHoldersServed) {
  ServerProcess engine(
      {testing::StitchBinary(), "engine", "--model", base_, "--port", "0", "--run-id", "r1"});
  std::optional<std::string> engine_url = engine.WaitForUrl(kStartTimeout);
  ASSERT_TRUE(engine_url.has_value()) << engine.err();
  // A budget of 16 bodies, as the defaults (32 MiB and 512 MiB) are.
  const std::vector<std::string> budget = {"--max-body-bytes", "1MiB", "--max-total-body-bytes",
                                           "16MiB"};
  std::vector<std::string> sidecar_args = {testing::StitchBinary(),
                                           "sidecar",
                                           "--store",
                                           store_,
                                           "--run-id",
                                           "r1",
                                           "--engine-url",
                                           *engine_url,
                                           "--base-checkpoint",
                                           base_,
                                           "--update-mode",
                                           "cpu",
                                           "--port",
                                           "0",
                                           "--auth-token-file",
                                           token_file_};
  sidecar_args.insert(sidecar_args.end(), budget.begin(), budget.end());
  ServerProcess sidecar(sidecar_args);
  std::optional<std::string> sidecar_url = WaitHealthy(sidecar);
  ASSERT_TRUE(sidecar_url.has_value());
  const std::string pool = (tmp_ / "pool.txt").string();
  std::ofstream(pool) << *sidecar_url << "\n";
  std::vector<std::string> gateway_args = {testing::StitchBinary(),
                                           "gateway",
                                           "--pool",
                                           "file:" + pool,
                                           "--port",
                                           "0",
                                           "--poll-interval",
                                           "0.1",
                                           "--auth-token-file",
                                           token_file_};
  gateway_args.insert(gateway_args.end(), budget.begin(), budget.end());
  ServerProcess gateway(gateway_args);
  std::optional<std::string> gateway_url = WaitHealthy(gateway);
  ASSERT_TRUE(gateway_url.has_value());

  const std::string generate =
      R"({"text":"hi","sampling_params":{"max_new_tokens":2},"weight_version":{"min_version":0}})";
  for (const std::string& url : {*sidecar_url, *gateway_url}) {
    const uint16_t port = static_cast<uint16_t>(std::stoi(url.substr(url.rfind(':') + 1)));
    std::vector<std::unique_ptr<BodyHolder>> attack;
    for (const char* address : {"127.0.0.2", "127.0.0.3", "127.0.0.4"}) {
      attack.push_back(std::make_unique<BodyHolder>(port, address, 16, size_t{1} << 20));
    }
    // Every attacker has its connections open before the first request.
    ASSERT_TRUE(testing::Eventually(
        [&] {
          for (const auto& holder : attack) {
            if (holder->opened() < 16) return false;
          }
          return true;
        },
        kConverge));
    int answered = 0;
    for (int i = 0; i < 40; ++i) {
      if (Status("POST", url + "/generate", kFleetToken, generate) == 200) ++answered;
    }
    EXPECT_GE(answered, 38) << url;
    std::cout << url << ": " << answered << " of 40 requests with the token answered\n";
    // The strangers' requests were refused for the budget meanwhile.
    const std::string refused =
        Metric(url, url == *sidecar_url ? "stitch_sidecar_overloaded_total"
                                        : "stitch_gateway_overloaded_total");
    EXPECT_NE(refused, "0") << url;
    EXPECT_NE(refused, "") << url;
  }
}

TEST_F(AuthIntegrationTest, TheDataPlaneNeedsAToken) {
  ProcessResult refused =
      Stitch({"sidecar", "--store", store_, "--run-id", "r1", "--engine-url", "http://127.0.0.1:1",
              "--base-checkpoint", base_, "--update-mode", "cpu", "--auth-data-plane"});
  EXPECT_EQ(refused.exit_code, 2);
  EXPECT_THAT(refused.err, HasSubstr("--auth-data-plane needs a token"));
  ProcessResult unreadable = Stitch({"gateway", "--pool", "static:http://127.0.0.1:1",
                                     "--auth-token-file", (tmp_ / "missing").string()});
  EXPECT_EQ(unreadable.exit_code, 2);
  EXPECT_THAT(unreadable.err, HasSubstr("--auth-token-file: cannot read"));
}

// A sidecar with --peers serves every version its store verified to its
// peers: without the fleet's token to guard them it refuses to start (a
// sidecar that started anyway is stopped when the wait runs out).
TEST_F(AuthIntegrationTest, PeersNeedAToken) {
  ProcessResult refused = testing::RunProcess(
      {testing::StitchBinary(), "sidecar", "--store", store_, "--run-id", "r1", "--engine-url",
       "http://127.0.0.1:1", "--base-checkpoint", base_, "--update-mode", "cpu", "--peers",
       "static:http://127.0.0.1:1", "--port", "0"},
      std::chrono::seconds(60));
  EXPECT_EQ(refused.exit_code, 2) << refused.err;
  EXPECT_THAT(refused.err, HasSubstr("--peers needs the fleet's token"));
}

}  // namespace
}  // namespace stitch

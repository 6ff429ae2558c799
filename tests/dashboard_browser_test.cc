// The gateway's dashboard (/ui) in a real browser: headless Chromium loads
// it from a `stitch gateway` process in front of two real replicas (engine
// and sidecar, one filesystem store), after a publish and a kill, and the
// test reads what the page's script drew; then from a gateway closed by the
// fleet's token, without it and with it in the URL's fragment. Screenshots
// are kept under <build>/artifacts.
#include <signal.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <boost/json/parse.hpp>

#include "stitch/api/server_info.h"
#include "stitch/core/version.h"
#include "stitch/net/client.h"
#include "stitch/net/net_test_util.h"
#include "tests/sidecar_process.h"
#include "tests/support/browser.h"
#include "tests/support/cli_expect.h"
#include "tests/support/subprocess.h"
#include "tests/support/temp_dir.h"

namespace stitch {
namespace {

namespace json = boost::json;
using ::stitch::testing::ExpectOk;
using ::stitch::testing::ProcessResult;
using ::stitch::testing::RunStitch;
using ::stitch::testing::ServerProcess;
using ::stitch::testing::TempDir;
using ::testing::HasSubstr;
using namespace std::chrono_literals;

constexpr auto kStartTimeout = std::chrono::seconds(60);
constexpr auto kConverge = std::chrono::seconds(60);
// Virtual time the page's script gets: its first poll, and two more.
constexpr auto kPageBudget = std::chrono::milliseconds(2500);

struct Replica {
  std::unique_ptr<ServerProcess> engine;
  std::unique_ptr<ServerProcess> sidecar;
  std::string url;
};

class DashboardBrowserTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_FALSE(testing::StitchBinary().empty()) << "STITCH_BIN is not set";
    ASSERT_FALSE(testing::ChromiumBinary().empty())
        << "no chromium: install Debian's chromium package (scripts/install-deps) or set "
           "STITCH_CHROMIUM";
    base_ = (tmp_ / "base").string();
    store_ = (tmp_ / "store").string();
    ExpectOk(RunStitch({"engine", "init-model", base_, "--layers", "1", "--hidden", "32", "--heads",
                        "2", "--seed", "1", "--max-positions", "512"}),
             "init-model");
    std::filesystem::create_directories(tmp_ / "out");
    for (int v = 1; v <= 2; ++v) {
      ExpectOk(RunStitch({"delta", "full", "--checkpoint", base_, "--out", VersionDir(v),
                          "--version", std::to_string(v), "--run-id", "r1"}),
               "delta full");
    }
    ExpectOk(RunStitch({"claim", "--store", store_, "--run-id", "r1", "--boot-version", "0"}),
             "claim");
  }

  std::string VersionDir(int64_t v) const { return (tmp_ / "out" / VersionDirName(v)).string(); }

  void StartReplica(int i) {
    auto r = std::make_unique<Replica>();
    r->engine = std::make_unique<ServerProcess>(std::vector<std::string>{
        testing::StitchBinary(), "engine", "--model", base_, "--port", "0", "--run-id", "r1"});
    auto engine_url = r->engine->WaitForUrl(kStartTimeout);
    ASSERT_TRUE(engine_url.has_value()) << r->engine->err();
    r->sidecar = std::make_unique<ServerProcess>(
        std::vector<std::string>{testing::StitchBinary(),
                                 "sidecar",
                                 "--store",
                                 store_,
                                 "--run-id",
                                 "r1",
                                 "--engine",
                                 "sglang",
                                 "--engine-url",
                                 *engine_url,
                                 "--base-checkpoint",
                                 base_,
                                 "--update-mode",
                                 "disk",
                                 "--local-checkpoint",
                                 (tmp_ / ("local" + std::to_string(i))).string(),
                                 "--reconcile-interval",
                                 "0.2",
                                 "--port",
                                 "0"});
    auto url = r->sidecar->WaitForUrl(kStartTimeout);
    ASSERT_TRUE(url.has_value()) << r->sidecar->err();
    r->url = *url;
    replicas_.push_back(std::move(r));
  }

  void Publish(int64_t v) {
    std::string pool = "static:";
    for (size_t i = 0; i < replicas_.size(); ++i) pool += (i ? "," : "") + replicas_[i]->url;
    ExpectOk(
        RunStitch({"publish", "--store", store_, "--run-id", "r1", "--pool", pool, VersionDir(v)}),
        "publish");
  }

  // The gateway's /replicas, as parsed by `stitch status`.
  PoolState GatewayReplicas() {
    auto r = HttpFetch("GET", gateway_url_ + "/replicas");
    if (!r.ok() || r->status != 200) return {};
    auto state = ParseReplicas(r->body);
    return state.ok() ? *std::move(state) : PoolState{};
  }

  bool EveryReplicaServes(int64_t version) {
    PoolState s = GatewayReplicas();
    if (s.replicas.size() != replicas_.size()) return false;
    for (const ReplicaStatus& r : s.replicas) {
      if (!r.state.ready || !r.state.applied || r.state.applied->version != version) return false;
    }
    return true;
  }

  TempDir tmp_;
  std::string base_;
  std::string store_;
  std::vector<std::unique_ptr<Replica>> replicas_;
  std::unique_ptr<ServerProcess> gateway_;
  std::string gateway_url_;
};

size_t Count(const std::string& text, const std::string& what) {
  size_t n = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

TEST_F(DashboardBrowserTest, ThePageShowsReplicasThePointerAKillAndAsksForTheToken) {
  StartReplica(0);
  StartReplica(1);
  ASSERT_EQ(replicas_.size(), 2u);
  const std::string pool_file = (tmp_ / "replicas.txt").string();
  {
    std::ofstream out(pool_file);
    for (const auto& r : replicas_) out << r->url << "\n";
  }
  gateway_ = std::make_unique<ServerProcess>(
      std::vector<std::string>{testing::StitchBinary(), "gateway", "--pool", "file:" + pool_file,
                               "--host", "127.0.0.1", "--port", "0", "--poll-interval", "0.2"});
  auto url = gateway_->WaitForUrl(kStartTimeout);
  ASSERT_TRUE(url.has_value()) << gateway_->err();
  gateway_url_ = *url;

  Publish(1);
  ASSERT_TRUE(testing::Eventually([&] { return EveryReplicaServes(1); }, kConverge))
      << gateway_->err();
  Publish(2);
  ASSERT_TRUE(testing::Eventually([&] { return EveryReplicaServes(2); }, kConverge))
      << gateway_->err();
  // Some traffic, so that the rate and staleness charts have something.
  for (int i = 0; i < 4; ++i) {
    FetchOptions options;
    options.timeout = 30s;
    auto r = HttpFetch("POST", gateway_url_ + "/generate",
                       R"({"text":"The policy","sampling_params":{"max_new_tokens":2}})", options);
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->status, 200) << r->body;
  }

  const std::filesystem::path artifacts = testing::ArtifactsDir();
  ProcessResult shot = testing::Screenshot(gateway_url_ + "/ui", kPageBudget,
                                           artifacts / "dashboard.png", 1400, 1500, tmp_ / "p1");
  EXPECT_EQ(shot.exit_code, 0) << shot.err;

  // A state change: the second replica's sidecar dies; once the gateway
  // knows, the page must show it.
  const std::string killed = replicas_[1]->url;
  replicas_[1]->sidecar->Signal(SIGKILL);
  ASSERT_TRUE(testing::Eventually(
      [&] {
        for (const ReplicaStatus& r : GatewayReplicas().replicas) {
          if (r.url == killed) return !r.reachable;
        }
        return false;
      },
      kConverge));

  ProcessResult dom = testing::DumpDom(gateway_url_ + "/ui", kPageBudget, tmp_ / "p2");
  ASSERT_EQ(dom.exit_code, 0) << dom.err;
  const std::string& html = dom.out;
  // The script ran and drew from /ui/state.
  EXPECT_THAT(html, HasSubstr("data-updates=\"")) << html;
  EXPECT_THAT(html, HasSubstr("id=\"pointer\">v2<"));
  EXPECT_EQ(Count(html, "<tr data-url=\""), 2u) << html;
  for (const auto& r : replicas_) EXPECT_THAT(html, HasSubstr("<tr data-url=\"" + r->url + "\""));
  // The killed replica's row and its change of state.
  EXPECT_THAT(html, HasSubstr("class=\"st state\" style=\"background: rgb(85, 88, 94);\">"
                              "unreachable</span>"));
  EXPECT_THAT(html, HasSubstr("data-state=\"unreachable\">"));
  EXPECT_THAT(html, HasSubstr(killed + "  unreachable  v2"));
  // Both replicas' lanes are drawn, and the versions they served.
  EXPECT_EQ(Count(html, "<g data-url=\""), 2u);
  EXPECT_THAT(html, HasSubstr("v2 "));

  shot = testing::Screenshot(gateway_url_ + "/ui", kPageBudget, artifacts / "dashboard-kill.png",
                             1400, 1500, tmp_ / "p3");
  EXPECT_EQ(shot.exit_code, 0) << shot.err;
  EXPECT_GT(std::filesystem::file_size(artifacts / "dashboard-kill.png"), 10000u);

  // A gateway closed by the fleet's token: the page says what it needs, and
  // draws the fleet once the token is in its URL's fragment.
  const std::filesystem::path token_file = tmp_ / "token";
  std::ofstream(token_file) << "dashboard-token\n";
  ServerProcess closed({testing::StitchBinary(), "gateway", "--pool", "file:" + pool_file, "--host",
                        "127.0.0.1", "--port", "0", "--poll-interval", "0.2", "--auth-token-file",
                        token_file.string()});
  auto closed_url = closed.WaitForUrl(kStartTimeout);
  ASSERT_TRUE(closed_url.has_value()) << closed.err();
  dom = testing::DumpDom(*closed_url + "/ui", kPageBudget, tmp_ / "p4");
  ASSERT_EQ(dom.exit_code, 0) << dom.err;
  EXPECT_THAT(dom.out, HasSubstr("needs the fleet's bearer token"));
  EXPECT_EQ(Count(dom.out, "<tr data-url=\""), 0u);
  dom = testing::DumpDom(*closed_url + "/ui#token=dashboard-token", kPageBudget, tmp_ / "p5");
  ASSERT_EQ(dom.exit_code, 0) << dom.err;
  EXPECT_EQ(Count(dom.out, "<tr data-url=\""), 2u) << dom.out;
}

}  // namespace
}  // namespace stitch

// The vLLM adapter end to end: a real `stitch engine --api vllm` (the
// reference engine speaking vLLM's routes and bodies) and a `stitch sidecar
// --engine vllm` in front of it, over a filesystem store: the sidecar
// stages versions itself, commits through vLLM's pause, reload, version and
// resume routes, and stamps vLLM's OpenAI responses and streams.
#include <signal.h>

#include <chrono>
#include <filesystem>
#include <future>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <boost/json/object.hpp>
#include <boost/json/parse.hpp>
#include <boost/json/serialize.hpp>

#include "absl/strings/str_cat.h"
#include "stitch/api/request.h"
#include "stitch/api/server_info.h"
#include "stitch/core/state.h"
#include "stitch/core/version.h"
#include "stitch/net/client.h"
#include "stitch/net/event_loop.h"
#include "stitch/net/net_test_util.h"
#include "stitch/net/sse.h"
#include "tests/replica_steps.h"
#include "tests/sidecar_process.h"
#include "tests/support/cli_expect.h"
#include "tests/support/json_object.h"
#include "tests/support/subprocess.h"
#include "tests/support/temp_dir.h"

namespace stitch {
namespace {

namespace json = boost::json;
using ::stitch::testing::Eventually;
using ::stitch::testing::ExpectOk;
using ::stitch::testing::RunStitch;
using ::stitch::testing::ServerProcess;
using ::stitch::testing::TempDir;
using ::testing::HasSubstr;

constexpr auto kStartTimeout = std::chrono::seconds(60);
constexpr auto kConverge = std::chrono::seconds(60);

using testing::ParseObject;

absl::StatusOr<HttpResponse> Fetch(const std::string& method, const std::string& url,
                                   std::string body = {}) {
  FetchOptions options;
  options.timeout = std::chrono::seconds(60);
  return HttpFetch(method, url, std::move(body), options);
}

// A greedy /v1/completions body of `tokens` tokens, with `extra` fields
// (",\"k\":v" form) appended.
std::string CompletionBody(int tokens, const std::string& extra = "") {
  return absl::StrCat(R"({"prompt":"The policy","max_tokens":)", tokens,
                      R"(,"temperature":0,"ignore_eos":true)", extra, "}");
}

class VllmIntegrationTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_FALSE(testing::StitchBinary().empty()) << "STITCH_BIN is not set";
    store_ = (tmp_ / "store").string();
    base_ = (tmp_ / "base").string();
    std::filesystem::create_directories(tmp_ / "out");
    InitModel(base_, 1);
  }

  void InitModel(const std::string& dir, int seed) { testing::InitTinyModel(dir, seed); }

  // Whether the engine is labelled before the sidecar meets it.
  enum class BootLabel { kNone, kBootVersion };

  void StartFleet(const std::vector<std::string>& sidecar_flags = {},
                  const std::vector<std::string>& engine_flags = {},
                  BootLabel label = BootLabel::kNone) {
    ExpectOk(RunStitch({"claim", "--store", store_, "--run-id", "r1", "--boot-version", "0"}),
             "claim");
    std::vector<std::string> engine = {
        testing::StitchBinary(), "engine", "--api", "vllm", "--model", base_, "--port", "0"};
    engine.insert(engine.end(), engine_flags.begin(), engine_flags.end());
    engine_ = std::make_unique<ServerProcess>(engine);
    ASSERT_TRUE(engine_->started());
    auto engine_url = engine_->WaitForUrl(kStartTimeout);
    ASSERT_TRUE(engine_url.has_value()) << "engine did not start:\n" << engine_->err();
    engine_url_ = *engine_url;
    if (label == BootLabel::kBootVersion) {
      // As an operator would after starting vLLM on the boot checkpoint: the
      // sidecar then verifies the label instead of reloading.
      auto r = Fetch("POST", engine_url_ + "/update_weight_version",
                     R"({"new_version":"r1/weight_v000000"})");
      ASSERT_TRUE(r.ok() && r->status == 200) << (r.ok() ? r->body : r.status().ToString());
    }
    std::vector<std::string> args = {testing::StitchBinary(),
                                     "sidecar",
                                     "--store",
                                     store_,
                                     "--run-id",
                                     "r1",
                                     "--engine",
                                     "vllm",
                                     "--engine-url",
                                     engine_url_,
                                     "--base-checkpoint",
                                     base_,
                                     "--local-checkpoint",
                                     (tmp_ / "local").string(),
                                     "--reconcile-interval",
                                     "0.2",
                                     "--watchdog-interval",
                                     "0.5",
                                     "--port",
                                     "0"};
    args.insert(args.end(), sidecar_flags.begin(), sidecar_flags.end());
    sidecar_ = std::make_unique<ServerProcess>(args);
    ASSERT_TRUE(sidecar_->started());
    auto url = sidecar_->WaitForUrl(kStartTimeout);
    ASSERT_TRUE(url.has_value()) << "sidecar did not start:\n" << sidecar_->err();
    url_ = *url;
  }

  bool ServesVersion(int64_t version) {
    return testing::ServesVersionOfR1(url_, version, kConverge);
  }

  void PublishFull(int64_t version, const std::string& checkpoint) {
    Run().PublishFull(version, checkpoint);
  }
  testing::RunOfR1 Run() const { return {store_, tmp_ / "out"}; }
  void PublishDelta(int64_t version, const std::string& base, const std::string& target) {
    Run().PublishDelta(version, base, target);
  }

  struct Completion {
    int status = 0;
    std::string text;
    int64_t start = -1;
    int64_t end = -1;
    std::string body;
  };
  Completion Complete(const std::string& url, const std::string& constraint) {
    std::string extra;
    if (!constraint.empty()) extra = R"(,"weight_version":)" + constraint;
    auto r = Fetch("POST", url + "/v1/completions", CompletionBody(8, extra));
    Completion c;
    if (!r.ok()) {
      c.body = std::string(r.status().message());
      return c;
    }
    c.status = r->status;
    c.body = r->body;
    if (r->status != 200) return c;
    json::object o = ParseObject(r->body);
    c.text = json::serialize(o.at("choices").as_array().at(0).as_object().at("text"));
    if (o.contains("weight_version_start")) c.start = o.at("weight_version_start").as_int64();
    if (o.contains("weight_version_end")) c.end = o.at("weight_version_end").as_int64();
    return c;
  }

  // The same completion from a fresh vLLM-dialect engine serving
  // `checkpoint` directly.
  std::string ReferenceText(const std::string& checkpoint) {
    ServerProcess reference(
        {testing::StitchBinary(), "engine", "--api", "vllm", "--model", checkpoint, "--port", "0"});
    auto url = reference.WaitForUrl(kStartTimeout);
    EXPECT_TRUE(url.has_value()) << reference.err();
    if (!url.has_value()) return "";
    Completion c = Complete(*url, "");
    EXPECT_EQ(c.status, 200) << c.body;
    return c.text;
  }

  void FollowsFullAndDeltaVersions(const std::vector<std::string>& sidecar_flags) {
    InitModel((tmp_ / "ckpt1").string(), 2);
    InitModel((tmp_ / "ckpt2").string(), 3);
    StartFleet(sidecar_flags);
    ASSERT_TRUE(ServesVersion(0)) << sidecar_->err();
    Completion boot = Complete(url_, R"({"exact_version":0})");
    ASSERT_EQ(boot.status, 200) << boot.body;
    EXPECT_EQ(boot.start, 0);
    EXPECT_EQ(boot.end, 0);

    PublishFull(1, (tmp_ / "ckpt1").string());
    ASSERT_TRUE(ServesVersion(1)) << sidecar_->err();
    Completion v1 = Complete(url_, R"({"exact_version":1})");
    ASSERT_EQ(v1.status, 200) << v1.body;
    EXPECT_EQ(v1.end, 1);

    PublishDelta(2, (tmp_ / "ckpt1").string(), (tmp_ / "ckpt2").string());
    ASSERT_TRUE(ServesVersion(2)) << sidecar_->err();
    Completion v2 = Complete(url_, R"({"min_version":2})");
    ASSERT_EQ(v2.status, 200) << v2.body;
    EXPECT_EQ(v2.start, 2);
    EXPECT_EQ(v2.end, 2);
    EXPECT_EQ(v2.text, ReferenceText((tmp_ / "ckpt2").string()));
    EXPECT_NE(v2.text, v1.text);
    EXPECT_NE(v1.text, boot.text);

    // vLLM itself says what it holds: the label the sidecar set.
    auto info = Fetch("GET", engine_url_ + "/weight_info");
    ASSERT_TRUE(info.ok()) << info.status();
    EXPECT_EQ(ParseObject(info->body).at("weight_version").as_string(), "r1/weight_v000002");
  }

  TempDir tmp_;
  std::string store_;
  std::string base_;
  std::string engine_url_;
  std::string url_;
  std::unique_ptr<ServerProcess> engine_;
  std::unique_ptr<ServerProcess> sidecar_;
};

TEST_F(VllmIntegrationTest, InPlaceCommitsFollowFullAndDeltaVersionsStagedByTheSidecar) {
  FollowsFullAndDeltaVersions({"--commit-mode", "in_place"});
}

TEST_F(VllmIntegrationTest, QuiesceCommitsFollowFullAndDeltaVersionsStagedByTheSidecar) {
  FollowsFullAndDeltaVersions({"--commit-mode", "quiesce"});
}

TEST_F(VllmIntegrationTest, StreamedCompletionsAndChatEventsAreEachStamped) {
  StartFleet();
  ASSERT_TRUE(ServesVersion(0)) << sidecar_->err();
  EventLoop loop;
  HttpClient client(loop.executor());
  auto url = ParseHttpUrl(url_);
  ASSERT_TRUE(url.ok());
  const std::vector<std::pair<std::string, std::string>> requests = {
      {"/v1/completions",
       R"({"prompt":"stream me","stream":true,"max_tokens":6,"temperature":0,"weight_version":{"min_version":0}})"},
      {"/v1/chat/completions",
       R"({"messages":[{"role":"user","content":"hi"}],"stream":true,"max_tokens":6,"temperature":0,"weight_version":{"min_version":0}})"},
  };
  for (const auto& [path, body] : requests) {
    HttpRequest request;
    request.method = "POST";
    request.target = path;
    request.headers.Set("Content-Type", "application/json");
    request.body = body;
    auto stream = loop.BlockOn(client.SendStreamed(url->origin, request));
    ASSERT_TRUE(stream.ok()) << stream.status();
    ASSERT_EQ(stream->status(), 200) << path;
    SseEventSplitter splitter;
    int stamped = 0;
    bool done = false;
    for (;;) {
      auto chunk = loop.BlockOn(stream->Read());
      ASSERT_TRUE(chunk.ok()) << chunk.status();
      if (chunk->empty()) break;
      splitter.Append(*chunk);
      while (auto event = splitter.Next()) {
        std::optional<std::string> data = SseData(*event);
        ASSERT_TRUE(data.has_value()) << *event;
        if (*data == "[DONE]") {
          done = true;
          continue;
        }
        json::object o = ParseObject(*data);
        EXPECT_EQ(o.at("weight_version_start").as_int64(), 0) << *data;
        EXPECT_EQ(o.at("weight_version_end").as_int64(), 0) << *data;
        ++stamped;
      }
    }
    EXPECT_TRUE(done) << path;
    EXPECT_GE(stamped, 2) << path;
  }
}

TEST_F(VllmIntegrationTest, VllmControlRoutesAreBlockedWith403) {
  StartFleet();
  ASSERT_TRUE(ServesVersion(0)) << sidecar_->err();
  for (std::string path :
       {"/pause?mode=abort", "/resume", "/collective_rpc", "/update_weight_version",
        "/abort_requests", "/reset_prefix_cache", "/sleep", "/wake_up"}) {
    auto r = Fetch("POST", url_ + path, "{}");
    ASSERT_TRUE(r.ok()) << r.status();
    EXPECT_EQ(r->status, 403) << path;
  }
  // Nothing reached the engine: it is not paused and still generates.
  auto paused = Fetch("GET", engine_url_ + "/is_paused");
  ASSERT_TRUE(paused.ok());
  EXPECT_FALSE(ParseObject(paused->body).at("is_paused").as_bool());
  EXPECT_EQ(Complete(url_, "").status, 200);
}

TEST_F(VllmIntegrationTest, TheClientsRequestIdAndCacheSaltSurviveTheVersionTag) {
  StartFleet();
  ASSERT_TRUE(ServesVersion(0)) << sidecar_->err();
  auto r = Fetch("POST", url_ + "/v1/completions",
                 CompletionBody(4, R"(,"request_id":"job-7","cache_salt":"tenant-a")"));
  ASSERT_TRUE(r.ok()) << r.status();
  ASSERT_EQ(r->status, 200) << r->body;
  // vLLM names the response after the request id: the client's own again.
  EXPECT_EQ(ParseObject(r->body).at("id").as_string(), "cmpl-job-7");
  // The salt that reached vLLM isolated the version and kept the tenant's:
  // the engine's metrics count what it saw.
  auto served = Fetch("GET", engine_url_ + "/metrics");
  ASSERT_TRUE(served.ok());
  EXPECT_THAT(served->body, HasSubstr("stitch_engine_last_cache_salt{cache_salt=\"" +
                                      CacheIsolationPrefix({"r1", 0}) + "tenant-a\"} 1"));
}

// vLLM aborts by exact request id: the client whose id is a prefix of
// another's ("job-1", "job-12") leaves, and only its generation ends.
TEST_F(VllmIntegrationTest, AClientThatLeavesAbortsOnlyItsOwnGeneration) {
  StartFleet();
  ASSERT_TRUE(ServesVersion(0)) << sidecar_->err();
  // Requests wait in the engine's queue while it is paused, so both are in
  // flight when the first client leaves.
  auto paused = Fetch("POST", engine_url_ + "/pause?mode=keep");
  ASSERT_TRUE(paused.ok() && paused->status == 200);
  auto waiting = [&]() -> int64_t {
    auto metrics = Fetch("GET", engine_url_ + "/metrics");
    if (!metrics.ok()) return -1;
    const std::string key = "vllm:num_requests_waiting{";
    size_t at = metrics->body.find(key);
    if (at == std::string::npos) return -1;
    at = metrics->body.find("} ", at);
    return std::stoll(metrics->body.substr(at + 2));
  };
  auto kept = std::async(std::launch::async, [&] {
    return Fetch("POST", url_ + "/v1/completions", CompletionBody(12, R"(,"request_id":"job-12")"));
  });
  ASSERT_TRUE(Eventually([&] { return waiting() == 1; }, kConverge));
  auto url = ParseHttpUrl(url_);
  ASSERT_TRUE(url.ok());
  {
    testing::RawSocket leaving(url->origin.port);
    ASSERT_TRUE(leaving.connected());
    const std::string request = CompletionBody(12, R"(,"request_id":"job-1")");
    leaving.Send(absl::StrCat(
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        "Content-Length: ",
        request.size(), "\r\n\r\n", request));
    ASSERT_TRUE(Eventually([&] { return waiting() == 2; }, kConverge));
  }
  ASSERT_TRUE(Eventually([&] { return waiting() == 1; }, kConverge));
  auto resumed = Fetch("POST", engine_url_ + "/resume");
  ASSERT_TRUE(resumed.ok() && resumed->status == 200);
  auto answer = kept.get();
  ASSERT_TRUE(answer.ok()) << answer.status();
  ASSERT_EQ(answer->status, 200) << answer->body;
  json::object o = ParseObject(answer->body);
  EXPECT_EQ(o.at("id").as_string(), "cmpl-job-12");
  EXPECT_EQ(o.at("choices").at(0).at("finish_reason").as_string(), "length") << answer->body;
  EXPECT_EQ(o.at("usage").at("completion_tokens").as_int64(), 12);
}

TEST_F(VllmIntegrationTest, AReloadThatFailsEndsTheSidecarNonZero) {
  InitModel((tmp_ / "ckpt1").string(), 2);
  StartFleet({}, {"--fail-commits", "1"}, BootLabel::kBootVersion);
  ASSERT_TRUE(ServesVersion(0)) << sidecar_->err();
  PublishFull(1, (tmp_ / "ckpt1").string());
  std::optional<int> exit = sidecar_->WaitForExit(std::chrono::seconds(60));
  ASSERT_TRUE(exit.has_value()) << sidecar_->err();
  EXPECT_EQ(*exit, 3);
  EXPECT_THAT(sidecar_->err(), HasSubstr("weight commit of r1/weight_v000001 failed"));
  EXPECT_THAT(sidecar_->err(), HasSubstr("/collective_rpc"));
}

TEST_F(VllmIntegrationTest, AnEngineThatNeverComesBackEndsTheSidecarNonZero) {
  StartFleet({"--engine-restart-grace", "2"});
  ASSERT_TRUE(ServesVersion(0)) << sidecar_->err();
  engine_->Signal(SIGKILL);
  ASSERT_TRUE(engine_->WaitForExit(std::chrono::seconds(30)).has_value());
  auto r = Fetch("POST", url_ + "/v1/completions", CompletionBody(2));
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->status, 503) << r->body;
  std::optional<int> exit = sidecar_->WaitForExit(std::chrono::seconds(30));
  ASSERT_TRUE(exit.has_value()) << sidecar_->err();
  EXPECT_EQ(*exit, 3) << sidecar_->err();
}

}  // namespace
}  // namespace stitch

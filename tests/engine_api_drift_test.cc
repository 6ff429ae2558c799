// The engines' APIs against lists taken from their own source
// (tests/data/engine_api/*.txt, which say where each fact comes from): the
// reference engine's dialects must answer every listed call with the listed
// status and fields, the sidecar must block every listed control route, and
// each adapter may call only listed routes. A drift in either direction is a
// failing test here, not a surprise against the real engine.
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <memory>
#include <set>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <boost/json/parse.hpp>
#include <boost/json/serialize.hpp>
#include <boost/json/value.hpp>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "stitch/api/routes.h"
#include "stitch/core/errors.h"
#include "stitch/engine/sglang_engine.h"
#include "stitch/engine/vllm_engine.h"
#include "stitch/net/client.h"
#include "stitch/net/http.h"
#include "stitch/refengine/engine_test_util.h"
#include "stitch/refengine/server.h"
#include "tests/support/temp_dir.h"

namespace stitch {
namespace {

namespace json = boost::json;
using ::stitch::testing::TempDir;

std::filesystem::path DataDir() {
  const char* dir = std::getenv("STITCH_SOURCE_DIR");
  return std::filesystem::path(dir == nullptr ? STITCH_SOURCE_DIR_DEFAULT : dir) / "tests" /
         "data" / "engine_api";
}

struct Call {
  int line = 0;
  std::string method;
  std::string target;
  std::string body;
  int status = 0;
  std::vector<std::string> fields;  // "path" or "path=value"
};

struct ApiList {
  std::vector<std::string> sources;
  std::vector<Call> calls;
  std::set<std::string> relies;  // "METHOD /path"
  std::vector<std::string> blocked;
};

// Reads one list; a malformed line fails the test that reads it.
ApiList ReadList(const std::string& name) {
  ApiList list;
  std::ifstream in(DataDir() / name);
  EXPECT_TRUE(in.good()) << "cannot read " << (DataDir() / name);
  std::string text;
  int n = 0;
  while (std::getline(in, text)) {
    ++n;
    if (text.empty() || text[0] == '#') continue;
    std::vector<std::string> words = absl::StrSplit(text, ' ', absl::SkipEmpty());
    const std::string& kind = words[0];
    if (kind == "source") {
      list.sources.push_back(text);
    } else if (kind == "relies" && words.size() == 3) {
      list.relies.insert(absl::StrCat(words[1], " ", words[2]));
    } else if (kind == "blocked" && words.size() == 2) {
      list.blocked.push_back(words[1]);
    } else if (kind == "call" && words.size() >= 6 && words[4] == "->") {
      Call c;
      c.line = n;
      c.method = words[1];
      c.target = words[2];
      c.body = words[3] == "-" ? "" : words[3];
      EXPECT_TRUE(absl::SimpleAtoi(words[5], &c.status)) << name << ":" << n;
      c.fields.assign(words.begin() + 6, words.end());
      list.calls.push_back(std::move(c));
    } else {
      ADD_FAILURE() << name << ":" << n << ": cannot read \"" << text << "\"";
    }
  }
  return list;
}

// The value at a dotted path of `doc`, or nullptr.
const json::value* Find(const json::value& doc, std::string_view path) {
  const json::value* v = &doc;
  for (absl::string_view part : absl::StrSplit(AbslView(path), '.')) {
    size_t index = 0;
    if (v->is_array() && absl::SimpleAtoi(part, &index)) {
      if (index >= v->get_array().size()) return nullptr;
      v = &v->get_array()[index];
    } else if (v->is_object()) {
      v = v->get_object().if_contains(json::string_view(part.data(), part.size()));
      if (v == nullptr) return nullptr;
    } else {
      return nullptr;
    }
  }
  return v;
}

// What `field` ("path" or "path=value") finds wrong with `doc`; "" when
// nothing.
std::string CheckField(const json::value& doc, const std::string& field) {
  const size_t eq = field.find('=');
  const std::string path = field.substr(0, eq);
  const json::value* v = Find(doc, path);
  if (v == nullptr) return absl::StrCat("no ", path);
  if (eq == std::string::npos) return "";
  const std::string want = field.substr(eq + 1);
  std::string got = v->is_string() ? std::string(v->get_string()) : json::serialize(*v);
  if (got != want) return absl::StrCat(path, " is ", got, ", not ", want);
  return "";
}

class EngineApiDriftTest : public ::testing::Test {
 protected:
  void Start(EngineApi api) {
    const ModelConfig config = testing::EngineTestConfig();
    model_ = tmp_ / "model";
    ASSERT_TRUE(testing::WriteModel(model_, config, testing::EngineTestTensors(config, 1)).ok());
    EngineOptions options;
    options.model_dir = model_;
    options.run_id = "r1";
    options.api = api;
    auto server = EngineServer::Start(options);
    ASSERT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
  }

  // Runs every call of `list` against the engine, in order.
  void ExpectCallsAnswer(const ApiList& list, const std::string& name) {
    for (const Call& c : list.calls) {
      const std::string where = absl::StrCat(name, ":", c.line, " ", c.method, " ", c.target);
      const std::string body = absl::StrReplaceAll(c.body, {{"$MODEL", model_.string()}});
      FetchOptions options;
      options.timeout = std::chrono::seconds(30);
      auto r = HttpFetch(c.method, server_->url() + c.target, body, options);
      ASSERT_TRUE(r.ok()) << where << ": " << r.status();
      EXPECT_EQ(r->status, c.status) << where << ": " << r->body;
      if (c.fields.empty()) continue;
      boost::system::error_code ec;
      json::value doc = json::parse(r->body, ec);
      ASSERT_FALSE(ec) << where << ": not JSON: " << r->body;
      for (const std::string& field : c.fields) {
        EXPECT_EQ(CheckField(doc, field), "") << where << ": " << r->body;
      }
    }
  }

  void ExpectBlocked(const ApiList& list, const std::string& name) {
    EXPECT_FALSE(list.blocked.empty()) << name;
    for (const std::string& path : list.blocked) {
      EXPECT_EQ(ClassifyRoute(path).kind, RouteClass::kBlocked) << name << ": " << path;
    }
  }

  TempDir tmp_;
  std::filesystem::path model_;
  std::unique_ptr<EngineServer> server_;
};

TEST_F(EngineApiDriftTest, EveryListNamesItsSources) {
  for (const std::string name : {"vllm.txt", "sglang.txt"}) {
    const ApiList list = ReadList(name);
    EXPECT_FALSE(list.sources.empty()) << name;
    EXPECT_FALSE(list.calls.empty()) << name;
  }
}

TEST_F(EngineApiDriftTest, TheVllmDialectAnswersLikeVllm) {
  Start(EngineApi::kVllm);
  ExpectCallsAnswer(ReadList("vllm.txt"), "vllm.txt");
}

TEST_F(EngineApiDriftTest, TheSglangDialectAnswersLikeSglangAndTheFork) {
  Start(EngineApi::kSglang);
  ExpectCallsAnswer(ReadList("sglang.txt"), "sglang.txt");
}

TEST_F(EngineApiDriftTest, TheVllmAdapterCallsOnlyVllmRoutes) {
  const ApiList list = ReadList("vllm.txt");
  for (std::string_view route : kVllmEngineRoutes) {
    EXPECT_TRUE(list.relies.contains(std::string(route))) << route;
  }
  EXPECT_EQ(list.relies.size(), std::size(kVllmEngineRoutes));
}

TEST_F(EngineApiDriftTest, TheSglangAdaptersCallOnlySglangRoutes) {
  const ApiList list = ReadList("sglang.txt");
  for (std::string_view route : kSglangEngineRoutes) {
    EXPECT_TRUE(list.relies.contains(std::string(route))) << route;
  }
  EXPECT_EQ(list.relies.size(), std::size(kSglangEngineRoutes));
}

TEST_F(EngineApiDriftTest, TheSidecarBlocksEveryListedControlRoute) {
  ExpectBlocked(ReadList("vllm.txt"), "vllm.txt");
  ExpectBlocked(ReadList("sglang.txt"), "sglang.txt");
}

// The lists are not vacuous: a route the engine does not serve, a field it
// does not send and a route the sidecar forwards are each caught.
TEST_F(EngineApiDriftTest, ADriftIsCaught) {
  const json::value doc = json::parse(R"({"error":{"code":400},"choices":[{"text":"x"}]})");
  EXPECT_EQ(CheckField(doc, "choices.0.text=x"), "");
  EXPECT_NE(CheckField(doc, "choices.0.stop_reason"), "");
  EXPECT_NE(CheckField(doc, "error.code=404"), "");
  EXPECT_NE(ClassifyRoute("/v1/completions").kind, RouteClass::kBlocked);
  Start(EngineApi::kVllm);
  auto r = HttpFetch("POST", server_->url() + "/pause_generation", "{}");
  ASSERT_TRUE(r.ok());
  EXPECT_EQ(r->status, 404) << "the vLLM dialect must not serve SGLang's routes";
}

}  // namespace
}  // namespace stitch

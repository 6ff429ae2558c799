#include "stitch/api/answers.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>
#include <boost/json/object.hpp>
#include <boost/json/parse.hpp>

namespace stitch {
namespace {

namespace json = boost::json;
using ::testing::HasSubstr;

json::object Parse(const std::string& text) { return json::parse(text).as_object(); }

TEST(AnswersTest, NotReadyNamesTheTargetAndWhatIsServed) {
  VersionConstraint exact;
  exact.exact_version = 7;
  const json::object body =
      Parse(NotReadyBody(exact, VersionRef{"run-a", 6}, "not yet; retry later"));
  EXPECT_EQ(body.at("type").as_string(), "WeightVersionNotReady");
  EXPECT_EQ(body.at("target_version").as_int64(), 7);
  // The original's key keeps its type (the served version's number); the
  // identity rides beside it.
  EXPECT_EQ(body.at("applied").as_int64(), 6);
  EXPECT_EQ(body.at("applied_identity").as_string(), "run-a/weight_v000006");
  EXPECT_EQ(body.at("message").as_string(), "not yet; retry later");

  const HttpResponse unverified = NotReadyResponse(VersionConstraint{}, std::nullopt, "m");
  EXPECT_EQ(unverified.status, 409);
  const json::object none = Parse(unverified.body);
  EXPECT_TRUE(none.at("target_version").is_null());
  EXPECT_TRUE(none.at("applied").is_null());
  EXPECT_TRUE(none.at("applied_identity").is_null());
}

TEST(AnswersTest, TheServedVersionIsReadBackFromA409) {
  VersionConstraint min;
  min.min_version = 3;
  EXPECT_EQ(NotReadyApplied(NotReadyBody(min, VersionRef{"r", 2}, "m")), (VersionRef{"r", 2}));
  EXPECT_EQ(NotReadyApplied(NotReadyBody(min, std::nullopt, "m")), std::nullopt);
  EXPECT_EQ(NotReadyApplied(R"({"applied": "garbage"})"), std::nullopt);
  // The original's 409 names the number only: no run.
  EXPECT_EQ(NotReadyApplied(R"({"type": "WeightVersionNotReady", "applied": 4})"),
            (VersionRef{"", 4}));
  EXPECT_EQ(NotReadyApplied("not json"), std::nullopt);
}

TEST(AnswersTest, RefusalsSayWhatIsWrong) {
  const HttpResponse blocked = RouteBlockedResponse("/flush_cache", "never forwarded");
  EXPECT_EQ(blocked.status, 403);
  // Nested, as the original answers.
  EXPECT_EQ(Parse(blocked.body).at("error").at("type").as_string(), "RouteBlocked");
  EXPECT_EQ(Parse(blocked.body).at("error").at("message").as_string(),
            "/flush_cache is an engine control route: never forwarded");
  const HttpResponse bad = BadRequestResponse("rid must be a string");
  EXPECT_EQ(bad.status, 400);
  EXPECT_EQ(Parse(bad.body).at("error").at("type").as_string(), "BadRequest");
}

TEST(AnswersTest, UnavailableIsARetryable503WithRetryAfter) {
  for (auto [kind, type] : {std::pair{Unavailable::kEngine, "EngineUnavailable"},
                            std::pair{Unavailable::kReplica, "ReplicaUnavailable"},
                            std::pair{Unavailable::kNoReadyReplica, "NoReadyReplica"}}) {
    const HttpResponse r = UnavailableResponse(kind, "gone; retry");
    EXPECT_EQ(r.status, 503);
    EXPECT_EQ(r.headers.Get("Retry-After"), "1");
    const json::object body = Parse(r.body).at("error").as_object();
    EXPECT_EQ(body.at("type").as_string(), type);
    EXPECT_EQ(body.at("message").as_string(), "gone; retry");
    EXPECT_TRUE(body.at("retryable").as_bool());
    EXPECT_THAT(UnavailableEvent(kind, "gone"), HasSubstr(type));
  }
  EXPECT_EQ(UnavailableEvent(Unavailable::kEngine, "x").rfind("data: {", 0), 0u);
  EXPECT_TRUE(UnavailableEvent(Unavailable::kEngine, "x").ends_with("}\n\n"));
}

}  // namespace
}  // namespace stitch

#include "stitch/api/response.h"

#include <string>

#include <gtest/gtest.h>
#include <boost/json/object.hpp>
#include <boost/json/parse.hpp>
#include <boost/json/serialize.hpp>

namespace stitch {
namespace {

namespace json = boost::json;

json::object Parse(const std::string& text) {
  boost::system::error_code ec;
  json::value v = json::parse(text, ec);
  EXPECT_FALSE(ec) << text;
  return v.is_object() ? v.get_object() : json::object();
}

TEST(StampingTest, GenerateIsStampedInsideMetaInfo) {
  json::object body = Parse(R"({"text":"x","meta_info":{"id":"a","weight_version":"9"}})");
  StampResponse(ApiRoute::kGenerate, body, VersionStamp{4, 5});
  const json::object& meta = body.at("meta_info").as_object();
  EXPECT_EQ(meta.at("weight_version_start").as_int64(), 4);
  EXPECT_EQ(meta.at("weight_version_end").as_int64(), 5);
  // The version the generation started on, as the original reports it.
  EXPECT_EQ(meta.at("weight_version").as_string(), "4");
  EXPECT_EQ(meta.at("id").as_string(), "a");
  EXPECT_FALSE(body.contains("weight_version_start"));

  json::object no_meta = Parse(R"({"text":"x"})");
  StampResponse(ApiRoute::kGenerate, no_meta, VersionStamp{2, 2});
  EXPECT_EQ(no_meta.at("meta_info").at("weight_version_end").as_int64(), 2);
}

TEST(StampingTest, OpenAiRoutesAreStampedAtTheTopLevel) {
  json::object body = Parse(R"({"id":"cmpl","choices":[]})");
  StampResponse(ApiRoute::kChatCompletions, body, VersionStamp{7, 8});
  EXPECT_EQ(body.at("weight_version_start").as_int64(), 7);
  EXPECT_EQ(body.at("weight_version_end").as_int64(), 8);
  EXPECT_FALSE(body.contains("meta_info"));
}

TEST(StampingTest, TheStampedEndVersionIsReadBack) {
  for (ApiRoute route : {ApiRoute::kGenerate, ApiRoute::kCompletions}) {
    json::object body = Parse(R"({"text":"x","meta_info":{"id":"a"}})");
    StampResponse(route, body, VersionStamp{3, 6});
    EXPECT_EQ(StampedEndVersion(json::serialize(body)), 6);
  }
  // A batch: the first document's.
  EXPECT_EQ(StampedEndVersion(R"([{"meta_info":{"weight_version_end":2}},{}])"), 2);
  // Nothing stamped, or not a stamp.
  EXPECT_EQ(StampedEndVersion(R"({"text":"x","meta_info":{}})"), std::nullopt);
  EXPECT_EQ(StampedEndVersion(R"({"weight_version_end":"2"})"), std::nullopt);
  EXPECT_EQ(StampedEndVersion("[]"), std::nullopt);
  EXPECT_EQ(StampedEndVersion("not json"), std::nullopt);
}

TEST(ResponseLabelTest, ResponseLabelsAreReadWhereEachRoutePutsThem) {
  auto label = [](std::string_view text) {
    boost::system::error_code ec;
    json::value v = json::parse(text, ec);
    EXPECT_FALSE(ec);
    return ResponseWeightLabel(v);
  };
  EXPECT_EQ(label(R"({"meta_info": {"weight_version": "5"}})"), "5");
  EXPECT_EQ(label(R"([{"meta_info": {"weight_version": "r/weight_v000005"}}, {}])"),
            "r/weight_v000005");
  EXPECT_EQ(label(R"({"choices": [], "metadata": {"weight_version": "5"}})"), "5");
  EXPECT_EQ(label(R"({"meta_info": {"weight_version": 5}})"), "5");
  EXPECT_EQ(label(R"({"meta_info": {"weight_version": null}})"), "");
  EXPECT_EQ(label(R"({"choices": []})"), std::nullopt);
  EXPECT_EQ(label(R"({"meta_info": {}})"), std::nullopt);
}

TEST(RestoreRidTest, TheClientsOwnIdComesBackWhereTheEnginesWas) {
  json::object generate = Parse(R"({"meta_info":{"id":"stitch-1-mine"}})");
  RestoreRid(ApiRoute::kGenerate, generate, "stitch-1-mine", "mine");
  EXPECT_EQ(generate.at("meta_info").at("id").as_string(), "mine");

  json::object chat = Parse(R"({"id":"chatcmpl-stitch-1-mine"})");
  RestoreRid(ApiRoute::kChatCompletions, chat, "stitch-1-mine", "mine");
  EXPECT_EQ(chat.at("id").as_string(), "chatcmpl-mine");

  json::object other = Parse(R"({"meta_info":{"id":"someone-else"}})");
  RestoreRid(ApiRoute::kGenerate, other, "stitch-1-mine", "mine");
  EXPECT_EQ(other.at("meta_info").at("id").as_string(), "someone-else");
}

}  // namespace
}  // namespace stitch

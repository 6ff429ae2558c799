#include "stitch/refengine/protocol.h"

#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/strings/str_cat.h"
#include "stitch/core/errors.h"
#include "stitch/refengine/engine_test_util.h"
#include "stitch/refengine/tokenizer.h"

namespace stitch {
namespace {

using ::stitch::testing::EngineTestConfig;
using ::stitch::testing::JsonGet;
using ::stitch::testing::JsonInts;
using ::stitch::testing::JsonNumbers;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::SizeIs;

absl::StatusOr<ApiRequest> Parse(ApiRoute route, std::string_view body) {
  return ParseApiRequest(route, body, EngineTestConfig());
}

// The message of a refused /generate body.
std::string Refusal(std::string_view body, ApiRoute route = ApiRoute::kGenerate) {
  absl::StatusOr<ApiRequest> r = Parse(route, body);
  EXPECT_FALSE(r.ok()) << body;
  if (r.ok()) return "";
  EXPECT_TRUE(absl::IsInvalidArgument(r.status())) << r.status();
  return std::string(r.status().message());
}

TEST(ProtocolTest, ParsesAGenerateRequest) {
  absl::StatusOr<ApiRequest> r = Parse(ApiRoute::kGenerate, R"({
    "text": "hi", "rid": "abc", "extra_key": "v7", "stream": true, "return_logprob": true,
    "sampling_params": {"max_new_tokens": 9, "temperature": 0, "top_p": 0.5, "top_k": 3,
      "stop": ["x", "yz"], "stop_token_ids": [10], "ignore_eos": true, "seed": 42,
      "no_stop_trim": true, "skip_special_tokens": true, "presence_penalty": 0,
      "repetition_penalty": 1.0, "n": 1, "regex": null}})");
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->generation.prompt, EncodeText("hi", BosMode::kPrepend));
  EXPECT_EQ(r->generation.rid, "abc");
  EXPECT_EQ(r->generation.extra_key, "v7");
  EXPECT_TRUE(r->stream);
  EXPECT_TRUE(r->return_logprob);
  EXPECT_EQ(r->generation.max_new_tokens, 9);
  EXPECT_EQ(r->generation.sampling.temperature, 0.0f);
  EXPECT_EQ(r->generation.sampling.top_p, 0.5f);
  EXPECT_EQ(r->generation.sampling.top_k, 3);
  EXPECT_THAT(r->generation.stop, ElementsAre("x", "yz"));
  EXPECT_THAT(r->generation.stop_token_ids, ElementsAre(10));
  EXPECT_TRUE(r->generation.ignore_eos);
  EXPECT_TRUE(r->generation.keep_stop_string);
  EXPECT_EQ(r->seed, 42u);

  absl::StatusOr<ApiRequest> ids = Parse(ApiRoute::kGenerate, R"({"input_ids": [1, 2, 3]})");
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_THAT(ids->generation.prompt, ElementsAre(1, 2, 3));
  EXPECT_EQ(ids->generation.max_new_tokens, 128);
  EXPECT_FALSE(ids->seed.has_value());
}

TEST(ProtocolTest, RefusesBadGenerateBodiesWithAClearMessage) {
  EXPECT_THAT(Refusal("{not json"), HasSubstr("not valid JSON"));
  EXPECT_THAT(Refusal("[1, 2]"), HasSubstr("must be a JSON object"));
  EXPECT_THAT(Refusal(R"({"sampling_params": {}})"), HasSubstr("\"text\" or \"input_ids\""));
  EXPECT_THAT(Refusal(R"({"text": "a", "input_ids": [1]})"), HasSubstr("not both"));
  EXPECT_THAT(Refusal(R"({"text": 5})"), HasSubstr("field \"text\" must be a string, got integer"));
  EXPECT_THAT(Refusal(R"({"text": ["a", "b"]})"), HasSubstr("batched"));
  EXPECT_THAT(Refusal(R"({"input_ids": [[1], [2]]})"), HasSubstr("batched"));
  EXPECT_THAT(Refusal(R"({"input_ids": [1, 300]})"), HasSubstr("[0, 258)"));
  EXPECT_THAT(Refusal(R"({"text": "a", "stream": "yes"})"),
              HasSubstr("field \"stream\" must be true or false"));
  EXPECT_THAT(Refusal(R"({"text": "a", "rid": 7})"), HasSubstr("\"rid\" must be a string"));
  EXPECT_THAT(Refusal(R"({"text": "a", "sampling_params": [1]})"),
              HasSubstr("\"sampling_params\" must be an object"));
  EXPECT_THAT(Refusal(R"({"text": "a", "sampling_params": {"max_new_tokens": -1}})"),
              HasSubstr("sampling_params.max_new_tokens\" must be an integer in [0, 384]"));
  EXPECT_THAT(Refusal(R"({"text": "a", "sampling_params": {"max_new_tokens": 100000}})"),
              HasSubstr("[0, 384]"));
  EXPECT_THAT(Refusal(R"({"text": "a", "sampling_params": {"max_new_tokens": "5"}})"),
              HasSubstr("max_new_tokens"));
  EXPECT_THAT(Refusal(R"({"text": "a", "sampling_params": {"temperature": -1}})"),
              HasSubstr(">= 0"));
  EXPECT_THAT(Refusal(R"({"text": "a", "sampling_params": {"top_p": 0}})"), HasSubstr("(0, 1]"));
  EXPECT_THAT(Refusal(R"({"text": "a", "sampling_params": {"top_k": 0}})"), HasSubstr("-1"));
  EXPECT_THAT(Refusal(R"({"text": "a", "sampling_params": {"stop": [""]}})"),
              HasSubstr("empty string"));
  EXPECT_THAT(Refusal(R"({"text": "a", "sampling_params": {"stop": 3}})"),
              HasSubstr("a string or an array of strings"));
  EXPECT_THAT(Refusal(R"({"text": "a", "sampling_params": {"seed": 1, "sampling_seed": 2}})"),
              HasSubstr("disagree"));
}

TEST(ProtocolTest, SamplingParametersAreHonouredOrRefusedNeverIgnored) {
  EXPECT_THAT(Refusal(R"({"text": "a", "sampling_params": {"frobnicate": 1}})"),
              HasSubstr("unknown sampling parameter \"frobnicate\""));
  for (std::string_view param :
       {R"("presence_penalty": 0.5)", R"("frequency_penalty": 1)", R"("repetition_penalty": 1.2)",
        R"("min_p": 0.1)", R"("min_new_tokens": 3)", R"("n": 2)", R"("regex": "a+")",
        R"("json_schema": "{}")", R"("logit_bias": {"5": 1.0})", R"("custom_params": {"a": 1})"}) {
    const std::string body =
        absl::StrCat(R"({"text": "a", "sampling_params": {)", AbslView(param), "}}");
    EXPECT_THAT(Refusal(body), HasSubstr("not supported by the reference engine")) << param;
  }
  for (std::string_view field :
       {R"("image_data": "x.png")", R"("lora_path": "l")", R"("logprob_start_len": 0)",
        R"("top_logprobs_num": 2)", R"("return_hidden_states": true)"}) {
    const std::string body = absl::StrCat(R"({"text": "a", )", AbslView(field), "}");
    EXPECT_THAT(Refusal(body), HasSubstr("not supported")) << field;
  }
  // Unknown top-level fields are the client's business.
  EXPECT_TRUE(Parse(ApiRoute::kGenerate, R"({"text": "a", "my_tag": {"x": 1}})").ok());
}

TEST(ProtocolTest, ParsesOpenAiBodies) {
  absl::StatusOr<ApiRequest> c = Parse(ApiRoute::kCompletions, R"({
    "model": "m", "prompt": "hello", "max_tokens": 5, "temperature": 0.5, "logprobs": 0,
    "stop": "\n", "seed": 3, "cache_salt": "salt", "stream": true,
    "stream_options": {"include_usage": true}, "user": "u"})");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->model, "m");
  EXPECT_EQ(c->generation.max_new_tokens, 5);
  EXPECT_TRUE(c->return_logprob);
  EXPECT_EQ(c->generation.extra_key, "salt");
  EXPECT_TRUE(c->include_usage);
  EXPECT_THAT(c->generation.stop, ElementsAre("\n"));

  absl::StatusOr<ApiRequest> ids = Parse(ApiRoute::kCompletions, R"({"prompt": [[5, 6]]})");
  ASSERT_TRUE(ids.ok()) << ids.status();
  EXPECT_THAT(ids->generation.prompt, ElementsAre(5, 6));
  EXPECT_EQ(ids->generation.max_new_tokens, 16);

  absl::StatusOr<ApiRequest> chat = Parse(ApiRoute::kChatCompletions, R"({
    "messages": [{"role": "system", "content": "be brief"},
                 {"role": "user", "content": [{"type": "text", "text": "hi"}]}],
    "max_completion_tokens": 7, "logprobs": true})");
  ASSERT_TRUE(chat.ok()) << chat.status();
  std::vector<ChatMessage> messages = {{"system", "be brief"}, {"user", "hi"}};
  EXPECT_EQ(chat->generation.prompt, EncodeText(*ApplyChatTemplate(messages), BosMode::kPrepend));
  EXPECT_EQ(chat->generation.max_new_tokens, 7);
  EXPECT_TRUE(chat->return_logprob);

  EXPECT_THAT(Refusal(R"({"prompt": ["a", "b"]})", ApiRoute::kCompletions),
              HasSubstr("several prompts"));
  EXPECT_THAT(Refusal(R"({"prompt": "a", "logprobs": 3})", ApiRoute::kCompletions),
              HasSubstr("top alternatives"));
  EXPECT_THAT(Refusal(R"({"prompt": "a", "echo": true})", ApiRoute::kCompletions),
              HasSubstr("not supported"));
  EXPECT_THAT(Refusal(R"({"prompt": "a", "max_tokens": 1000})", ApiRoute::kCompletions),
              HasSubstr("max_tokens"));
  EXPECT_THAT(Refusal(R"({"messages": "hi"})", ApiRoute::kChatCompletions),
              HasSubstr("\"messages\""));
  EXPECT_THAT(Refusal(R"({"messages": [{"role": "user", "content": [{"type": "image_url"}]}]})",
                      ApiRoute::kChatCompletions),
              HasSubstr("text only"));
  EXPECT_THAT(
      Refusal(R"({"messages": [{"role": "User!", "content": "x"}]})", ApiRoute::kChatCompletions),
      HasSubstr("message"));
  EXPECT_THAT(Refusal(R"({"messages": [{"role": "user", "content": "x"}], "tools": [{}]})",
                      ApiRoute::kChatCompletions),
              HasSubstr("not supported"));
}

GenerationProgress Progress(bool finished) {
  GenerationProgress p;
  p.rid = "r1";
  p.prompt_tokens = 4;
  p.tokens = {{72, -0.5}, {105, -1.25}};
  p.text = "Hi";
  p.weight_version = VersionRef{"run", 7};
  if (finished) p.finish = FinishReason{FinishType::kLength};
  return p;
}

TEST(ProtocolTest, FormatsSglangResponses) {
  ApiRequest request;
  request.return_logprob = true;
  const std::string body = FormatResponse(request, Progress(true), ResponseContext{"m", 1});
  EXPECT_EQ(JsonGet(body, "text"), "Hi");
  EXPECT_THAT(JsonInts(body, "output_ids"), ElementsAre(72, 105));
  EXPECT_EQ(JsonGet(body, "meta_info.id"), "r1");
  EXPECT_EQ(JsonGet(body, "meta_info.weight_version"), "7");
  EXPECT_EQ(JsonGet(body, "meta_info.finish_reason.type"), "length");
  EXPECT_EQ(JsonGet(body, "meta_info.prompt_tokens"), "4");
  EXPECT_EQ(JsonGet(body, "meta_info.completion_tokens"), "2");
  EXPECT_THAT(JsonNumbers(body, "meta_info.output_token_logprobs", 0), ElementsAre(-0.5, -1.25));
  EXPECT_THAT(JsonNumbers(body, "meta_info.output_token_logprobs", 1), ElementsAre(72, 105));
  EXPECT_EQ(JsonGet(body, "meta_info.output_token_logprobs.0.2"), "null");

  StreamCursor cursor;
  ApiRequest streamed = request;
  streamed.stream = true;
  GenerationProgress p = Progress(false);
  std::vector<std::string> first = FormatStreamEvents(streamed, p, &cursor, {});
  ASSERT_THAT(first, SizeIs(1));
  EXPECT_EQ(JsonGet(first[0], "meta_info.finish_reason"), "null");
  EXPECT_THAT(FormatStreamEvents(streamed, p, &cursor, {}), IsEmpty());
  p.tokens.push_back({33, -2});
  p.text += "!";
  p.finish = FinishReason{FinishType::kStop, 33};
  std::vector<std::string> last = FormatStreamEvents(streamed, p, &cursor, {});
  ASSERT_THAT(last, SizeIs(1));
  EXPECT_EQ(JsonGet(last[0], "text"), "Hi!");  // cumulative, like SGLang
  EXPECT_EQ(JsonGet(last[0], "meta_info.finish_reason.matched"), "33");
  EXPECT_THAT(FormatStreamEvents(streamed, p, &cursor, {}), IsEmpty());
}

TEST(ProtocolTest, FormatsOpenAiResponsesAndDeltas) {
  ApiRequest chat;
  chat.route = ApiRoute::kChatCompletions;
  chat.include_usage = true;
  const std::string body = FormatResponse(chat, Progress(true), ResponseContext{"served", 5});
  EXPECT_EQ(JsonGet(body, "id"), "chatcmpl-r1");
  EXPECT_EQ(JsonGet(body, "object"), "chat.completion");
  EXPECT_EQ(JsonGet(body, "model"), "served");
  EXPECT_EQ(JsonGet(body, "choices.0.message.content"), "Hi");
  EXPECT_EQ(JsonGet(body, "choices.0.finish_reason"), "length");
  EXPECT_EQ(JsonGet(body, "usage.total_tokens"), "6");
  EXPECT_EQ(JsonGet(body, "metadata.weight_version"), "7");

  StreamCursor cursor;
  GenerationProgress p = Progress(false);
  std::vector<std::string> first = FormatStreamEvents(chat, p, &cursor, {});
  ASSERT_THAT(first, SizeIs(1));
  EXPECT_EQ(JsonGet(first[0], "choices.0.delta.role"), "assistant");
  EXPECT_EQ(JsonGet(first[0], "choices.0.delta.content"), "Hi");
  p.text += " there";
  p.finish = FinishReason{FinishType::kStop, std::nullopt, std::string("\n")};
  std::vector<std::string> last = FormatStreamEvents(chat, p, &cursor, {});
  ASSERT_THAT(last, SizeIs(2));
  EXPECT_EQ(JsonGet(last[0], "choices.0.delta.content"), " there");
  EXPECT_EQ(JsonGet(last[0], "choices.0.delta.role"), std::nullopt);
  EXPECT_EQ(JsonGet(last[0], "choices.0.finish_reason"), "stop");
  EXPECT_EQ(JsonGet(last[1], "usage.completion_tokens"), "2");

  ApiRequest completion;
  completion.route = ApiRoute::kCompletions;
  completion.return_logprob = true;
  const std::string c = FormatResponse(completion, Progress(true), ResponseContext{"m", 5});
  EXPECT_EQ(JsonGet(c, "object"), "text_completion");
  EXPECT_EQ(JsonGet(c, "choices.0.text"), "Hi");
  EXPECT_THAT(JsonNumbers(c, "choices.0.logprobs.token_logprobs"), ElementsAre(-0.5, -1.25));
  EXPECT_EQ(JsonGet(c, "choices.0.logprobs.tokens.1"), "i");
}

// vLLM's dialect reads request_id and cache_salt, and only those.
TEST(ProtocolTest, TheVllmDialectReadsRequestIdAndCacheSalt) {
  absl::StatusOr<ApiRequest> r = ParseApiRequest(
      ApiRoute::kCompletions,
      R"({"prompt":"x","request_id":"job","cache_salt":"s","rid":"other","extra_key":"k",)"
      R"("logprobs":0,"return_tokens_as_token_ids":true})",
      EngineTestConfig(), EngineApi::kVllm);
  ASSERT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->response_rid, "job");
  EXPECT_EQ(r->generation.extra_key, "s");
  EXPECT_EQ(r->generation.rid, "");
  EXPECT_TRUE(r->tokens_as_ids);
  absl::StatusOr<ApiRequest> sglang =
      Parse(ApiRoute::kCompletions, R"({"prompt":"x","return_tokens_as_token_ids":true})");
  ASSERT_TRUE(sglang.ok());
  EXPECT_FALSE(sglang->tokens_as_ids);
  EXPECT_EQ(VllmEngineRid(ApiRoute::kCompletions, "job"), "cmpl-job-0");
  EXPECT_EQ(VllmEngineRid(ApiRoute::kChatCompletions, "job"), "chatcmpl-job");
}

TEST(ProtocolTest, TheVllmDialectFormatsLikeVllm) {
  ApiRequest completion;
  completion.route = ApiRoute::kCompletions;
  completion.api = EngineApi::kVllm;
  completion.return_logprob = true;
  completion.tokens_as_ids = true;
  const std::string c = FormatResponse(completion, Progress(true), ResponseContext{"m", 5});
  EXPECT_EQ(JsonGet(c, "metadata.weight_version"), std::nullopt);
  EXPECT_EQ(JsonGet(c, "choices.0.logprobs.tokens.1"), "token_id:105");
  EXPECT_TRUE(JsonGet(c, "choices.0.stop_reason").has_value());
  EXPECT_EQ(JsonGet(c, "choices.0.matched_stop"), std::nullopt);

  const std::string error = VllmErrorJson(400, "bad \"x\"");
  EXPECT_EQ(JsonGet(error, "error.message"), "bad \"x\"");
  EXPECT_EQ(JsonGet(error, "error.type"), "BadRequestError");
  EXPECT_EQ(JsonGet(error, "error.code"), "400");
  EXPECT_EQ(JsonGet(VllmErrorJson(500, "x"), "error.type"), "InternalServerError");
  EXPECT_TRUE(ParseEngineApi("vllm").ok());
  EXPECT_THAT(ParseEngineApi("tgi").status().message(), HasSubstr("expected sglang|vllm"));
}

TEST(ProtocolTest, ParsesControlBodies) {
  EXPECT_EQ(*ParsePauseRequest(""), PauseMode::kAbort);
  EXPECT_EQ(*ParsePauseRequest(R"({"mode": "in_place"})"), PauseMode::kInPlace);
  EXPECT_EQ(*ParsePauseRequest(R"({"mode": "retract"})"), PauseMode::kRetract);
  EXPECT_THAT(ParsePauseRequest(R"({"mode": "later"})").status().message(),
              HasSubstr("unknown pause mode"));
  EXPECT_FALSE(ParsePauseRequest("{").ok());

  EXPECT_EQ(ParseAbortRequest(R"({"rid": "job-"})")->rid_prefix, "job-");
  EXPECT_EQ(ParseAbortRequest(R"({"abort_all": true})")->scope, Scheduler::AbortScope::kAll);
  EXPECT_THAT(ParseAbortRequest("{}").status().message(), HasSubstr("rid"));

  absl::StatusOr<StageRequest> stage = ParseStageRequest(R"({
    "base_checkpoint_dir": "/boot", "base_version": 0,
    "target_version": "run-a/weight_v000005", "destination": "disk",
    "checkpoint_source_dir": "/store/updates", "local_checkpoint_dir": "/local"})");
  ASSERT_TRUE(stage.ok()) << stage.status();
  EXPECT_EQ(stage->run_id, "run-a");
  EXPECT_EQ(stage->target_version, 5);
  EXPECT_EQ(stage->destination, UpdateDestination::kDisk);
  EXPECT_EQ(stage->checkpoint_source_dir, std::filesystem::path("/store/updates"));
  EXPECT_FALSE(stage->anchor_dir.has_value());
  absl::StatusOr<StageRequest> anchored = ParseStageRequest(R"({
    "base_checkpoint_dir": "/boot", "base_version": 0, "target_version": 5,
    "destination": "cpu", "checkpoint_source_dir": "/store/updates",
    "anchor_dir": "/store/anchors/updates/weight_v000003", "anchor_version": 3})");
  ASSERT_TRUE(anchored.ok()) << anchored.status();
  EXPECT_EQ(anchored->anchor_dir, std::filesystem::path("/store/anchors/updates/weight_v000003"));
  EXPECT_EQ(anchored->anchor_version, 3);

  auto stage_refusal = [](std::string_view body) {
    absl::StatusOr<StageRequest> r = ParseStageRequest(body);
    EXPECT_TRUE(absl::IsInvalidArgument(r.status())) << body;
    return std::string(r.status().message());
  };
  EXPECT_THAT(stage_refusal(R"({"base_version": 0, "target_version": 1, "destination": "cpu"})"),
              HasSubstr("base_checkpoint_dir"));
  EXPECT_THAT(stage_refusal(R"({"base_checkpoint_dir": "/b", "base_version": 0,
                                "target_version": 1, "destination": "cpu",
                                "anchor_dir": "/a"})"),
              HasSubstr("come together"));
  EXPECT_THAT(stage_refusal(R"({"base_checkpoint_dir": "/b", "base_version": 0,
                                "target_version": 4, "destination": "cpu",
                                "checkpoint_source_dir": "/s", "anchor_dir": "/a",
                                "anchor_version": 5})"),
              HasSubstr("at most \"target_version\""));
  EXPECT_THAT(stage_refusal(R"({"base_checkpoint_dir": "/b", "base_version": 0,
                                "target_version": 1, "destination": "gpu"})"),
              HasSubstr("destination"));
  EXPECT_THAT(stage_refusal(R"({"base_checkpoint_dir": "/b", "base_version": 0,
                                "target_version": 1, "destination": "disk"})"),
              HasSubstr("local_checkpoint_dir"));
  EXPECT_THAT(stage_refusal(R"({"base_checkpoint_dir": "/b", "base_version": "x/y",
                                "target_version": 1, "destination": "cpu"})"),
              HasSubstr("base_version"));
  EXPECT_THAT(stage_refusal(R"({"base_checkpoint_dir": "/b", "base_version": "a/weight_v000000",
                                "target_version": "b/weight_v000001", "destination": "cpu"})"),
              HasSubstr("one run"));

  absl::StatusOr<UpdateFromDiskRequest> disk = ParseUpdateFromDiskRequest(
      R"({"model_path": "/m", "load_format": "auto", "weight_version": "3", "flush_cache": false})");
  ASSERT_TRUE(disk.ok()) << disk.status();
  EXPECT_EQ(disk->weight_version->version, 3);
  EXPECT_FALSE(disk->flush_cache);
  EXPECT_FALSE(ParseUpdateFromDiskRequest(R"({"model_path": "/m", "load_format": "gguf"})").ok());
  EXPECT_FALSE(ParseUpdateFromDiskRequest(R"({"weight_version": 1})").ok());
  EXPECT_FALSE(ParseUpdateFromDiskRequest(R"({"model_path": "/m", "weight_version": "v1"})").ok());

  EXPECT_EQ(ParseUpdateFromCpuRequest(R"({"target_version": 4})")->target_version.version, 4);
  EXPECT_FALSE(ParseUpdateFromCpuRequest(R"({"flush_cache": true})").ok());
}

}  // namespace
}  // namespace stitch

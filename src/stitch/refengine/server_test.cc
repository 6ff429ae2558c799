// The engine over real HTTP, in-process: generation against the reference
// forward pass, batching, streaming, aborts, disconnects, a full queue, bad
// input, health and the info routes. Weight updates: server_update_test.cc.

#include "stitch/refengine/server_test_fixture.h"

namespace stitch::server_test {
namespace {

TEST_F(EngineServerTest, ThePrefixCacheServesASharedPromptWithTheSameTokens) {
  EngineOptions options;
  options.scheduler.prefix_cache_bytes = size_t{64} << 20;
  Start(std::move(options));
  const std::string prompt = "A long shared system prompt, then";
  HttpResponse first = Post("/generate", GenerateBody(prompt, 12, 0, 0, R"( "extra_key": "g",)"));
  ASSERT_EQ(first.status, 200) << first.body;
  EXPECT_EQ(JsonGet(first.body, "meta_info.cached_tokens"), "0");
  // The same prompt again (a GRPO group's next sample): all but its last
  // token come from the cache, and the tokens are the reference's.
  HttpResponse again = Post("/generate", GenerateBody(prompt, 12, 0, 0, R"( "extra_key": "g",)"));
  ASSERT_EQ(again.status, 200) << again.body;
  const auto ids = EncodeText(prompt, BosMode::kPrepend);
  EXPECT_EQ(JsonGet(again.body, "meta_info.cached_tokens"), absl::StrCat(ids.size() - 1));
  const auto ref = ReferenceGenerate(*Weights(0), ids, Greedy(12));
  EXPECT_THAT(JsonInts(again.body, "output_ids"), ElementsAreArray(Wide(Ids(ref))));
  EXPECT_THAT(JsonNumbers(again.body, "meta_info.output_token_logprobs", 0),
              ElementsAreArray(SameDoubles(Logprobs(ref))));
  // The next turn of a conversation: the prompt and the answer are cached.
  std::vector<int32_t> turn = ids;
  for (const SampledToken& t : ref) turn.push_back(t.id);
  turn.push_back('?');
  HttpResponse next =
      Post("/generate",
           absl::StrCat(R"({"input_ids": )", IdsJson(turn),
                        R"(, "extra_key": "g", "return_logprob": true, "sampling_params": )",
                        R"({"max_new_tokens": 6, "temperature": 0, "ignore_eos": true}})"));
  ASSERT_EQ(next.status, 200) << next.body;
  EXPECT_EQ(JsonGet(next.body, "meta_info.cached_tokens"), absl::StrCat(ids.size() + 11));
  EXPECT_THAT(JsonInts(next.body, "output_ids"),
              ElementsAreArray(Wide(Ids(ReferenceGenerate(*Weights(0), turn, Greedy(6))))));
  // Another cache key shares nothing.
  HttpResponse other = Post("/generate", GenerateBody(prompt, 4, 0, 0, R"( "extra_key": "h",)"));
  EXPECT_EQ(JsonGet(other.body, "meta_info.cached_tokens"), "0");
  // New weights empty the cache: nothing computed by the old ones is reused.
  std::promise<absl::Status> swapped;
  server_->mutable_scheduler().SwapWeights(
      Weights(1), VersionRef{"run-a", 1}, [] {},
      [&](absl::StatusOr<SwapResult> r) { swapped.set_value(r.status()); });
  ASSERT_TRUE(swapped.get_future().get().ok());
  HttpResponse after = Post("/generate", GenerateBody(prompt, 12, 0, 0, R"( "extra_key": "g",)"));
  EXPECT_EQ(JsonGet(after.body, "meta_info.cached_tokens"), "0");
  EXPECT_THAT(JsonInts(after.body, "output_ids"),
              ElementsAreArray(Wide(Ids(ReferenceGenerate(*Weights(1), ids, Greedy(12))))));
}

TEST_F(EngineServerTest, SpansNameEachInPlaceCommitInsideOneGenerationExactly) {
  StartSwappingAtPlannedSteps();
  // Whole /generate: two commits inside one generation.
  PlanSwaps({{5, 1}, {12, 2}});
  HttpResponse whole = Post("/generate", GenerateBody("Spans", 30));
  ASSERT_EQ(whole.status, 200) << whole.body;
  EXPECT_TRUE(PlanDone());
  EXPECT_EQ(JsonGet(whole.body, "meta_info.weight_version_spans"), "[[0,0],[5,1],[12,2]]");
  EXPECT_EQ(JsonGet(whole.body, "meta_info.weight_version"), "2");
  // The tokens are those of the weights the spans name.
  const auto prompt = EncodeText("Spans", BosMode::kPrepend);
  const auto split = testing::SplitGenerate(*Weights(0), *Weights(1), prompt, Greedy(30), 5, false);
  std::vector<int64_t> got = JsonInts(whole.body, "output_ids");
  std::vector<int64_t> want = Wide(Ids(split));
  ASSERT_EQ(got.size(), 30u);
  got.resize(12);
  want.resize(12);
  EXPECT_EQ(got, want);

  // Streamed /generate: every event carries the spans so far.
  PlanSwaps({{3, 3}, {4, 4}, {20, 1}});
  SseClient sse;
  ASSERT_EQ(*sse.Open(server_->url(), "/generate",
                      GenerateBody("Spans", 30, 0, 0, R"( "stream": true,)")),
            200);
  absl::StatusOr<std::vector<std::string>> events = sse.ReadAll();
  ASSERT_TRUE(events.ok()) << events.status();
  ASSERT_GE(events->size(), 3u);
  EXPECT_TRUE(PlanDone());
  EXPECT_EQ(JsonGet((*events)[events->size() - 2], "meta_info.weight_version_spans"),
            "[[0,2],[3,3],[4,4],[20,1]]");
  EXPECT_EQ(JsonGet(events->front(), "meta_info.weight_version_spans"), "[[0,2]]");
  for (size_t i = 0; i + 1 < events->size(); ++i) {
    const std::vector<int64_t> ids = JsonInts((*events)[i], "output_ids");
    const std::string spans = *JsonGet((*events)[i], "meta_info.weight_version_spans");
    EXPECT_EQ(spans.find("[20,1]") != std::string::npos, ids.size() > 20) << spans;
  }

  // OpenAI routes, whole and streamed: at the top level.
  PlanSwaps({{2, 2}});
  HttpResponse completion =
      Post("/v1/completions",
           R"({"prompt": "Spans", "max_tokens": 6, "temperature": 0, "ignore_eos": true})");
  ASSERT_EQ(completion.status, 200) << completion.body;
  EXPECT_EQ(JsonGet(completion.body, "weight_version_spans"), "[[0,1],[2,2]]");
  PlanSwaps({{1, 3}});
  ASSERT_EQ(*sse.Open(server_->url(), "/v1/chat/completions",
                      R"({"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4,)"
                      R"( "temperature": 0, "ignore_eos": true, "stream": true})"),
            200);
  events = sse.ReadAll();
  ASSERT_TRUE(events.ok()) << events.status();
  ASSERT_GE(events->size(), 2u);
  EXPECT_EQ(JsonGet((*events)[events->size() - 2], "weight_version_spans"), "[[0,2],[1,3]]");
  // One version throughout: one span.
  HttpResponse steady = Post("/generate", GenerateBody("Steady", 8));
  EXPECT_EQ(JsonGet(steady.body, "meta_info.weight_version_spans"), "[[0,3]]");
}

// Started without spans, it answers as stock SGLang: a label on every
// response and event, no spans.
TEST_F(EngineServerTest, WithoutSpansItLabelsEveryAnswerAndReportsNoSpans) {
  EngineOptions options;
  options.report_spans = false;
  Start(std::move(options));
  HttpResponse whole = Post("/generate", GenerateBody("Spans", 4));
  ASSERT_EQ(whole.status, 200) << whole.body;
  EXPECT_EQ(JsonGet(whole.body, "meta_info.weight_version"), "0");
  EXPECT_EQ(whole.body.find("weight_version_spans"), std::string::npos) << whole.body;
  SseClient sse;
  ASSERT_EQ(
      *sse.Open(server_->url(), "/generate", GenerateBody("Spans", 4, 0, 0, R"( "stream": true,)")),
      200);
  absl::StatusOr<std::vector<std::string>> events = sse.ReadAll();
  ASSERT_TRUE(events.ok()) << events.status();
  ASSERT_GE(events->size(), 2u);
  for (size_t i = 0; i + 1 < events->size(); ++i) {
    EXPECT_EQ(JsonGet((*events)[i], "meta_info.weight_version"), "0") << (*events)[i];
    EXPECT_EQ((*events)[i].find("weight_version_spans"), std::string::npos) << (*events)[i];
  }
  HttpResponse completion =
      Post("/v1/completions", R"({"prompt": "Spans", "max_tokens": 3, "temperature": 0})");
  ASSERT_EQ(completion.status, 200) << completion.body;
  EXPECT_EQ(completion.body.find("weight_version_spans"), std::string::npos) << completion.body;
}

TEST_F(EngineServerTest, GenerateMatchesTheReferenceForwardPass) {
  Start();
  const std::vector<int32_t> prompt = EncodeText("Hello", BosMode::kPrepend);
  for (auto [temperature, seed] : {std::pair<double, int>{0, 0}, {0.8, 5}, {1.3, 6}}) {
    HttpResponse r = Post("/generate", GenerateBody("Hello", 30, temperature, seed));
    ASSERT_EQ(r.status, 200) << r.body;
    const auto ref = ReferenceGenerate(*Weights(0), prompt, Greedy(30, temperature, seed));
    EXPECT_THAT(JsonInts(r.body, "output_ids"), ElementsAreArray(Wide(Ids(ref))));
    EXPECT_THAT(JsonNumbers(r.body, "meta_info.output_token_logprobs", 0),
                ElementsAreArray(SameDoubles(Logprobs(ref))));
    EXPECT_EQ(JsonGet(r.body, "text"), DecodeTokens(Ids(ref)));
    EXPECT_EQ(JsonGet(r.body, "meta_info.finish_reason.type"), "length");
    EXPECT_EQ(JsonGet(r.body, "meta_info.prompt_tokens"), absl::StrCat(prompt.size()));
    EXPECT_EQ(JsonGet(r.body, "meta_info.completion_tokens"), "30");
    EXPECT_EQ(JsonGet(r.body, "meta_info.weight_version"), "0");
  }
  // input_ids and text give the same generation; same seed, same result.
  HttpResponse by_ids =
      Post("/generate", absl::StrCat(R"({"input_ids": )", IdsJson(prompt),
                                     R"(, "sampling_params": {"max_new_tokens": 30,
                                                        "temperature": 0.8, "seed": 5,
                                                        "ignore_eos": true}})"));
  ASSERT_EQ(by_ids.status, 200) << by_ids.body;
  EXPECT_EQ(JsonInts(by_ids.body, "output_ids"),
            Wide(Ids(ReferenceGenerate(*Weights(0), prompt, Greedy(30, 0.8, 5)))));
}

// /metrics counts what was generated under SGLang's family names.
TEST_F(EngineServerTest, MetricsCountGeneratedTokensUnderSglangsNames) {
  Start();
  HttpResponse before = Get("/metrics");
  ASSERT_EQ(before.status, 200) << before.body;
  EXPECT_NE(before.body.find("sglang:generation_tokens_total 0\n"), std::string::npos)
      << before.body;
  ASSERT_EQ(Post("/generate", GenerateBody("Hello", 7, 0, 0)).status, 200);
  HttpResponse after = Get("/metrics");
  EXPECT_NE(after.body.find("sglang:generation_tokens_total 7\n"), std::string::npos) << after.body;
  EXPECT_NE(after.body.find("sglang:num_requests_total 1\n"), std::string::npos) << after.body;
  EXPECT_NE(after.body.find("# TYPE sglang:num_running_reqs gauge\n"), std::string::npos);
}

TEST_F(EngineServerTest, OpenAiRoutesGenerateTheSameTokens) {
  Start();
  const auto ref =
      ReferenceGenerate(*Weights(0), EncodeText("Hello", BosMode::kPrepend), Greedy(12));
  HttpResponse c = Post("/v1/completions", R"({"model": "x", "prompt": "Hello", "max_tokens": 12,
      "temperature": 0, "ignore_eos": true, "logprobs": 0, "cache_salt": "s1"})");
  ASSERT_EQ(c.status, 200) << c.body;
  EXPECT_EQ(JsonGet(c.body, "choices.0.text"), DecodeTokens(Ids(ref)));
  EXPECT_THAT(JsonNumbers(c.body, "choices.0.logprobs.token_logprobs"),
              ElementsAreArray(SameDoubles(Logprobs(ref))));
  EXPECT_EQ(JsonGet(c.body, "usage.completion_tokens"), "12");
  EXPECT_EQ(JsonGet(c.body, "model"), "x");
  EXPECT_EQ(JsonGet(c.body, "metadata.weight_version"), "0");

  std::vector<ChatMessage> messages = {{"user", "Hi there"}};
  const auto chat_ref = ReferenceGenerate(
      *Weights(0), EncodeText(*ApplyChatTemplate(messages), BosMode::kPrepend), Greedy(10));
  const std::string chat_body = R"({"messages": [{"role": "user", "content": "Hi there"}],
      "max_tokens": 10, "temperature": 0, "ignore_eos": true})";
  HttpResponse chat = Post("/v1/chat/completions", chat_body);
  ASSERT_EQ(chat.status, 200) << chat.body;
  EXPECT_EQ(JsonGet(chat.body, "object"), "chat.completion");
  EXPECT_EQ(JsonGet(chat.body, "choices.0.message.content"), DecodeTokens(Ids(chat_ref)));
  EXPECT_EQ(JsonGet(chat.body, "model"), "test-model");

  // Streamed, the deltas add up to the same reply.
  std::string streamed_body = chat_body;
  streamed_body.insert(1, R"("stream": true, "stream_options": {"include_usage": true}, )");
  SseClient sse;
  ASSERT_EQ(*sse.Open(server_->url(), "/v1/chat/completions", streamed_body), 200);
  absl::StatusOr<std::vector<std::string>> events = sse.ReadAll();
  ASSERT_TRUE(events.ok()) << events.status();
  ASSERT_GE(events->size(), 3u);
  EXPECT_EQ(events->back(), "[DONE]");
  std::string content;
  for (size_t i = 0; i + 1 < events->size(); ++i) {
    content += JsonGet((*events)[i], "choices.0.delta.content").value_or("");
  }
  EXPECT_EQ(content, DecodeTokens(Ids(chat_ref)));
  EXPECT_EQ(JsonGet((*events)[events->size() - 2], "usage.completion_tokens"), "10");
}

TEST_F(EngineServerTest, StreamedGenerateSendsCumulativeChunksThenDone) {
  Start();
  SseClient sse;
  ASSERT_EQ(*sse.Open(server_->url(), "/generate",
                      GenerateBody("Stream", 40, 0, 0, R"( "stream": true,)")),
            200);
  absl::StatusOr<std::vector<std::string>> events = sse.ReadAll();
  ASSERT_TRUE(events.ok()) << events.status();
  ASSERT_GE(events->size(), 2u);
  EXPECT_EQ(events->back(), "[DONE]");
  const auto ref =
      ReferenceGenerate(*Weights(0), EncodeText("Stream", BosMode::kPrepend), Greedy(40));
  const std::string& last = (*events)[events->size() - 2];
  EXPECT_EQ(JsonInts(last, "output_ids"), Wide(Ids(ref)));
  EXPECT_EQ(JsonGet(last, "text"), DecodeTokens(Ids(ref)));
  EXPECT_EQ(JsonGet(last, "meta_info.finish_reason.type"), "length");
  std::string previous;
  for (size_t i = 0; i + 1 < events->size(); ++i) {
    const std::string text = JsonGet((*events)[i], "text").value_or("<none>");
    EXPECT_THAT(text, StartsWith(previous)) << "chunk " << i << " is not cumulative";
    previous = text;
    if (i + 2 < events->size()) {
      EXPECT_EQ(JsonGet((*events)[i], "meta_info.finish_reason"), "null");
    }
  }
}

TEST_F(EngineServerTest, ConcurrentRequestsBatchAndMatchOneAtATime) {
  Start();
  std::vector<std::string> bodies;
  for (int i = 0; i < 8; ++i) {
    bodies.push_back(GenerateBody(std::string(static_cast<size_t>(2 + 5 * i), 'a' + i), 20,
                                  i % 2 == 0 ? 0 : 0.9, 100 + i));
  }
  std::vector<std::string> alone;
  for (const std::string& body : bodies) {
    HttpResponse r = Post("/generate", body);
    ASSERT_EQ(r.status, 200);
    alone.push_back(*JsonGet(r.body, "output_ids") +
                    *JsonGet(r.body, "meta_info.output_token_logprobs"));
  }
  // Line every request up behind a pause so that they share each step.
  ASSERT_EQ(Post("/pause_generation", R"({"mode": "in_place"})").status, 200);
  const uint64_t steps_before = server_->scheduler().stats().steps;
  std::vector<std::future<HttpResponse>> together;
  for (const std::string& body : bodies) {
    together.push_back(
        std::async(std::launch::async, [this, body] { return Post("/generate", body); }));
  }
  ASSERT_TRUE(WaitFor([this] { return server_->scheduler().stats().queued == 8; }));
  ASSERT_EQ(Post("/continue_generation", "").status, 200);
  for (size_t i = 0; i < together.size(); ++i) {
    HttpResponse r = together[i].get();
    ASSERT_EQ(r.status, 200);
    EXPECT_EQ(*JsonGet(r.body, "output_ids") + *JsonGet(r.body, "meta_info.output_token_logprobs"),
              alone[i])
        << "request " << i;
  }
  // 160 tokens in far fewer steps: they advanced together.
  EXPECT_LE(server_->scheduler().stats().steps - steps_before, 25u);
}

TEST_F(EngineServerTest, AbortsByRidPrefixAndAll) {
  Start();
  ASSERT_EQ(Post("/pause_generation", R"({"mode": "in_place"})").status, 200);
  std::vector<std::future<HttpResponse>> requests;
  for (std::string rid : {"job-1-a", "job-1-b", "job-2"}) {
    requests.push_back(std::async(std::launch::async, [this, rid] {
      return Post("/generate",
                  GenerateBody("Abort", 100, 0, 0, absl::StrCat(R"( "rid": ")", rid, R"(",)")));
    }));
  }
  ASSERT_TRUE(WaitFor([this] { return server_->scheduler().stats().queued == 3; }));
  HttpResponse some = Post("/abort_request", R"({"rid": "job-1"})");
  ASSERT_EQ(some.status, 200) << some.body;
  EXPECT_EQ(JsonGet(some.body, "aborted_requests"), "2");
  for (int i = 0; i < 2; ++i) {
    HttpResponse r = requests[static_cast<size_t>(i)].get();
    EXPECT_EQ(r.status, 200);
    EXPECT_EQ(JsonGet(r.body, "meta_info.finish_reason.type"), "abort");
    EXPECT_THAT(JsonGet(r.body, "meta_info.finish_reason.message").value_or(""),
                HasSubstr("abort_request"));
  }
  // A running request is aborted too.
  ASSERT_EQ(PauseWhen([this] { return TokensGenerated() >= 3; }, "in_place",
                      [this] { ASSERT_EQ(Post("/continue_generation", "").status, 200); })
                .status,
            200);
  EXPECT_EQ(server_->scheduler().stats().running, 1);
  HttpResponse all = Post("/abort_request", R"({"abort_all": true})");
  EXPECT_EQ(JsonGet(all.body, "aborted_requests"), "1");
  HttpResponse last = requests[2].get();
  EXPECT_EQ(JsonGet(last.body, "meta_info.finish_reason.type"), "abort");
  EXPECT_EQ(JsonGet(last.body, "meta_info.completion_tokens"), "3");
  // The answer can come before the scheduler sweeps the aborted entry.
  EXPECT_TRUE(WaitFor([this] { return server_->scheduler().stats().running == 0; }));
}

TEST_F(EngineServerTest, AClientThatDisconnectsIsAborted) {
  Start();
  // Streaming and running.
  SseClient sse;
  ASSERT_EQ(PauseWhen([this] { return TokensGenerated() >= 2; }, "in_place",
                      [&] {
                        EXPECT_EQ(*sse.Open(server_->url(), "/generate",
                                            GenerateBody("Bye", 300, 0, 0, R"( "stream": true,)")),
                                  200);
                      })
                .status,
            200);
  ASSERT_EQ(server_->scheduler().stats().running, 1);
  sse.Close();
  EXPECT_TRUE(WaitFor([this] {
    SchedulerStats s = server_->scheduler().stats();
    return s.running == 0 && s.requests_aborted == 1;
  }));
  // Not streaming and still queued.
  {
    testing::RawHttpRequest raw(server_->port(), "/generate", GenerateBody("Gone", 50));
    ASSERT_TRUE(raw.sent());
    ASSERT_TRUE(WaitFor([this] { return server_->scheduler().stats().queued == 1; }));
  }
  EXPECT_TRUE(WaitFor([this] {
    SchedulerStats s = server_->scheduler().stats();
    return s.queued == 0 && s.requests_aborted == 2;
  }));
  ASSERT_EQ(Post("/continue_generation", "").status, 200);
  EXPECT_EQ(Post("/generate", GenerateBody("Still here", 5)).status, 200);
}

TEST_F(EngineServerTest, AFullQueueAnswers503) {
  EngineOptions options;
  options.scheduler.max_running = 1;
  options.scheduler.max_queued = 1;
  Start(options);
  ASSERT_EQ(Post("/pause_generation", R"({"mode": "in_place"})").status, 200);
  std::vector<std::future<HttpResponse>> held;
  for (int i = 0; i < 2; ++i) {
    held.push_back(
        std::async(std::launch::async, [this] { return Post("/generate", GenerateBody("Q", 5)); }));
    const int64_t want = i + 1;
    ASSERT_TRUE(WaitFor([this, want] { return server_->scheduler().stats().queued == want; }));
  }
  HttpResponse full = Post("/generate", GenerateBody("Q", 5));
  EXPECT_EQ(full.status, 503);
  EXPECT_EQ(full.headers.Get("retry-after"), "1");
  EXPECT_EQ(JsonGet(full.body, "type"), "EngineBusy");
  EXPECT_THAT(JsonGet(full.body, "message").value_or(""), HasSubstr("full"));
  ASSERT_EQ(Post("/continue_generation", "").status, 200);
  for (auto& f : held) EXPECT_EQ(f.get().status, 200);
}

TEST_F(EngineServerTest, BadInputGets4xxWithAMessageAndTheEngineKeepsServing) {
  Publish();
  ASSERT_TRUE(
      testing::PublishDelta(tmp_ / "other" / "updates", 1, versions_[0], versions_[1], "run-b")
          .ok());
  Start();
  const std::string too_long = absl::StrCat(
      R"({"input_ids": )",
      IdsJson(std::vector<int32_t>(static_cast<size_t>(config_.max_position_embeddings + 1), 65)),
      "}");
  std::string other_run = StageBody(1, "cpu");
  other_run.replace(other_run.find(updates_.string()), updates_.string().size(),
                    (tmp_ / "other" / "updates").string());
  std::string missing_base = StageBody(1, "cpu");
  missing_base.replace(missing_base.find(boot_.string()), boot_.string().size(),
                       (tmp_ / "nope").string());
  std::string missing_source = StageBody(1, "cpu");
  missing_source.replace(missing_source.find(updates_.string()), updates_.string().size(),
                         (tmp_ / "nowhere").string());
  struct Case {
    std::string method, path, body;
    int status;
    std::string message;
  };
  const std::vector<Case> cases = {
      {"POST", "/generate", "{\"text\": ", 400, "not valid JSON"},
      {"POST", "/generate", R"({"text": 12})", 400, "must be a string"},
      {"POST", "/generate", R"({"text": "a", "sampling_params": {"top_k": "3"}})", 400, "top_k"},
      {"POST", "/generate", too_long, 400, "context"},
      {"POST", "/generate", R"({"text": "a", "sampling_params": {"max_new_tokens": 5000}})", 400,
       "max_new_tokens"},
      {"POST", "/generate", R"({"text": "a", "sampling_params": {"best": 1}})", 400,
       "unknown sampling parameter"},
      {"POST", "/v1/completions", R"({"prompt": "a", "n": 3})", 400, "not supported"},
      {"POST", "/v1/chat/completions", R"({"messages": []})", 400, "message"},
      {"POST", "/stage_weight_update", missing_base, 400, "base_checkpoint_dir"},
      {"POST", "/stage_weight_update", missing_source, 400, "checkpoint_source_dir"},
      {"POST", "/stage_weight_update", StageBody(8, "cpu"), 400, "weight_v000008"},
      {"POST", "/stage_weight_update", other_run, 400, "run-b"},
      {"POST", "/stage_weight_update", R"({"destination": "cpu"})", 400, "base_checkpoint_dir"},
      {"POST", "/update_weights_from_cpu", R"({"target_version": 3})", 400, "never staged"},
      {"POST", "/update_weights_from_disk", R"({"model_path": "/no/such/dir"})", 400,
       "/no/such/dir"},
      {"POST", "/pause_generation", R"({"mode": "soon"})", 400, "pause mode"},
      {"POST", "/abort_request", R"({})", 400, "rid"},
      {"GET", "/generate", "", 405, "POST"},
      {"GET", "/no_such_route", "", 404, "no route"},
  };
  for (const Case& c : cases) {
    HttpResponse r = Call(c.method, c.path, c.body);
    EXPECT_EQ(r.status, c.status) << c.path << " " << c.body << " -> " << r.body;
    EXPECT_THAT(r.body, HasSubstr(c.message)) << c.path << " " << c.body;
  }
  EXPECT_EQ(Get("/health").status, 200);
  ExpectGeneratesLike(*Weights(0), "0");
}

TEST_F(EngineServerTest, AnApiKeyGuardsEveryRouteButHealth) {
  EngineOptions options;
  options.api_key = "engine-key";
  Start(options);
  EXPECT_EQ(Get("/health").status, 200);
  for (const auto& [method, path] : std::vector<std::pair<std::string, std::string>>{
           {"POST", "/generate"}, {"GET", "/model_info"}, {"POST", "/pause_generation"}}) {
    HttpResponse refused = Call(method, path, method == "POST" ? "{}" : "");
    EXPECT_EQ(refused.status, 401) << method << " " << path;
    EXPECT_THAT(refused.body, HasSubstr("Unauthorized"));
  }
  FetchOptions with;
  with.headers.Set("Authorization", "Bearer engine-key");
  auto answer = HttpFetch("POST", server_->url() + "/generate", GenerateBody("Check", 4), with);
  ASSERT_TRUE(answer.ok()) << answer.status();
  EXPECT_EQ(answer->status, 200) << answer->body;
  EXPECT_EQ(HttpFetch("GET", server_->url() + "/model_info", {}, with)->status, 200);
}

TEST_F(EngineServerTest, HealthIs503WhileTheSchedulerMakesNoProgress) {
  std::atomic<int64_t> fake_ms{0};
  EngineOptions options;
  options.scheduler.stall_timeout = std::chrono::seconds(5);
  options.scheduler.clock = [&fake_ms] {
    return std::chrono::steady_clock::time_point(std::chrono::milliseconds(fake_ms.load()));
  };
  Start(options);
  HttpResponse ok = Get("/health");
  EXPECT_EQ(ok.status, 200);
  EXPECT_EQ(JsonGet(ok.body, "weight_version"), "0");
  gate_.Arm([] { return true; });
  ASSERT_TRUE(gate_.WaitHeld());
  fake_ms = 30'000;
  HttpResponse stalled = Get("/health");
  EXPECT_EQ(stalled.status, 503);
  EXPECT_THAT(stalled.body, HasSubstr("no progress"));
  EXPECT_EQ(JsonGet(Get("/server_info").body, "healthy"), "false");
  gate_.Release();
  EXPECT_TRUE(WaitFor([this] { return Get("/health").status == 200; }));
  server_->Shutdown();  // before fake_ms goes away
}

TEST_F(EngineServerTest, FlushCacheOnlyWhenIdle) {
  Start();
  EXPECT_EQ(Get("/flush_cache").status, 200);
  ASSERT_EQ(Post("/pause_generation", R"({"mode": "in_place"})").status, 200);
  auto queued = std::async(std::launch::async,
                           [this] { return Post("/generate", GenerateBody("Flush", 3)); });
  ASSERT_TRUE(WaitFor([this] { return server_->scheduler().stats().queued == 1; }));
  HttpResponse busy = Post("/flush_cache", "");
  EXPECT_EQ(busy.status, 400);
  EXPECT_THAT(busy.body, HasSubstr("cache not flushed"));
  ASSERT_EQ(Post("/continue_generation", "").status, 200);
  EXPECT_EQ(queued.get().status, 200);
  EXPECT_EQ(Post("/flush_cache", "").status, 200);
}

TEST_F(EngineServerTest, InfoRoutesReportTheBootVersionAndConfiguration) {
  EngineOptions options;
  options.boot_version = 7;
  Start(options);
  const std::string info = Get("/server_info").body;
  EXPECT_EQ(JsonGet(info, "weight_version"), "7");
  EXPECT_EQ(JsonGet(info, "weight_version_id"), "run-a/weight_v000007");
  EXPECT_EQ(JsonGet(info, "boot_version"), "7");
  EXPECT_EQ(JsonGet(info, "paused"), "false");
  const std::string model = Get("/model_info").body;
  EXPECT_EQ(JsonGet(model, "weight_version"), "7");
  EXPECT_EQ(JsonGet(model, "config.hidden_size"), "48");
  EXPECT_EQ(JsonGet(Get("/get_model_info").body, "is_generation"), "true");
  EXPECT_EQ(JsonGet(Get("/v1/models").body, "data.0.id"), "test-model");
  ExpectGeneratesLike(*Weights(0), "7");
}

// What a sidecar verifies: the fingerprint of the serving weights equals
// what the checkpoint's own tensors give, follows every load, and the
// instance id is the process's.
TEST_F(EngineServerTest, WhatItHoldsIsReportedAsAFingerprintAndAnInstance) {
  Publish();
  Start();
  auto fingerprint = [](const fs::path& dir) {
    absl::StatusOr<TensorChecksums> c = HashCheckpointTensors(dir);
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() ? WeightsFingerprint(*c).ToHex() : std::string();
  };
  const std::string info = Get("/model_info").body;
  EXPECT_EQ(JsonGet(info, "weights_fingerprint"), fingerprint(boot_));
  EXPECT_EQ(JsonGet(Get("/server_info").body, "weights_fingerprint"), fingerprint(boot_));
  const std::string instance = JsonGet(info, "instance_id").value_or("");
  EXPECT_EQ(instance.size(), 32u);

  ASSERT_EQ(Post("/stage_weight_update", StageBody(4, "disk")).status, 200);
  ASSERT_EQ(Post("/update_weights_from_disk",
                 absl::StrCat(R"({"model_path": ")", local_.string(), R"("})"))
                .status,
            200);
  const std::string after = Get("/model_info").body;
  EXPECT_EQ(JsonGet(after, "weights_fingerprint"), fingerprint(local_));
  EXPECT_NE(fingerprint(local_), fingerprint(boot_));
  EXPECT_EQ(JsonGet(after, "weight_version_id"), "run-a/weight_v000004");
  EXPECT_EQ(JsonGet(after, "instance_id"), instance);

  EngineOptions other;
  other.model_dir = boot_;
  absl::StatusOr<std::unique_ptr<EngineServer>> second = EngineServer::Start(other);
  ASSERT_TRUE(second.ok()) << second.status();
  EXPECT_NE((*second)->Status().instance_id, instance);
}

// A label names one set of weights: a load that would leave the served label
}  // namespace
}  // namespace stitch::server_test

#include "stitch/refengine/scheduler.h"

#include <atomic>
#include <chrono>
#include <optional>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "absl/synchronization/mutex.h"
#include "absl/synchronization/notification.h"
#include "stitch/refengine/engine_test_util.h"
#include "stitch/refengine/tokenizer.h"

namespace stitch {
namespace {

using ::stitch::testing::EngineTestConfig;
using ::stitch::testing::EngineTestTensors;
using ::stitch::testing::Ids;
using ::stitch::testing::Logprobs;
using ::stitch::testing::ReferenceGenerate;
using ::stitch::testing::ReferenceOptions;
using ::stitch::testing::SchedulerGate;
using ::stitch::testing::SplitGenerate;
using ::stitch::testing::WaitFor;
using ::testing::HasSubstr;

constexpr auto kWait = absl::Seconds(30);

// Collects one request's updates; thread-safe.
class Collector {
 public:
  GenerationSink Sink() {
    return [this](GenerationUpdate u) {
      absl::MutexLock lock(&mu_);
      for (const GeneratedToken& t : u.tokens) {
        tokens_.push_back(t);
        versions_.push_back(u.weight_version.version);
      }
      text_ += u.text;
      chunks_.push_back(u.text);
      if (u.finish) {
        finish_ = u.finish;
        done_.Notify();
      }
    };
  }
  bool Wait() { return done_.WaitForNotificationWithTimeout(kWait); }
  std::vector<int32_t> ids() const {
    absl::MutexLock lock(&mu_);
    std::vector<int32_t> out;
    for (const GeneratedToken& t : tokens_) out.push_back(t.id);
    return out;
  }
  std::vector<double> logprobs() const {
    absl::MutexLock lock(&mu_);
    std::vector<double> out;
    for (const GeneratedToken& t : tokens_) out.push_back(t.logprob);
    return out;
  }
  std::vector<int64_t> versions() const {
    absl::MutexLock lock(&mu_);
    return versions_;
  }
  size_t size() const {
    absl::MutexLock lock(&mu_);
    return tokens_.size();
  }
  std::string text() const {
    absl::MutexLock lock(&mu_);
    return text_;
  }
  FinishReason finish() const {
    absl::MutexLock lock(&mu_);
    return finish_.value_or(FinishReason{});
  }

 private:
  mutable absl::Mutex mu_;
  std::vector<GeneratedToken> tokens_ ABSL_GUARDED_BY(mu_);
  std::vector<int64_t> versions_ ABSL_GUARDED_BY(mu_);
  std::string text_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> chunks_ ABSL_GUARDED_BY(mu_);
  std::optional<FinishReason> finish_ ABSL_GUARDED_BY(mu_);
  absl::Notification done_;
};

GenerationRequest Request(std::vector<int32_t> prompt, int64_t max_new_tokens, float temperature,
                          uint64_t seed, std::string rid = "r") {
  GenerationRequest r;
  r.rid = std::move(rid);
  r.prompt = std::move(prompt);
  r.max_new_tokens = max_new_tokens;
  r.sampling.temperature = temperature;
  r.sampling.seed = seed;
  r.ignore_eos = true;
  return r;
}

ReferenceOptions Options(const GenerationRequest& r) {
  ReferenceOptions o;
  o.sampling = r.sampling;
  o.max_new_tokens = r.max_new_tokens;
  o.ignore_eos = r.ignore_eos;
  return o;
}

template <typename T>
struct Waiter {
  absl::Notification done;
  T value{};
  absl::AnyInvocable<void(T) &&> Callback() {
    return [this](T v) {
      value = std::move(v);
      done.Notify();
    };
  }
  T Get() {
    EXPECT_TRUE(done.WaitForNotificationWithTimeout(kWait));
    return value;
  }
};

class SchedulerTest : public ::testing::Test {
 protected:
  SchedulerTest()
      : config_(EngineTestConfig()),
        tensors_a_(EngineTestTensors(config_, 1)),
        tensors_b_(EngineTestTensors(config_, 2)),
        a_(testing::BuildWeights(config_, tensors_a_)),
        b_(testing::BuildWeights(config_, tensors_b_)) {}

  std::unique_ptr<Scheduler> Make(SchedulerOptions options = {}) {
    options.before_iteration = gate_.Hook();
    return std::make_unique<Scheduler>(a_, VersionRef{"run", 0}, options);
  }

  int64_t PauseNow(Scheduler& s, PauseMode mode) {
    Waiter<int64_t> w;
    s.Pause(mode, w.Callback());
    return w.Get();
  }
  void ContinueNow(Scheduler& s) {
    Waiter<bool> w;
    s.Continue(w.Callback());
    w.Get();
  }

  ModelConfig config_;
  std::vector<HostTensor> tensors_a_;
  std::vector<HostTensor> tensors_b_;
  std::shared_ptr<const ModelWeights> a_;
  std::shared_ptr<const ModelWeights> b_;
  SchedulerGate gate_;
};

TEST_F(SchedulerTest, GenerationMatchesAReferenceWithoutKvCache) {
  auto s = Make();
  for (float temperature : {0.0f, 0.9f}) {
    GenerationRequest r = Request(EncodeText("hello world", BosMode::kPrepend), 24, temperature, 7);
    Collector c;
    ASSERT_TRUE(s->Submit(r, c.Sink()).ok());
    ASSERT_TRUE(c.Wait());
    const auto ref = ReferenceGenerate(*a_, r.prompt, Options(r));
    EXPECT_EQ(c.ids(), Ids(ref)) << "temperature " << temperature;
    EXPECT_EQ(c.logprobs(), Logprobs(ref)) << "temperature " << temperature;
    EXPECT_EQ(c.finish().type, FinishType::kLength);
  }
}

TEST_F(SchedulerTest, BatchedRequestsGiveTheSameTokensAsOneAtATime) {
  std::vector<GenerationRequest> requests;
  for (int i = 0; i < 8; ++i) {
    std::string prompt(static_cast<size_t>(3 + 7 * i), static_cast<char>('a' + i));
    requests.push_back(Request(EncodeText(prompt, BosMode::kPrepend), 10 + 3 * i,
                               i % 2 == 0 ? 0.0f : 0.8f, 100 + static_cast<uint64_t>(i)));
  }
  std::vector<std::vector<int32_t>> alone_ids;
  std::vector<std::vector<double>> alone_logprobs;
  {
    auto s = Make();
    for (const GenerationRequest& r : requests) {
      Collector c;
      ASSERT_TRUE(s->Submit(r, c.Sink()).ok());
      ASSERT_TRUE(c.Wait());
      alone_ids.push_back(c.ids());
      alone_logprobs.push_back(c.logprobs());
    }
  }
  SchedulerOptions options;
  options.prefill_chunk = 5;  // prompts are fed in several steps, interleaved with decoding
  auto s = Make(options);
  // Hold the scheduler so that every request joins the same first batch.
  PauseNow(*s, PauseMode::kInPlace);
  std::vector<std::unique_ptr<Collector>> collectors;
  for (const GenerationRequest& r : requests) {
    collectors.push_back(std::make_unique<Collector>());
    ASSERT_TRUE(s->Submit(r, collectors.back()->Sink()).ok());
  }
  ContinueNow(*s);
  for (size_t i = 0; i < requests.size(); ++i) {
    ASSERT_TRUE(collectors[i]->Wait());
    EXPECT_EQ(collectors[i]->ids(), alone_ids[i]) << "request " << i;
    EXPECT_EQ(collectors[i]->logprobs(), alone_logprobs[i]) << "request " << i;
    EXPECT_EQ(collectors[i]->ids().size(), static_cast<size_t>(requests[i].max_new_tokens));
  }
  EXPECT_GT(s->stats().steps, 0u);
}

TEST_F(SchedulerTest, StopStringEndsTheTextBeforeItAndNeverStreamsPastIt) {
  auto s = Make();
  GenerationRequest probe = Request(EncodeText("stop strings", BosMode::kPrepend), 80, 0.0f, 0);
  const std::vector<int32_t> ref = Ids(ReferenceGenerate(*a_, probe.prompt, Options(probe)));
  // Two consecutive ASCII bytes of the reference output make the stop string.
  auto printable = [](int32_t id) { return id >= 32 && id < 127; };
  size_t at = 4;
  while (at + 1 < ref.size() && !(printable(ref[at]) && printable(ref[at + 1]))) ++at;
  ASSERT_LT(at + 1, ref.size()) << "the reference output has no two ASCII bytes in a row";
  const std::string stop{static_cast<char>(ref[at]), static_cast<char>(ref[at + 1])};
  const std::string full_text = DecodeTokens(ref);
  const size_t cut = full_text.find(stop);
  ASSERT_NE(cut, std::string::npos);

  GenerationRequest r = probe;
  r.stop = {stop, "\x01\x02\x03never"};
  Collector c;
  ASSERT_TRUE(s->Submit(r, c.Sink()).ok());
  ASSERT_TRUE(c.Wait());
  EXPECT_EQ(c.finish().type, FinishType::kStop);
  EXPECT_EQ(c.finish().matched_text, stop);
  EXPECT_EQ(c.text(), full_text.substr(0, cut));

  GenerationRequest keep = r;
  keep.keep_stop_string = true;
  Collector k;
  ASSERT_TRUE(s->Submit(keep, k.Sink()).ok());
  ASSERT_TRUE(k.Wait());
  EXPECT_EQ(k.text(), full_text.substr(0, cut + stop.size()));
}

TEST_F(SchedulerTest, StopTokenIdsEndTheGenerationAndZeroTokensFinishAtOnce) {
  auto s = Make();
  GenerationRequest probe = Request(EncodeText("tokens", BosMode::kPrepend), 30, 0.0f, 0);
  const std::vector<int32_t> ref = Ids(ReferenceGenerate(*a_, probe.prompt, Options(probe)));
  GenerationRequest r = probe;
  r.stop_token_ids = {ref[5]};
  Collector c;
  ASSERT_TRUE(s->Submit(r, c.Sink()).ok());
  ASSERT_TRUE(c.Wait());
  const size_t first = static_cast<size_t>(std::find(ref.begin(), ref.end(), ref[5]) - ref.begin());
  EXPECT_EQ(c.ids(), std::vector<int32_t>(ref.begin(), ref.begin() + first + 1));
  EXPECT_EQ(c.finish().type, FinishType::kStop);
  EXPECT_EQ(c.finish().matched_token, ref[5]);

  GenerationRequest zero = probe;
  zero.max_new_tokens = 0;
  Collector z;
  ASSERT_TRUE(s->Submit(zero, z.Sink()).ok());
  ASSERT_TRUE(z.Wait());
  EXPECT_TRUE(z.ids().empty());
  EXPECT_EQ(z.finish().type, FinishType::kLength);
}

TEST_F(SchedulerTest, RefusesBadPromptsAndAFullQueue) {
  SchedulerOptions options;
  options.max_running = 1;
  options.max_queued = 1;
  auto s = Make(options);
  GenerationRequest too_long = Request(
      std::vector<int32_t>(static_cast<size_t>(config_.max_position_embeddings + 1), 65), 4, 0, 0);
  absl::StatusOr<uint64_t> r = s->Submit(too_long, [](GenerationUpdate) {});
  ASSERT_FALSE(r.ok());
  EXPECT_TRUE(absl::IsInvalidArgument(r.status()));
  EXPECT_THAT(r.status().message(), HasSubstr("context"));
  absl::StatusOr<uint64_t> bad_id =
      s->Submit(Request({65, 9999}, 4, 0, 0), [](GenerationUpdate) {});
  EXPECT_TRUE(absl::IsInvalidArgument(bad_id.status()));

  PauseNow(*s, PauseMode::kInPlace);
  Collector a, b;
  ASSERT_TRUE(s->Submit(Request({65, 66}, 4, 0, 0), a.Sink()).ok());
  ASSERT_TRUE(s->Submit(Request({65, 67}, 4, 0, 0), b.Sink()).ok());
  absl::StatusOr<uint64_t> full = s->Submit(Request({65, 68}, 4, 0, 0), [](GenerationUpdate) {});
  ASSERT_FALSE(full.ok());
  EXPECT_TRUE(absl::IsUnavailable(full.status()));
  EXPECT_THAT(full.status().message(), HasSubstr("full"));
  ContinueNow(*s);
  ASSERT_TRUE(a.Wait());
  ASSERT_TRUE(b.Wait());
  EXPECT_EQ(a.ids().size(), 4u);
  EXPECT_TRUE(s->Submit(Request({65, 68}, 4, 0, 0), [](GenerationUpdate) {}).ok());
}

TEST_F(SchedulerTest, AbortsByRidPrefixAndAll) {
  auto s = Make();
  PauseNow(*s, PauseMode::kInPlace);
  Collector x1, x2, y;
  ASSERT_TRUE(s->Submit(Request({65}, 50, 0, 0, "job-1-a"), x1.Sink()).ok());
  ASSERT_TRUE(s->Submit(Request({66}, 50, 0, 0, "job-1-b"), x2.Sink()).ok());
  ASSERT_TRUE(s->Submit(Request({67}, 50, 0, 0, "job-2"), y.Sink()).ok());
  Waiter<int64_t> some;
  s->AbortMatching(Scheduler::AbortScope::kRidPrefix, "job-1", some.Callback());
  EXPECT_EQ(some.Get(), 2);
  ASSERT_TRUE(x1.Wait());
  ASSERT_TRUE(x2.Wait());
  EXPECT_EQ(x1.finish().type, FinishType::kAbort);
  EXPECT_THAT(x1.finish().message, HasSubstr("job-1"));
  EXPECT_EQ(s->stats().queued, 1);
  Waiter<int64_t> all;
  s->AbortMatching(Scheduler::AbortScope::kAll, "", all.Callback());
  EXPECT_EQ(all.Get(), 1);
  ASSERT_TRUE(y.Wait());
  EXPECT_EQ(y.finish().type, FinishType::kAbort);
  EXPECT_EQ(s->stats().requests_aborted, 3u);
}

// vLLM aborts by exact request id: an id that merely starts with another's
// is not touched.
TEST_F(SchedulerTest, AbortsByExactRid) {
  auto s = Make();
  PauseNow(*s, PauseMode::kInPlace);
  Collector exact, longer;
  ASSERT_TRUE(s->Submit(Request({65}, 50, 0, 0, "cmpl-a-0"), exact.Sink()).ok());
  ASSERT_TRUE(s->Submit(Request({66}, 50, 0, 0, "cmpl-a-0-0"), longer.Sink()).ok());
  Waiter<int64_t> aborted;
  s->AbortMatching(Scheduler::AbortScope::kRidExact, "cmpl-a-0", aborted.Callback());
  EXPECT_EQ(aborted.Get(), 1);
  ASSERT_TRUE(exact.Wait());
  EXPECT_EQ(exact.finish().type, FinishType::kAbort);
  EXPECT_EQ(s->stats().queued, 1);
  ContinueNow(*s);
  ASSERT_TRUE(longer.Wait());
  EXPECT_EQ(longer.finish().type, FinishType::kLength);
}

// Submits `r`, holds the scheduler once it produced `k` tokens, pauses it
// there, and returns; the request is then resident with exactly k tokens.
// The gate is armed before the request exists: a small model generates
// faster than a test thread can arm it afterwards.
class InFlightTest : public SchedulerTest {
 protected:
  void SubmitAndPauseAfter(Scheduler& s, const GenerationRequest& r, Collector& c, size_t k,
                           PauseMode mode) {
    gate_.Arm([&c, k] { return c.size() >= k; });
    ASSERT_TRUE(s.Submit(r, c.Sink()).ok());
    ASSERT_TRUE(gate_.WaitHeld());
    Waiter<int64_t> paused;
    s.Pause(mode, paused.Callback());
    gate_.Release();
    EXPECT_EQ(paused.Get(), 1);
    ASSERT_EQ(c.size(), k);
  }
};

TEST_F(InFlightTest, InPlacePauseAndSwapContinueOnTheNewWeights) {
  auto s = Make();
  GenerationRequest r = Request(EncodeText("in flight", BosMode::kPrepend), 40, 0.0f, 0);
  Collector c;
  SubmitAndPauseAfter(*s, r, c, 6, PauseMode::kInPlace);
  EXPECT_EQ(s->stats().running, 1);

  Waiter<absl::StatusOr<SwapResult>> swapped;
  s->SwapWeights(
      b_, VersionRef{"run", 1}, [] {}, swapped.Callback());
  absl::StatusOr<SwapResult> result = swapped.Get();
  ASSERT_TRUE(result.ok()) << result.status();
  EXPECT_EQ(result->previous, a_);
  EXPECT_EQ(result->previous_version.version, 0);
  EXPECT_EQ(result->resident_requests, 1);
  EXPECT_EQ(s->weight_version().version, 1);
  ContinueNow(*s);
  ASSERT_TRUE(c.Wait());

  const auto expected = SplitGenerate(*a_, *b_, r.prompt, Options(r), 6, /*drop_cache=*/false);
  EXPECT_EQ(c.ids(), Ids(expected));
  EXPECT_EQ(c.logprobs(), Logprobs(expected));
  // The test can fail: all-A and a retract-style recompute differ.
  EXPECT_NE(c.ids(), Ids(ReferenceGenerate(*a_, r.prompt, Options(r))));
  EXPECT_NE(Logprobs(expected),
            Logprobs(SplitGenerate(*a_, *b_, r.prompt, Options(r), 6, /*drop_cache=*/true)));
  std::vector<int64_t> versions(6, 0);
  versions.resize(40, 1);
  EXPECT_EQ(c.versions(), versions);
}

// vLLM's `wait`: what runs when the pause is asked for runs to its end; what
// arrives afterwards waits until generation continues.
TEST_F(InFlightTest, WaitPauseLetsRequestsInFlightFinishAndHoldsLaterOnes) {
  auto s = Make();
  Collector first, later;
  gate_.Arm([&first] { return first.size() >= 3; });
  ASSERT_TRUE(s->Submit(Request({65, 66}, 30, 0, 0, "first"), first.Sink()).ok());
  ASSERT_TRUE(gate_.WaitHeld());
  Waiter<int64_t> paused;
  s->Pause(PauseMode::kWait, paused.Callback());
  // Submitted after the pause was asked for: it waits behind it, even though
  // the scheduler has not run the pause yet.
  ASSERT_TRUE(s->Submit(Request({67}, 5, 0, 0, "later"), later.Sink()).ok());
  gate_.Release();
  // The pause answers once the request in flight has run to its end.
  EXPECT_EQ(paused.Get(), 1);
  ASSERT_TRUE(first.Wait());
  EXPECT_EQ(first.finish().type, FinishType::kLength);
  EXPECT_EQ(first.size(), 30u);
  const SchedulerStats stats = s->stats();
  EXPECT_TRUE(stats.paused);
  EXPECT_FALSE(stats.draining);
  EXPECT_EQ(stats.pause_mode, PauseMode::kWait);
  EXPECT_EQ(stats.queued, 1);
  EXPECT_EQ(later.size(), 0u);
  ContinueNow(*s);
  ASSERT_TRUE(later.Wait());
  EXPECT_EQ(later.size(), 5u);
}

TEST_F(InFlightTest, RetractRecomputesUnderTheWeightsCurrentAtContinue) {
  auto s = Make();
  GenerationRequest r = Request(EncodeText("retract", BosMode::kPrepend), 30, 0.7f, 11);
  Collector c;
  SubmitAndPauseAfter(*s, r, c, 9, PauseMode::kRetract);
  EXPECT_EQ(s->stats().running, 0);
  EXPECT_EQ(s->stats().queued, 1);
  Waiter<absl::StatusOr<SwapResult>> swapped;
  s->SwapWeights(
      b_, VersionRef{"run", 1}, [] {}, swapped.Callback());
  ASSERT_TRUE(swapped.Get().ok());
  ContinueNow(*s);
  ASSERT_TRUE(c.Wait());
  const auto expected = SplitGenerate(*a_, *b_, r.prompt, Options(r), 9, /*drop_cache=*/true);
  EXPECT_EQ(c.ids(), Ids(expected));
  EXPECT_EQ(c.logprobs(), Logprobs(expected));
}

TEST_F(InFlightTest, AbortPauseEndsRunningRequests) {
  auto s = Make();
  Collector c;
  gate_.Arm([&c] { return c.size() >= 3; });
  ASSERT_TRUE(s->Submit(Request({65, 66}, 100, 0, 0), c.Sink()).ok());
  ASSERT_TRUE(gate_.WaitHeld());
  Waiter<int64_t> paused;
  s->Pause(PauseMode::kAbort, paused.Callback());
  gate_.Release();
  EXPECT_EQ(paused.Get(), 1);
  ASSERT_TRUE(c.Wait());
  EXPECT_EQ(c.finish().type, FinishType::kAbort);
  EXPECT_TRUE(s->stats().paused);
}

TEST_F(SchedulerTest, SwapRefusesAnotherArchitecture) {
  auto s = Make();
  ModelConfig other = config_;
  other.num_hidden_layers = 3;
  auto w = testing::BuildWeights(other, EngineTestTensors(other, 3));
  ASSERT_NE(w, nullptr);
  Waiter<absl::StatusOr<SwapResult>> swapped;
  s->SwapWeights(
      w, VersionRef{"run", 1}, [] {}, swapped.Callback());
  absl::StatusOr<SwapResult> result = swapped.Get();
  EXPECT_TRUE(absl::IsInvalidArgument(result.status()));
  EXPECT_EQ(s->weight_version().version, 0);
}

TEST_F(SchedulerTest, FlushCacheOnlyWhenIdle) {
  auto s = Make();
  Waiter<absl::Status> idle;
  s->FlushCache(idle.Callback());
  EXPECT_TRUE(idle.Get().ok());
  PauseNow(*s, PauseMode::kInPlace);
  Collector c;
  ASSERT_TRUE(s->Submit(Request({65}, 5, 0, 0), c.Sink()).ok());
  Waiter<absl::Status> busy;
  s->FlushCache(busy.Callback());
  absl::Status status = busy.Get();
  EXPECT_TRUE(absl::IsFailedPrecondition(status));
  EXPECT_THAT(status.message(), HasSubstr("1 queued"));
  ContinueNow(*s);
  ASSERT_TRUE(c.Wait());
}

TEST_F(SchedulerTest, HealthFollowsTheHeartbeat) {
  std::atomic<int64_t> fake_ms{0};
  SchedulerOptions options;
  options.stall_timeout = std::chrono::seconds(5);
  options.clock = [&fake_ms] {
    return std::chrono::steady_clock::time_point(std::chrono::milliseconds(fake_ms.load()));
  };
  auto s = Make(options);
  EXPECT_TRUE(s->Healthy());
  gate_.Arm([] { return true; });
  ASSERT_TRUE(gate_.WaitHeld());
  fake_ms = 60'000;
  EXPECT_FALSE(s->Healthy());
  EXPECT_GE(s->SecondsSinceHeartbeat(), 55.0);
  gate_.Release();
  EXPECT_TRUE(WaitFor([&] { return s->Healthy(); }));
}

TEST_F(SchedulerTest, ShutdownAbortsWhatIsLeftAndAnswersCommands) {
  SchedulerOptions options;
  // The held step resumes only once shutdown has begun, so the request
  // cannot run to its end first.
  options.on_stopping = [this] { gate_.Release(); };
  auto s = Make(options);
  PauseNow(*s, PauseMode::kInPlace);
  Collector c;
  ASSERT_TRUE(s->Submit(Request({65}, 5, 0, 0), c.Sink()).ok());
  gate_.Arm([] { return true; });
  ASSERT_TRUE(gate_.WaitHeld());
  Waiter<bool> continued;
  s->Continue(continued.Callback());
  s.reset();
  EXPECT_TRUE(continued.done.HasBeenNotified());
  ASSERT_TRUE(c.Wait());
  EXPECT_EQ(c.finish().type, FinishType::kAbort);
}

}  // namespace
}  // namespace stitch

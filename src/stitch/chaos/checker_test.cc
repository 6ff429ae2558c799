#include "stitch/chaos/checker.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace stitch {
namespace {

using ::testing::HasSubstr;
using ::testing::IsEmpty;

RunEntry Run() {
  RunEntry run;
  run.seed = 5;
  run.minutes = 1;
  run.store = "fs";
  run.replicas = 2;
  Fault f;
  f.id = 1;
  f.kind = FaultKind::kEngineKill;
  f.start_s = 10;
  f.duration_s = 5;
  f.replica = 0;
  run.schedule = {f};
  return run;
}

RequestRecord Answered(int64_t id, double at, int64_t start, int64_t end) {
  RequestRecord r;
  r.id = id;
  r.via = "gateway";
  r.route = "generate";
  r.sent_s = at;
  r.done_s = at + 0.1;
  r.status = 200;
  r.outcome = Outcome::kAnswered;
  r.start = start;
  r.end = end;
  r.verdict = start == end ? Verdict::kSame : Verdict::kCrossed;
  return r;
}

RequestRecord Refused(int64_t id, double at) {
  RequestRecord r;
  r.id = id;
  r.via = "r0";
  r.route = "completions";
  r.sent_s = at;
  r.done_s = at + 0.1;
  r.status = 503;
  r.outcome = Outcome::kRetryable;
  return r;
}

RequestRecord Probe(int64_t id, double at, double took) {
  RequestRecord r = Answered(id, at, 2, 2);
  r.probe = true;
  r.done_s = at + took;
  return r;
}

FaultEntry Applied(const Fault& f, double from, double to) {
  FaultEntry e;
  e.fault = f;
  e.applied_s = from;
  e.ended_s = to;
  return e;
}

EndEntry CleanEnd(int64_t pointer) {
  EndEntry e;
  e.final_pointer = pointer;
  e.converged = true;
  return e;
}

std::vector<HistoryEntry> CleanHistory() {
  const RunEntry run = Run();
  return {run,
          PublishEntry{1, true, 1, 1.1, "published"},
          PublishEntry{2, false, 2, 2.1, "published"},
          PointerEntry{2.2, 2, true, ""},
          Answered(1, 3, 1, 1),
          Answered(2, 4, 1, 2),
          Applied(run.schedule[0], 10, 15),
          Answered(3, 11, 2, 2),
          Refused(4, 12),
          Refused(5, 14),
          Probe(6, 15.5, 0.2),
          Probe(7, 15.2, 0.9),
          Answered(8, 20, 2, 2),
          CleanEnd(2)};
}

TEST(CheckerTest, ACleanHistoryPassesWithItsFigures) {
  const ChaosFigures f = CheckHistory(CleanHistory());
  EXPECT_THAT(f.failures, IsEmpty());
  EXPECT_EQ(f.requests, 8);
  EXPECT_EQ(f.answered, 6);
  EXPECT_EQ(f.retryable, 2);
  EXPECT_EQ(f.via_gateway, 6);
  EXPECT_EQ(f.via_sidecar, 2);
  EXPECT_EQ(f.probes, 2);
  EXPECT_EQ(f.judged_same, 5);
  EXPECT_EQ(f.judged_crossed, 1);
  EXPECT_EQ(f.published_full, 1);
  EXPECT_EQ(f.published_delta, 1);
  ASSERT_EQ(f.kinds.size(), 1u);
  EXPECT_EQ(f.kinds[0].kind, FaultKind::kEngineKill);
  EXPECT_EQ(f.kinds[0].requests, 3);
  EXPECT_DOUBLE_EQ(f.kinds[0].availability(), 1.0 / 3.0);
  EXPECT_EQ(f.kinds[0].alone_requests, 3);
  // Recovery: the earliest success of a probe sent after the end (15.2 +
  // 0.9 = 16.1 against 15.5 + 0.2 = 15.7).
  ASSERT_EQ(f.kinds[0].recovery_s.size(), 1u);
  EXPECT_NEAR(f.kinds[0].recovery_s[0], 0.7, 1e-9);
  EXPECT_EQ(f.calm_requests, 5);
  const std::string text = FormatFigures(f);
  EXPECT_THAT(text, HasSubstr("checks       all passed"));
  EXPECT_THAT(text, HasSubstr("engine_kill"));
  EXPECT_THAT(text, HasSubstr("33.3%"));
}

TEST(CheckerTest, ConstraintViolationsAreCounted) {
  std::vector<HistoryEntry> h = CleanHistory();
  RequestRecord min = Answered(20, 5, 1, 1);
  min.constraint = VersionConstraint::AtLeast(2);
  RequestRecord exact = Answered(21, 5, 1, 2);
  exact.constraint = VersionConstraint::Exact(1);
  RequestRecord backwards = Answered(22, 5, 2, 1);
  RequestRecord fine = Answered(23, 5, 2, 2);
  fine.constraint = VersionConstraint::AtLeast(1);
  h.insert(h.begin() + 1, {min, exact, backwards, fine});
  const ChaosFigures f = CheckHistory(h);
  EXPECT_EQ(f.constraint_violations, 3);
  ASSERT_EQ(f.failures.size(), 1u);
  EXPECT_THAT(f.failures[0], HasSubstr("3 answers violated their constraint"));
  EXPECT_THAT(FormatFigures(f), HasSubstr("request #20"));
}

TEST(CheckerTest, AnswersFromUnpublishedVersionsAndWrongLabelsAreCounted) {
  std::vector<HistoryEntry> h = CleanHistory();
  RequestRecord ahead = Answered(30, 5, 3, 3);
  RequestRecord wrong = Answered(31, 5, 2, 2);
  wrong.verdict = Verdict::kMismatch;
  wrong.matches = 1;
  RequestRecord unjudged = Answered(32, 5, 1, 2);
  unjudged.verdict = Verdict::kUnjudged;
  h.insert(h.begin() + 1, {ahead, wrong, unjudged});
  const ChaosFigures f = CheckHistory(h);
  EXPECT_EQ(f.unpublished, 1);
  EXPECT_EQ(f.mislabelled, 1);
  EXPECT_EQ(f.unjudged, 1);
  EXPECT_EQ(f.failures.size(), 2u);
  EXPECT_THAT(FormatFigures(f), HasSubstr("it is v1's greedy output"));
}

// An answer the judge could not judge (the transformers judge failed) is
// never a pass: unlike one the oracle's search gave up on, it fails the run.
TEST(CheckerTest, AnswersTheJudgeFailedOnFailTheRun) {
  std::vector<HistoryEntry> h = CleanHistory();
  RequestRecord failed = Answered(40, 5, 2, 2);
  failed.verdict = Verdict::kUnjudged;
  failed.served_by = "r0";
  failed.error = "the transformers judge: the judge exited";
  h.insert(h.begin() + 1, failed);
  const ChaosFigures f = CheckHistory(h);
  EXPECT_EQ(f.judge_failed, 1);
  EXPECT_EQ(f.unjudged, 0);
  ASSERT_EQ(f.failures.size(), 1u);
  EXPECT_THAT(f.failures[0], HasSubstr("could not be judged"));
  EXPECT_THAT(FormatFigures(f), HasSubstr("the judge exited"));
}

// Spans the weights explain are counted; spans they do not fail the run.
TEST(CheckerTest, VersionSpansAreCountedAndWrongOnesFail) {
  std::vector<HistoryEntry> h = CleanHistory();
  RequestRecord crossed = Answered(50, 5, 1, 2);
  crossed.spans = "[[0,1],[4,2]]";
  crossed.spans_check = "exact";
  RequestRecord unknown = Answered(51, 5, 1, 2);
  unknown.spans = "unknown";
  unknown.spans_check = "unknown";
  h.insert(h.begin() + 1, {crossed, unknown});
  ChaosFigures f = CheckHistory(h);
  EXPECT_EQ(f.spans_exact, 1);
  EXPECT_EQ(f.spans_exact_crossed, 1);
  EXPECT_EQ(f.spans_unknown, 1);
  EXPECT_THAT(f.failures, IsEmpty());
  EXPECT_THAT(FormatFigures(f), HasSubstr("version spans: 1 exact (1 across a commit), 1 unknown"));
  RequestRecord wrong = Answered(52, 5, 1, 2);
  wrong.spans = "[[0,1],[3,2]]";
  wrong.spans_check = "wrong: the versions they name do not produce the answer";
  h.insert(h.begin() + 1, wrong);
  f = CheckHistory(h);
  EXPECT_EQ(f.spans_wrong, 1);
  ASSERT_EQ(f.failures.size(), 1u);
  EXPECT_THAT(f.failures[0], HasSubstr("version spans disagree"));
  EXPECT_THAT(FormatFigures(f), HasSubstr("spans [[0,1],[3,2]]: the versions they name"));
}

TEST(CheckerTest, OtherFailuresIncompletePointersAndLeftoversFail) {
  std::vector<HistoryEntry> h = CleanHistory();
  RequestRecord broken = Refused(40, 5);
  broken.status = 500;
  broken.outcome = Outcome::kFailed;
  h.insert(h.begin() + 1, broken);
  h.insert(h.begin() + 1, PointerEntry{3, 2, false, "weight_v000002: missing model.safetensors"});
  EndEntry end = CleanEnd(2);
  end.converged = false;
  end.leftover_processes = {"pid 77 (sidecar r1)"};
  end.leftover_temp = {"store/updates/.weight_v000002.tmp-1"};
  end.unfinished = {"engine r0: 2 running"};
  h.back() = end;
  const ChaosFigures f = CheckHistory(h);
  EXPECT_EQ(f.failed, 1);
  EXPECT_EQ(f.pointer_incomplete, 1);
  EXPECT_EQ(f.failures.size(), 6u);
  const std::string text = FormatFigures(f);
  EXPECT_THAT(text, HasSubstr("6 FAILED"));
  EXPECT_THAT(text, HasSubstr("pid 77"));
  EXPECT_THAT(text, HasSubstr("missing model.safetensors"));
}

TEST(CheckerTest, OverlappingFaultsOfAnotherKindAreLeftOutOfTheAloneFigures) {
  std::vector<HistoryEntry> h = CleanHistory();
  Fault gateway;
  gateway.id = 2;
  gateway.kind = FaultKind::kGatewayKill;
  // Overlaps the engine kill (10 s to 15 s) from 13.5 s on.
  h.insert(h.end() - 1, Applied(gateway, 13.5, 14.5));
  const ChaosFigures f = CheckHistory(h);
  ASSERT_EQ(f.kinds.size(), 2u);
  EXPECT_EQ(f.kinds[0].kind, FaultKind::kEngineKill);
  EXPECT_EQ(f.kinds[0].requests, 3);
  EXPECT_EQ(f.kinds[0].alone_requests, 2);  // request 5 (14 s) overlaps
  EXPECT_EQ(f.kinds[1].kind, FaultKind::kGatewayKill);
  EXPECT_EQ(f.kinds[1].requests, 1);
  EXPECT_EQ(f.kinds[1].alone_requests, 0);
  EXPECT_THAT(FormatFigures(f), HasSubstr("50.0% of 2"));
}

TEST(CheckerTest, AFaultNoProbeRecoveredFromFails) {
  std::vector<HistoryEntry> h;
  for (const HistoryEntry& e : CleanHistory()) {
    const auto* r = std::get_if<RequestRecord>(&e);
    if (r == nullptr || !r->probe) h.push_back(e);
  }
  const ChaosFigures f = CheckHistory(h);
  ASSERT_EQ(f.kinds.size(), 1u);
  EXPECT_EQ(f.kinds[0].not_recovered, 1);
  ASSERT_EQ(f.failures.size(), 1u);
  EXPECT_THAT(f.failures[0], HasSubstr("not recovered"));
}

TEST(CheckerTest, GrowthIsJudgedOnlyOverLongSeries) {
  CheckOptions options;
  options.growth_min_span_s = 100;
  std::vector<HistoryEntry> h = CleanHistory();
  for (int i = 0; i < 12; ++i) {
    const double at = 10.0 * i;
    // Steady within noise.
    h.push_back(ResourceEntry{at, "sidecar r0", 0, 10, 50000 + (i % 2) * 3000, 30 + i % 3});
    // Leaking 4 MiB and 4 descriptors a sample.
    h.push_back(ResourceEntry{at, "engine r1", 0, 11, 50000 + i * 4096, 20 + 4 * i});
    // Growing, but too short to judge.
    if (i < 5) h.push_back(ResourceEntry{at, "gateway", 1, 12, 10000 + i * 90000, 10});
  }
  const ChaosFigures f = CheckHistory(h, options);
  ASSERT_EQ(f.growth.size(), 3u);
  for (const GrowthFigures& g : f.growth) {
    EXPECT_EQ(g.rss_grew, g.process == "engine r1 #0") << g.process;
    EXPECT_EQ(g.files_grew, g.process == "engine r1 #0") << g.process;
  }
  ASSERT_EQ(f.failures.size(), 1u);
  EXPECT_THAT(f.failures[0], HasSubstr("grew"));
}

TEST(CheckerTest, AHistoryWithoutItsEndFails) {
  std::vector<HistoryEntry> h = CleanHistory();
  h.pop_back();
  const ChaosFigures f = CheckHistory(h);
  ASSERT_EQ(f.failures.size(), 1u);
  EXPECT_THAT(f.failures[0], HasSubstr("no end line"));
}

}  // namespace
}  // namespace stitch

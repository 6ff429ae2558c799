#include "stitch/demo/report.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace stitch {
namespace {

using ::testing::HasSubstr;
using ::testing::IsEmpty;
using ::testing::Not;

TEST(Percentile, NearestRank) {
  EXPECT_EQ(Percentile({}, 50), 0);
  EXPECT_EQ(Percentile({7}, 95), 7);
  std::vector<double> values = {5, 1, 4, 2, 3, 10, 9, 8, 7, 6};
  EXPECT_EQ(Percentile(values, 50), 5);
  EXPECT_EQ(Percentile(values, 95), 10);
  EXPECT_EQ(Percentile(values, 0), 1);
  EXPECT_EQ(Percentile(values, 100), 10);
  EXPECT_EQ(Percentile(values, 10), 1);
  EXPECT_EQ(Percentile(values, 11), 2);
}

TEST(HtmlEscape, EscapesMarkupAndQuotes) {
  EXPECT_EQ(HtmlEscape(R"(<a href="x">'&'</a>)"),
            "&lt;a href=&quot;x&quot;&gt;&#39;&amp;&#39;&lt;/a&gt;");
  EXPECT_EQ(HtmlEscape("plain"), "plain");
}

TEST(PrintableBytes, EscapesControlAndHighBytes) {
  EXPECT_EQ(PrintableBytes(std::string("ab\n\xff\\", 5)), "ab\\x0a\\xff\\x5c");
}

// Three versions; replica r0 follows, r1 joins late, r2 is killed before v3.
DemoRecord SampleRecord() {
  DemoRecord record;
  record.run_id = "demo";
  record.targets = "ab";
  for (int64_t v = 1; v <= 4; ++v) {
    DemoStep s;
    s.step = v;
    s.version = v;
    s.full = v == 2;
    s.payload_bytes = v == 2 ? 4000 : 100 * v;
    s.published_at = 10.0 * v;
    s.publish_s = 0.5;
    s.mean_reward = 0.1 * v;
    record.steps.push_back(s);
  }
  DemoReplica r0;
  r0.name = "r0";
  r0.url = "http://127.0.0.1:1";
  r0.timeline = {{1, 0, true}, {10.2, 1, true}, {20.4, 2, true}, {30.1, 3, true}, {40.3, 4, true}};
  r0.commit_s = {0.01, 0.02};
  r0.stage_s = {0.1, 0.2};
  r0.final_applied = 4;
  DemoReplica r1;
  r1.name = "r1";
  r1.url = "http://127.0.0.1:2";
  r1.joined = true;
  r1.started_at = 15;
  r1.timeline = {{16, 0, false}, {21, 2, true}, {30.5, 3, true}, {41, 4, true}};
  r1.final_applied = 4;
  DemoReplica r2;
  r2.name = "r2";
  r2.url = "http://127.0.0.1:3";
  r2.timeline = {{1, 0, true}, {10.1, 1, true}, {20.2, 2, true}};
  r2.killed_at = 25;
  r2.final_applied = 2;
  record.replicas = {r0, r1, r2};
  record.responses = {
      {0, 0, 0, 5, "r0"}, {0, 1, 1, 12, "r0"}, {1, 2, 2, 22, "r1"}, {2, 3, 4, 42, "r1"}};
  return record;
}

TEST(Summarize, ConvergenceCountsOnlyReplicasReadyAtPublicationAndAlive) {
  DemoRecord record = SampleRecord();
  DemoSummary s = Summarize(record);
  EXPECT_EQ(s.versions, 4);
  EXPECT_EQ(s.full_versions, 1);
  EXPECT_EQ(s.full_bytes, 4000);
  EXPECT_EQ(s.delta_bytes_max, 400);
  // v1: r0 at +0.2, r2 at +0.1 (r1 not started): 0.2. v2: r0 +0.4, r2 +0.2:
  // 0.4 (r1 not ready yet). v3: r0 +0.1, r1 +0.5 (ready since 21), r2 killed:
  // 0.5. v4: r0 +0.3, r1 +1.0.
  ASSERT_EQ(s.convergence_s.size(), 4u);
  EXPECT_NEAR(s.convergence_s[0], 0.2, 1e-9);
  EXPECT_NEAR(s.convergence_s[1], 0.4, 1e-9);
  EXPECT_NEAR(s.convergence_s[2], 0.5, 1e-9);
  EXPECT_NEAR(s.convergence_s[3], 1.0, 1e-9);
  EXPECT_EQ(s.not_converged, 0);
  EXPECT_EQ(s.joined, 1);
  EXPECT_EQ(s.killed, 1);
  EXPECT_EQ(s.violations, 0);
  EXPECT_NEAR(s.reward_first, 0.1, 1e-9);
  EXPECT_NEAR(s.reward_last, 0.4, 1e-9);
  EXPECT_EQ(s.served_per_version,
            (std::vector<std::pair<int64_t, int64_t>>{{0, 1}, {1, 1}, {2, 1}, {4, 1}}));
}

TEST(Summarize, AReplicaThatNeverArrivesIsNotConverged) {
  DemoRecord record = SampleRecord();
  record.replicas[0].timeline.pop_back();
  DemoSummary s = Summarize(record);
  EXPECT_EQ(s.not_converged, 1);
  EXPECT_EQ(s.convergence_s.size(), 3u);
}

TEST(CheckDemo, AGoodRunPasses) {
  DemoRecord record = SampleRecord();
  DemoSummary s = Summarize(record);
  EXPECT_THAT(CheckDemo(record, s, {1, 2, 3, 4}, 0.05), IsEmpty());
}

TEST(CheckDemo, FlagsAViolatedConstraint) {
  DemoRecord record = SampleRecord();
  record.responses.push_back({3, 2, 2, 43, "http://127.0.0.1:2"});
  DemoSummary s = Summarize(record);
  EXPECT_EQ(s.violations, 1);
  auto failures = CheckDemo(record, s, {1, 2, 3, 4}, 0.05);
  ASSERT_EQ(failures.size(), 1u);
  EXPECT_THAT(failures[0], HasSubstr("min_version 3"));
  EXPECT_THAT(FormatSummary(record, s, failures), HasSubstr("1 constraint violations"));
}

TEST(CheckDemo, FlagsAnUnpublishedVersion) {
  DemoRecord record = SampleRecord();
  DemoSummary s = Summarize(record);
  // v4 is not in the store.
  auto failures = CheckDemo(record, s, {1, 2, 3}, 0.05);
  ASSERT_EQ(failures.size(), 1u);
  EXPECT_THAT(failures[0], HasSubstr("unpublished version"));
  // Served before its publication began (published_at 40, publish_s 0.5).
  record.responses.push_back({0, 4, 4, 39.0, "r0"});
  failures = CheckDemo(record, Summarize(record), {1, 2, 3, 4}, 0.05);
  ASSERT_EQ(failures.size(), 1u);
  EXPECT_THAT(failures[0], HasSubstr("before its publication began"));
}

TEST(CheckDemo, FlagsAReadyReplicaBehindAndAFlatReward) {
  DemoRecord record = SampleRecord();
  record.replicas[1].final_applied = 3;
  for (DemoStep& step : record.steps) step.mean_reward = 0.2;
  DemoSummary s = Summarize(record);
  auto failures = CheckDemo(record, s, {1, 2, 3, 4}, 0.05);
  ASSERT_EQ(failures.size(), 2u);
  EXPECT_THAT(failures[0], HasSubstr("replica r1"));
  EXPECT_THAT(failures[1], HasSubstr("did not improve"));
  // The killed replica ended behind, which is expected.
  for (const std::string& f : failures) EXPECT_THAT(f, Not(HasSubstr("r2")));
}

TEST(FormatSummary, ShowsTheTableAndTheChecks) {
  DemoRecord record = SampleRecord();
  DemoSummary s = Summarize(record);
  std::string text = FormatSummary(record, s, {});
  EXPECT_THAT(text, HasSubstr("4 published: 1 FULL"));
  EXPECT_THAT(text, HasSubstr("1 joined, 1 killed"));
  EXPECT_THAT(text, HasSubstr("0 constraint violations"));
  EXPECT_THAT(text, HasSubstr("all passed"));
  EXPECT_THAT(text, HasSubstr("v0:1 v1:1 v2:1 v4:1"));
  EXPECT_THAT(text, HasSubstr("p50 400 ms, p95 1000 ms"));
  EXPECT_THAT(text, HasSubstr("0 samples dropped as too stale"));
  EXPECT_THAT(text, HasSubstr("0 rollouts crossed a commit mid-generation"));
}

TEST(FormatSummary, CountsTheRolloutsThatCrossedACommit) {
  DemoRecord record = SampleRecord();
  record.steps[0].crossed = 3;
  record.steps[0].crossed_exact = 2;
  record.steps[1].crossed = 1;
  std::string text = FormatSummary(record, Summarize(record), {});
  EXPECT_THAT(text, HasSubstr("4 rollouts crossed a commit mid-generation: 2 weighted per token "
                              "from their version spans, 2 half-weighted (spans unknown)"));
}

TEST(FormatSummary, SaysWhatRanTheEngines) {
  DemoRecord record = SampleRecord();
  EXPECT_THAT(FormatSummary(record, Summarize(record), {}), Not(HasSubstr("engines ")));
  record.engines = "vllm API, started by --engine-cmd serve <{model}>";
  EXPECT_THAT(FormatSummary(record, Summarize(record), {}),
              HasSubstr("\nengines        vllm API, started by --engine-cmd serve <{model}>\n"));
  EXPECT_THAT(RenderHtmlReport(record, Summarize(record), {}),
              HasSubstr("<p>Engines: <code>vllm API, started by --engine-cmd serve "
                        "&lt;{model}&gt;</code>.</p>"));
}

TEST(RenderHtmlReport, IsSelfContainedWithChartsAndEscapedText) {
  DemoRecord record = SampleRecord();
  record.targets = "<b>";
  DemoSummary s = Summarize(record);
  std::string html = RenderHtmlReport(record, s, {"a <failure>"});
  EXPECT_THAT(html, HasSubstr("<!DOCTYPE html>"));
  EXPECT_EQ(html.find("<script"), std::string::npos);
  EXPECT_EQ(html.find("src="), std::string::npos);
  size_t charts = 0;
  for (size_t at = html.find("<svg"); at != std::string::npos; at = html.find("<svg", at + 1)) {
    ++charts;
  }
  EXPECT_EQ(charts, 4u);  // reward, fleet lanes, staleness, served per version
  EXPECT_THAT(html, HasSubstr("&lt;b&gt;"));
  EXPECT_THAT(html, HasSubstr("a &lt;failure&gt;"));
  EXPECT_THAT(html, Not(HasSubstr("<failure>")));
  EXPECT_THAT(html, HasSubstr("r1 (joined)"));
  EXPECT_THAT(html, HasSubstr("killed (SIGKILL)"));
}

TEST(Summarize, StalenessIsThePointerWhenServedMinusTheServedVersion) {
  DemoRecord record = SampleRecord();
  // Pointer v1 from 10 s, v2 from 20 s, v4 from 40 s.
  record.responses = {{0, 0, 0, 5, "r0"},   // v0 at pointer v0: 0 behind
                      {0, 0, 0, 12, "r0"},  // v0 at pointer v1: 1 behind
                      {0, 1, 1, 45, "r0"},  // v1 at pointer v4: 3 behind
                      {0, 4, 4, 45, "r0"}};
  DemoSummary s = Summarize(record);
  ASSERT_EQ(s.staleness.size(), DemoSummary::kStalenessBuckets);
  EXPECT_EQ(s.staleness[0], 2);
  EXPECT_EQ(s.staleness[1], 1);
  EXPECT_EQ(s.staleness[3], 1);
  EXPECT_THAT(FormatSummary(record, s, {}), HasSubstr("0:2 1:1 2:0 3:1 4:0 5+:0"));
}

TEST(RenderHtmlReport, EachReplicaHasItsOwnLaneWithItsLagShaded) {
  DemoRecord record = SampleRecord();
  DemoSummary s = Summarize(record);
  std::string html = RenderHtmlReport(record, s, {});
  // One lane per replica, the lag of the replica that joined late shown.
  for (const char* lane : {">r0</text>", ">r1 (joined)</text>", ">r2 (killed)</text>"}) {
    EXPECT_THAT(html, HasSubstr(lane));
  }
  EXPECT_THAT(html, HasSubstr("r0 1 behind at 40.00s"));
  EXPECT_THAT(html, HasSubstr("r2 killed at 25.00s"));
  EXPECT_THAT(html, HasSubstr("r1 starting: not ready until 21.00s"));
}

TEST(RenderHtmlReport, ShowsSamplesAndWrapsTheSummary) {
  DemoRecord record = SampleRecord();
  record.samples = {{1, {"xq", "zz"}}, {2, {"the cat"}}, {4, {"sat on <a> mat"}}};
  DemoSummary s = Summarize(record);
  std::string html = RenderHtmlReport(record, s, {});
  EXPECT_THAT(html, HasSubstr("<td>1</td><td>&ldquo;xq&rdquo;</td>"));
  EXPECT_THAT(html, HasSubstr("<td>4</td><td>&ldquo;sat on &lt;a&gt; mat&rdquo;</td>"));
  EXPECT_THAT(html, HasSubstr("white-space:pre-wrap"));
  EXPECT_THAT(html, Not(HasSubstr("overflow-x:auto")));
  const std::string text = FormatSummary(record, s, {});
  EXPECT_THAT(text, HasSubstr("samples        step 1   \"xq\"\n"));
  EXPECT_THAT(text, HasSubstr("               step 4   \"sat on <a> mat\"\n"));
}

}  // namespace
}  // namespace stitch

#include "stitch/net/prometheus.h"

#include <gtest/gtest.h>

namespace stitch {
namespace {

TEST(PrometheusTextTest, EveryMetricHasItsHelpAndTypeBeforeItsSamples) {
  PrometheusText text("stitch_test_");
  text.One("commits_total", "counter", "Engine commits.", 3);
  text.Header("sync_state", "gauge", "One-hot state.");
  text.Sample("sync_state", PromLabels("state", "idle"), 1);
  text.Sample("sync_state", PromLabels("state", "error"), 0);
  text.One("last_commit_seconds", "gauge", "Duration of the last commit.", 0.25);
  EXPECT_EQ(text.Take(),
            "# HELP stitch_test_commits_total Engine commits.\n"
            "# TYPE stitch_test_commits_total counter\n"
            "stitch_test_commits_total 3\n"
            "# HELP stitch_test_sync_state One-hot state.\n"
            "# TYPE stitch_test_sync_state gauge\n"
            "stitch_test_sync_state{state=\"idle\"} 1\n"
            "stitch_test_sync_state{state=\"error\"} 0\n"
            "# HELP stitch_test_last_commit_seconds Duration of the last commit.\n"
            "# TYPE stitch_test_last_commit_seconds gauge\n"
            "stitch_test_last_commit_seconds 0.25\n");
}

TEST(PrometheusTextTest, ASumReadsEverySampleOfOneMetricAndNothingElse) {
  PrometheusText text("stitch_test_");
  text.One("passes_total", "counter", "Passes.", 7);
  text.One("passes_total_other", "counter", "Not the same metric.", 100);
  text.Header("running", "gauge", "Running requests.");
  text.Sample("running", PromLabels("engine", "0"), 2);
  text.Sample("running", PromLabels("engine", "1"), 3.5);
  const std::string body = text.Take();
  EXPECT_EQ(PrometheusSum(body, "stitch_test_passes_total"), std::optional<double>(7));
  EXPECT_EQ(PrometheusSum(body, "stitch_test_running"), std::optional<double>(5.5));
  EXPECT_EQ(PrometheusSum(body, "stitch_test_missing"), std::nullopt);
  EXPECT_EQ(PrometheusSum("stitch_test_bad 1x\n", "stitch_test_bad"), std::nullopt);
}

TEST(PrometheusTextTest, LabelValuesAreEscaped) {
  EXPECT_EQ(PromLabels("replica", "http://a:1/x"), "{replica=\"http://a:1/x\"}");
  EXPECT_EQ(PromLabels("run_id", "a\"b\\c\nd"), "{run_id=\"a\\\"b\\\\c\\nd\"}");
}

TEST(PrometheusTextTest, TheAnswerCarriesTheFormatsContentType) {
  HttpResponse r = PrometheusResponse("x 1\n");
  EXPECT_EQ(r.status, 200);
  EXPECT_EQ(r.headers.Get("content-type"), "text/plain; version=0.0.4; charset=utf-8");
  EXPECT_EQ(r.body, "x 1\n");
}

}  // namespace
}  // namespace stitch

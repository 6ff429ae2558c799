#include "stitch/chaos/history.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>

#include "tests/support/temp_dir.h"

namespace stitch {
namespace {

using ::testing::HasSubstr;

RequestRecord Answer() {
  RequestRecord r;
  r.id = 17;
  r.via = "r2";
  r.route = "generate";
  r.stream = true;
  r.session = "s-4";
  r.constraint = VersionConstraint::AtLeast(5);
  r.pointer = 6;
  r.sent_s = 1.25;
  r.done_s = 1.5;
  r.status = 200;
  r.outcome = Outcome::kAnswered;
  r.start = 5;
  r.end = 6;
  r.prompt = 3;
  r.max_tokens = 3;
  r.tokens = {72, 105, 257};
  r.events = 4;
  r.verdict = Verdict::kCrossed;
  r.versions = {5, 6};
  r.switch_at = {2};
  r.spans = "[[0,5],[2,6]]";
  r.spans_check = "exact";
  return r;
}

template <typename T>
T RoundTrip(const T& entry) {
  auto parsed = ParseHistoryLine(HistoryLine(HistoryEntry(entry)));
  EXPECT_TRUE(parsed.ok()) << parsed.status();
  const T* out = parsed.ok() ? std::get_if<T>(&*parsed) : nullptr;
  EXPECT_NE(out, nullptr);
  return out == nullptr ? T{} : *out;
}

TEST(HistoryTest, ARequestRoundTrips) {
  const RequestRecord r = Answer();
  const RequestRecord back = RoundTrip(r);
  EXPECT_EQ(back.id, r.id);
  EXPECT_EQ(back.via, r.via);
  EXPECT_EQ(back.route, r.route);
  EXPECT_EQ(back.stream, r.stream);
  EXPECT_EQ(back.session, r.session);
  EXPECT_EQ(back.constraint, r.constraint);
  EXPECT_EQ(back.pointer, r.pointer);
  EXPECT_DOUBLE_EQ(back.sent_s, r.sent_s);
  EXPECT_DOUBLE_EQ(back.done_s, r.done_s);
  EXPECT_EQ(back.outcome, r.outcome);
  EXPECT_EQ(back.start, r.start);
  EXPECT_EQ(back.end, r.end);
  EXPECT_EQ(back.tokens, r.tokens);
  EXPECT_EQ(back.max_tokens, 3);
  EXPECT_EQ(back.events, r.events);
  EXPECT_EQ(back.verdict, r.verdict);
  EXPECT_EQ(back.versions, r.versions);
  EXPECT_EQ(back.switch_at, r.switch_at);
  EXPECT_EQ(back.spans, r.spans);
  EXPECT_EQ(back.spans_check, r.spans_check);
}

TEST(HistoryTest, AFailureAndAnExactPinRoundTrip) {
  RequestRecord r;
  r.id = 1;
  r.via = "gateway";
  r.route = "completions";
  r.probe = true;
  r.constraint = VersionConstraint::Exact(3);
  r.status = 409;
  r.outcome = Outcome::kRetryable;
  r.error = "WeightVersionNotReady";
  r.text = "caf\xC3\xA9";
  const RequestRecord back = RoundTrip(r);
  EXPECT_TRUE(back.probe);
  EXPECT_EQ(back.constraint, r.constraint);
  EXPECT_EQ(back.outcome, Outcome::kRetryable);
  EXPECT_EQ(back.error, r.error);
  EXPECT_EQ(back.text, r.text);
  EXPECT_FALSE(back.start.has_value());
  EXPECT_EQ(back.verdict, Verdict::kNone);
}

TEST(HistoryTest, EveryOtherEntryRoundTrips) {
  RunEntry run;
  run.seed = 18446744073709551615ULL;
  run.minutes = 2;
  run.store = "s3";
  run.replicas = 3;
  run.replay = "make chaos CHAOS_SEED=1";
  Fault f;
  f.id = 1;
  f.kind = FaultKind::kS3Stall;
  f.start_s = 4;
  f.duration_s = 2.5;
  f.param = 0.25;
  run.schedule = {f};
  run.left_out = {"store_full: not permitted"};
  const RunEntry run_back = RoundTrip(run);
  EXPECT_EQ(run_back.seed, run.seed);
  EXPECT_EQ(run_back.schedule, run.schedule);
  EXPECT_EQ(run_back.left_out, run.left_out);
  EXPECT_EQ(run_back.replay, run.replay);

  FaultEntry fault;
  fault.fault = f;
  fault.applied_s = 4.1;
  fault.ended_s = 6.7;
  fault.note = "sigstop";
  const FaultEntry fault_back = RoundTrip(fault);
  EXPECT_EQ(fault_back.fault, f);
  EXPECT_DOUBLE_EQ(fault_back.ended_s, 6.7);
  EXPECT_EQ(fault_back.note, "sigstop");

  PublishEntry publish{7, true, 1, 2, "killed"};
  EXPECT_EQ(RoundTrip(publish).outcome, "killed");
  PointerEntry pointer{3.5, 7, false, "missing file"};
  EXPECT_FALSE(RoundTrip(pointer).complete);
  ResourceEntry resources{9, "sidecar r1", 2, 1234, 40000, 31};
  EXPECT_EQ(RoundTrip(resources).open_files, 31);
  EndEntry end;
  end.final_pointer = 9;
  end.converged = true;
  end.leftover_temp = {"store/updates/.weight_v000003.tmp-x"};
  const EndEntry end_back = RoundTrip(end);
  EXPECT_EQ(end_back.final_pointer, 9);
  EXPECT_TRUE(end_back.converged);
  EXPECT_EQ(end_back.leftover_temp, end.leftover_temp);
}

TEST(HistoryTest, BadLinesAreRefusedWithTheField) {
  EXPECT_THAT(ParseHistoryLine("[1]").status().message(), HasSubstr("not a JSON object"));
  EXPECT_THAT(ParseHistoryLine(R"({"type":"comet"})").status().message(),
              HasSubstr("unknown line type"));
  EXPECT_THAT(ParseHistoryLine(R"({"type":"request","id":"x","via":"g","route":"generate",)"
                               R"("outcome":"answered"})")
                  .status()
                  .message(),
              HasSubstr("\"id\" is not an integer"));
  EXPECT_THAT(ParseHistoryLine(R"({"type":"request","id":1,"via":"g","route":"generate",)"
                               R"("outcome":"maybe"})")
                  .status()
                  .message(),
              HasSubstr("names no outcome"));
}

TEST(HistoryTest, AWrittenHistoryReadsBack) {
  testing::TempDir tmp;
  const auto path = tmp.path() / "history.jsonl";
  auto writer = HistoryWriter::Open(path);
  ASSERT_TRUE(writer.ok()) << writer.status();
  (*writer)->Write(RunEntry{});
  (*writer)->Write(Answer());
  EXPECT_TRUE((*writer)->status().ok());
  auto read = ReadHistory(path);
  ASSERT_TRUE(read.ok()) << read.status();
  ASSERT_EQ(read->size(), 2u);
  EXPECT_TRUE(std::holds_alternative<RequestRecord>((*read)[1]));

  std::ofstream(path, std::ios::app) << "{broken\n";
  EXPECT_THAT(ReadHistory(path).status().message(), HasSubstr("history.jsonl:3"));
}

}  // namespace
}  // namespace stitch

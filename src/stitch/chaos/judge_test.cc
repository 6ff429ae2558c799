#include "stitch/chaos/judge.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>
#include <string>

#include "stitch/refengine/engine_test_util.h"
#include "tests/support/temp_dir.h"

namespace stitch {
namespace {

using ::testing::ElementsAre;
using ::testing::HasSubstr;

// The judge's protocol, spoken by a stand-in shell script (the real judge,
// tests/engines/chaos_judge.py, needs torch and transformers: it is tested
// by the real-engine suites). It says "ready", then answers each line:
// "same" for a request stamped [3, 3] once the LM heads of v0 to v11 are on
// disk at their size, "crossed" for [3, 4]; it exits on [0, 0], and answers
// anything else with an error.
constexpr const char* kStandIn = R"sh(#!/bin/sh
heads=""
while [ $# -gt 0 ]; do
  case "$1" in --heads) heads="$2"; shift ;; esac
  shift
done
echo ready
while read -r line; do
  case "$line" in
    *'"start":3,"end":3'*)
      ok=yes
      for v in 0 1 2 3 4 5 6 7 8 9 10 11; do
        [ "$(wc -c < "$heads/lm_head.v$v.bin")" -eq BYTES ] || ok=no
      done
      [ -e "$heads/lm_head.v12.bin" ] && ok=no
      if [ $ok = yes ]; then
        echo '{"verdict":"same","versions":[3],"switch_at":[],"matches":null,"spans":null}'
      else
        echo '{"error":"the heads are not all there"}'
      fi ;;
    *'"start":3,"end":4'*'"spans":[[0,3],[2,4]]'*)
      echo '{"verdict":"crossed","versions":[3,4],"switch_at":[2],"matches":null,"spans":true}' ;;
    *'"start":0,"end":0'*) exit 0 ;;
    *) echo '{"error":"ValueError: unexpected"}' ;;
  esac
done
)sh";

class ExternalJudgeTest : public ::testing::Test {
 protected:
  ExternalJudgeTest() : oracle_(Options()) {}

  static OracleOptions Options() {
    OracleOptions o;
    o.config = testing::EngineTestConfig();
    o.config.weight_dtype = DType::kBF16;
    o.seed = 3;
    return o;
  }

  JudgeProcessOptions Process(std::string script) {
    const int64_t bytes =
        int64_t{2} * oracle_.options().config.vocab_size * oracle_.options().config.hidden_size;
    const size_t at = script.find("BYTES");
    if (at != std::string::npos) script.replace(at, 5, std::to_string(bytes));
    std::ofstream(tmp_ / "judge.sh") << script;
    JudgeProcessOptions p;
    p.python = "/bin/sh";
    p.script = tmp_ / "judge.sh";
    p.base_checkpoint = tmp_ / "base";
    p.heads_dir = tmp_ / "heads";
    p.log = tmp_ / "judge.log";
    p.tmp_dir = tmp_ / "tmp";
    return p;
  }

  testing::TempDir tmp_;
  Oracle oracle_;
};

TEST_F(ExternalJudgeTest, WritesTheLmHeadsItNeedsAndReadsTheVerdicts) {
  auto judge = ExternalJudge::Start(Process(kStandIn), oracle_);
  ASSERT_TRUE(judge.ok()) << judge.status();
  const std::vector<int32_t> prompt = {256, 72};
  const std::vector<int32_t> tokens = {1, 2, 3, 4};
  auto same = (*judge)->Judge(prompt, tokens, 4, 3, 3, nullptr);
  ASSERT_TRUE(same.ok()) << same.status();
  EXPECT_EQ(same->judgement.verdict, Verdict::kSame);
  EXPECT_THAT(same->judgement.versions, ElementsAre(3));
  EXPECT_FALSE(same->spans_explain.has_value());
  const VersionSpans spans = {{0, 3}, {2, 4}};
  auto crossed = (*judge)->Judge(prompt, tokens, 4, 3, 4, &spans);
  ASSERT_TRUE(crossed.ok()) << crossed.status();
  EXPECT_EQ(crossed->judgement.verdict, Verdict::kCrossed);
  EXPECT_THAT(crossed->judgement.versions, ElementsAre(3, 4));
  EXPECT_THAT(crossed->judgement.switch_at, ElementsAre(2));
  EXPECT_EQ(crossed->spans_explain, std::optional<bool>(true));
  // What the judge could not judge is an error, never a verdict.
  auto failed = (*judge)->Judge(prompt, tokens, 4, 5, 5, nullptr);
  EXPECT_THAT(failed.status().message(), HasSubstr("ValueError: unexpected"));
}

TEST_F(ExternalJudgeTest, AJudgeThatExitsOrNeverStartsIsAnError) {
  auto judge = ExternalJudge::Start(Process(kStandIn), oracle_);
  ASSERT_TRUE(judge.ok()) << judge.status();
  const std::vector<int32_t> prompt = {256};
  const std::vector<int32_t> exit_now = {};
  // The stand-in exits on [0, 0].
  auto gone = (*judge)->Judge(prompt, exit_now, 0, 0, 0, nullptr);
  ASSERT_FALSE(gone.ok());
  EXPECT_THAT(std::string(gone.status().message()), HasSubstr("exit"));

  auto silent = ExternalJudge::Start(Process("#!/bin/sh\necho loading >&2\nexit 1\n"), oracle_);
  ASSERT_FALSE(silent.ok());
  EXPECT_THAT(silent.status().message(), HasSubstr("judge.log"));

  OracleOptions f32 = Options();
  f32.config.weight_dtype = DType::kF32;
  Oracle f32_oracle(f32);
  EXPECT_THAT(ExternalJudge::Start(Process(kStandIn), f32_oracle).status().message(),
              HasSubstr("bfloat16"));
}

}  // namespace
}  // namespace stitch

// The delta codec against the reference algorithm of the published Python
// Stitch (tests/delta_reference.py: numpy XOR, zstandard level 1,
// xxhash.xxh3_128().hexdigest(), safetensors.numpy.save_file), both ways:
//   Python encodes -> our apply (library and `stitch delta apply`) reproduces
//   the target bit for bit, and `stitch delta verify` accepts the delta;
//   we encode (library and `stitch delta encode`) -> Python applies the
//   chain, verifying every checksum, and reproduces the target.
// Uses the project's virtual environment ($STITCH_SOURCE_DIR/.venv, made by
// scripts/install-deps). Where it or one of its modules is missing the test
// reports itself skipped with the reason; it never passes silently.
// DeltaCliTest, at the end, checks the `stitch delta` commands' failures
// (one line on stderr, exit 1, destination untouched); it needs no Python.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <vector>

#include "stitch/core/version.h"
#include "stitch/delta/delta_apply.h"
#include "stitch/delta/delta_encode.h"
#include "stitch/delta/delta_test_util.h"
#include "tests/support/subprocess.h"

namespace stitch {
namespace {

namespace fs = std::filesystem;
using testing::BytesOf;
using testing::Nudge;
using testing::RandomTensor;
using testing::ReadTensors;
using testing::RunProcess;
using testing::ScratchDir;
using testing::StitchBinary;
using testing::TestCheckpoint;
using testing::WriteCheckpoint;

std::string SourceDir() {
  const char* dir = std::getenv("STITCH_SOURCE_DIR");
  return dir == nullptr ? std::string(STITCH_SOURCE_DIR_DEFAULT) : std::string(dir);
}

class DeltaInteropTest : public ::testing::Test {
 protected:
  void SetUp() override {
    if (SourceDir().empty())
      GTEST_SKIP() << "STITCH_SOURCE_DIR is not set (run the test through ctest)";
    python_ = SourceDir() + "/.venv/bin/python";
    script_ = SourceDir() + "/tests/delta_reference.py";
    if (!fs::exists(python_)) {
      GTEST_SKIP() << python_
                   << " does not exist: run scripts/install-deps to create the project venv";
    }
    testing::ProcessResult probe =
        RunProcess({python_, "-c", "import numpy, zstandard, xxhash, safetensors"});
    if (probe.exit_code != 0) {
      GTEST_SKIP() << "the project venv lacks a module the reference needs (numpy, zstandard, "
                      "xxhash, safetensors): "
                   << probe.err;
    }
    ASSERT_FALSE(StitchBinary().empty()) << "STITCH_BIN is not set";

    // bf16 (numpy has none), f32, i64 and u8 tensors over two files; one
    // tensor several codec chunks long; one never changes.
    TestCheckpoint c;
    c["model.embed_tokens.weight"] =
        RandomTensor(DType::kBF16, {700, 512}, 1, "model-00001-of-00002.safetensors");
    c["model.layers.0.self_attn.q_proj.weight"] =
        RandomTensor(DType::kBF16, {64, 48}, 2, "model-00001-of-00002.safetensors");
    c["model.layers.0.input_layernorm.weight"] =
        RandomTensor(DType::kF32, {48}, 3, "model-00002-of-00002.safetensors");
    c["model.rotary.inv_freq"] =
        RandomTensor(DType::kI64, {24}, 4, "model-00002-of-00002.safetensors");
    c["model.mask"] = RandomTensor(DType::kU8, {3, 5}, 5, "model-00002-of-00002.safetensors");
    v_.push_back(c);
    v_.push_back(Nudge(v_[0], 0.01, 6, [](const std::string& n) { return n != "model.mask"; }));
    v_.push_back(Nudge(v_[1], 0.01, 7, [](const std::string& n) { return n != "model.mask"; }));
    for (size_t i = 0; i < v_.size(); ++i) {
      WriteCheckpoint(Ckpt(i), v_[i],
                      {{"version", VersionMetadataString(static_cast<int64_t>(i))}});
    }
  }

  fs::path Ckpt(size_t v) const { return dir_ / ("ckpt" + std::to_string(v)); }

  testing::ProcessResult Python(std::vector<std::string> args) {
    args.insert(args.begin(), {python_, script_});
    return RunProcess(args);
  }

  ScratchDir dir_;
  std::string python_, script_;
  std::vector<TestCheckpoint> v_;
};

TEST_F(DeltaInteropTest, PythonEncodedDeltasApplyBitForBit) {
  for (size_t v : {1, 2}) {
    testing::ProcessResult r =
        Python({"encode", "--base", Ckpt(v - 1).string(), "--target", Ckpt(v).string(), "--out",
                (dir_ / ("py" + std::to_string(v))).string(), "--version", std::to_string(v)});
    ASSERT_EQ(r.exit_code, 0) << r.err;
  }
  const std::vector<fs::path> deltas{dir_ / "py1", dir_ / "py2"};

  // The library.
  absl::StatusOr<MaterializeResult> m = MaterializeCheckpoint(Ckpt(0), deltas, dir_ / "lib", {});
  ASSERT_TRUE(m.ok()) << m.status();
  EXPECT_EQ(m->version.version, 2);
  EXPECT_EQ(ReadTensors(dir_ / "lib"), BytesOf(v_[2]));

  // The CLI, and its verify (frames alone, then checksums against the base).
  testing::ProcessResult r =
      RunProcess({StitchBinary(), "delta", "apply", "--anchor", Ckpt(0).string(), "--out",
                  (dir_ / "cli").string(), deltas[0].string(), deltas[1].string()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("now holds weight_v000002"), std::string::npos) << r.out;
  EXPECT_EQ(ReadTensors(dir_ / "cli"), BytesOf(v_[2]));
  r = RunProcess({StitchBinary(), "delta", "verify", deltas[1].string()});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  r = RunProcess(
      {StitchBinary(), "delta", "verify", deltas[1].string(), "--base", Ckpt(1).string()});
  EXPECT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("checksums verified"), std::string::npos) << r.out;
}

TEST_F(DeltaInteropTest, OurDeltasApplyInThePythonReference) {
  // Delta 1 through the library, delta 2 through the CLI.
  EncodeOptions o;
  o.version = 1;
  absl::StatusOr<EncodeResult> e = EncodeDelta(Ckpt(0), Ckpt(1), dir_ / "ours1", o);
  ASSERT_TRUE(e.ok()) << e.status();
  EXPECT_EQ(e->changed_tensors, 4u);
  testing::ProcessResult r =
      RunProcess({StitchBinary(), "delta", "encode", "--base", Ckpt(1).string(), "--target",
                  Ckpt(2).string(), "--out", (dir_ / "ours2").string(), "--version", "2"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_NE(r.out.find("4 of 5 tensors changed"), std::string::npos) << r.out;

  r = Python({"apply", "--anchor", Ckpt(0).string(), "--out", (dir_ / "py").string(),
              (dir_ / "ours1").string(), (dir_ / "ours2").string()});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(ReadTensors(dir_ / "py"), BytesOf(v_[2]));

  // The reference really checks: a wrong checksum makes it fail.
  testing::RewritePayloads(dir_ / "ours2", [](testing::PayloadEntry& e) {
    if (e.tensor == "model.layers.0.input_layernorm.weight") e.checksum = std::string(32, '0');
  });
  r = Python({"apply", "--anchor", Ckpt(0).string(), "--out", (dir_ / "py-bad").string(),
              (dir_ / "ours1").string(), (dir_ / "ours2").string()});
  EXPECT_EQ(r.exit_code, 3) << r.err;
}

class DeltaCliTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_FALSE(StitchBinary().empty()) << "STITCH_BIN is not set";
    TestCheckpoint c;
    c["w"] = RandomTensor(DType::kBF16, {256, 64}, 1);
    c["b"] = RandomTensor(DType::kF32, {64}, 2);
    v_ = {c, Nudge(c, 0.01, 3)};
    WriteCheckpoint(dir_ / "v0", v_[0], {{"version", "000000"}});
    WriteCheckpoint(dir_ / "v1", v_[1], {{"version", "000001"}});
  }

  // Runs `stitch args...`; expects exit 1 and exactly one line on stderr
  // that starts with "stitch: " and mentions `mention`.
  void ExpectFailure(std::vector<std::string> args, std::string_view mention) {
    args.insert(args.begin(), StitchBinary());
    testing::ProcessResult r = RunProcess(args);
    EXPECT_EQ(r.exit_code, 1) << r.err;
    EXPECT_EQ(r.err.rfind("stitch: ", 0), 0u) << r.err;
    EXPECT_EQ(std::count(r.err.begin(), r.err.end(), '\n'), 1) << r.err;
    EXPECT_NE(r.err.find(mention), std::string::npos) << r.err;
  }

  ScratchDir dir_;
  std::vector<TestCheckpoint> v_;
};

TEST_F(DeltaCliTest, FailuresAreOneLineAndLeaveTheDestinationAlone) {
  const std::string out = (dir_ / "out").string(), d1 = (dir_ / "d1").string();
  testing::ProcessResult r =
      RunProcess({StitchBinary(), "delta", "encode", "--base", (dir_ / "v0").string(), "--target",
                  (dir_ / "v1").string(), "--out", d1, "--version", "1"});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.err, "");  // no progress bar into a pipe
  r = RunProcess(
      {StitchBinary(), "delta", "apply", "--anchor", (dir_ / "v0").string(), "--out", out, d1});
  ASSERT_EQ(r.exit_code, 0) << r.err;
  EXPECT_EQ(r.err, "");
  const auto before = testing::SnapshotTree(out);

  ExpectFailure({"delta", "apply", "--anchor", (dir_ / "v0").string(), "--out", out,
                 (dir_ / "missing").string()},
                "missing");
  testing::RewritePayloads(d1, [](testing::PayloadEntry& e) {
    if (e.tensor == "w") e.frame.resize(e.frame.size() / 2);
  });
  ExpectFailure(
      {"delta", "apply", "--anchor", (dir_ / "v0").string(), "--out", (dir_ / "out2").string(), d1},
      "\"w\"");
  ExpectFailure({"delta", "verify", d1}, "\"w\"");
  EXPECT_EQ(testing::SnapshotTree(out), before);
  EXPECT_FALSE(fs::exists(dir_ / "out2"));

  ExpectFailure({"delta", "encode", "--base", (dir_ / "v0").string(), "--target",
                 (dir_ / "v1").string(), "--out", (dir_ / "d5").string(), "--version", "5"},
                "version");
  ExpectFailure({"delta", "verify", (dir_ / "v1").string(), "--base", (dir_ / "v0").string()},
                "FULL");
}

}  // namespace
}  // namespace stitch

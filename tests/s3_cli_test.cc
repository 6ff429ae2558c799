// The real `stitch` binary (claim, publish, pointer) against an s3:// store
// on a real S3 protocol server, credentials from the AWS_* variables.
#include <gtest/gtest.h>

#include <cstdlib>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "tests/s3_test_base.h"
#include "tests/support/subprocess.h"
#include "tests/support/version_dirs.h"

namespace stitch::testing {
namespace {

namespace fs = std::filesystem;

class S3CliTest : public S3Test {
 protected:
  void SetUp() override {
    S3Test::SetUp();
    if (HasFatalFailure()) return;
    ASSERT_FALSE(StitchBinary().empty()) << "STITCH_BIN is not set";
    SetCredentials(server().Credentials());
  }
  void TearDown() override {
    for (const char* name : {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
                             "AWS_REGION", "AWS_ENDPOINT_URL"}) {
      ::unsetenv(name);
    }
  }
  // The child processes inherit this process's environment; the test sets
  // it while no other thread runs.
  static void SetCredentials(const S3Environment& env) {
    ::setenv("AWS_ACCESS_KEY_ID", env.access_key_id.c_str(), 1);
    ::setenv("AWS_SECRET_ACCESS_KEY", env.secret_access_key.c_str(), 1);
    if (env.session_token.empty()) {
      ::unsetenv("AWS_SESSION_TOKEN");
    } else {
      ::setenv("AWS_SESSION_TOKEN", env.session_token.c_str(), 1);
    }
    ::setenv("AWS_REGION", env.region.c_str(), 1);
  }
  static ProcessResult Stitch(std::vector<std::string> args) {
    args.insert(args.begin(), StitchBinary());
    return RunProcess(args);
  }
};

TEST_F(S3CliTest, ClaimPublishAndPointerWorkOnAnS3Store) {
  const std::string store = Uri();
  const std::string cache = (tmp() / "cache").string();
  ProcessResult unset = Stitch({"pointer", "--store", store});
  EXPECT_EQ(unset.exit_code, 1);
  EXPECT_TRUE(absl::StrContains(unset.err, "the pointer is unset")) << unset.err;

  ProcessResult claim =
      Stitch({"claim", "--store", store, "--run-id", "run-a", "--cache-dir", cache});
  ASSERT_EQ(claim.exit_code, 0) << claim.err;
  EXPECT_TRUE(absl::StrContains(claim.out, "claimed run-a/weight_v000000")) << claim.out;

  auto v1 = WriteTestVersion(tmp() / "src", 1);
  ASSERT_TRUE(v1.ok());
  ProcessResult publish = Stitch(
      {"publish", "--store", store, "--run-id", "run-a", "--cache-dir", cache, v1->string()});
  ASSERT_EQ(publish.exit_code, 0) << publish.err;
  EXPECT_TRUE(absl::StrContains(publish.out, "published run-a/weight_v000001")) << publish.out;

  // The endpoint may come from AWS_ENDPOINT_URL instead of the URI.
  ::setenv("AWS_ENDPOINT_URL", server().endpoint().c_str(), 1);
  ProcessResult pointer =
      Stitch({"pointer", "--store", absl::StrCat("s3://", server().bucket(), "/", prefix())});
  ASSERT_EQ(pointer.exit_code, 0) << pointer.err;
  EXPECT_EQ(pointer.out, "run-a/weight_v000001\n");

  // What the binary published is whole and readable by a store in-process.
  auto reader = Open("");
  ASSERT_NE(reader, nullptr);
  auto dir = reader->Materialize(1);
  ASSERT_TRUE(dir.ok()) << dir.status().message();
  EXPECT_TRUE(VerifyVersionDir(*dir).ok());

  // Republishing the same version is a rewind, refused in one line.
  ProcessResult rewind = Stitch({"publish", "--store", store, "--run-id", "run-a", v1->string()});
  EXPECT_EQ(rewind.exit_code, 1);
  EXPECT_TRUE(rewind.err.starts_with("stitch: store s3://")) << rewind.err;
  EXPECT_EQ(std::count(rewind.err.begin(), rewind.err.end(), '\n'), 1) << rewind.err;
}

TEST_F(S3CliTest, TemporaryCredentialsWork) {
  SetCredentials(server().SessionCredentials());
  ProcessResult claim = Stitch({"claim", "--store", Uri(), "--run-id", "run-s"});
  ASSERT_EQ(claim.exit_code, 0) << claim.err;
  ProcessResult pointer = Stitch({"pointer", "--store", Uri()});
  ASSERT_EQ(pointer.exit_code, 0) << pointer.err;
  EXPECT_EQ(pointer.out, "run-s/weight_v000000\n");
}

TEST_F(S3CliTest, BadCredentialsAreOneClearLine) {
  S3Environment wrong = server().Credentials();
  wrong.secret_access_key = "wrong";
  SetCredentials(wrong);
  ProcessResult pointer = Stitch({"pointer", "--store", Uri()});
  EXPECT_EQ(pointer.exit_code, 1);
  EXPECT_TRUE(pointer.err.starts_with("stitch: store s3://")) << pointer.err;
  EXPECT_TRUE(absl::StrContains(pointer.err, "AWS_SECRET_ACCESS_KEY")) << pointer.err;
  EXPECT_EQ(std::count(pointer.err.begin(), pointer.err.end(), '\n'), 1) << pointer.err;
}

}  // namespace
}  // namespace stitch::testing

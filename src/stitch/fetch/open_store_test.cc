#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "stitch/fetch/open_store.h"
#include "stitch/store/fs_store.h"
#include "stitch/store/store.h"
#include "tests/support/temp_dir.h"

namespace stitch {
namespace {

namespace fs = std::filesystem;
using ::stitch::testing::TempDir;
using ::testing::HasSubstr;

std::string UriOf(std::string_view uri, const std::string& run = "run-a") {
  auto s = OpenStore(uri, StoreOptions{run, {}});
  EXPECT_TRUE(s.ok()) << uri << ": " << s.status();
  return s.ok() ? (*s)->uri() : "";
}

TEST(OpenStoreTest, PlainAbsolutePath) {
  TempDir tmp;
  EXPECT_EQ(UriOf((tmp / "s").string()), "file://" + (tmp / "s").string());
}

TEST(OpenStoreTest, RelativePathIsResolvedAgainstTheCurrentDirectory) {
  TempDir tmp;
  fs::path saved = fs::current_path();
  fs::current_path(tmp.path());
  std::string uri = UriOf("runs:a");  // a path, not a URI with scheme "runs"
  fs::current_path(saved);
  EXPECT_EQ(uri, "file://" + (tmp / "runs:a").string());
}

TEST(OpenStoreTest, FileUriIsPercentDecoded) {
  TempDir tmp;
  std::string uri = "file://" + tmp.path().string() + "/a%20b";
  EXPECT_EQ(UriOf(uri), uri);
  auto store = OpenStore(uri, StoreOptions{"run-a", {}});
  ASSERT_TRUE(store.ok());
  ASSERT_TRUE((*store)->AdvancePointer(std::nullopt, VersionRef{"run-a", 0}).ok());  // creates it
  EXPECT_TRUE(fs::is_directory(tmp / "a b" / "updates"));
  EXPECT_EQ(UriOf("file://localhost" + tmp.path().string() + "/c"),
            "file://" + tmp.path().string() + "/c");
}

TEST(OpenStoreTest, FileUriWithARemoteHostIsRefused) {
  auto s = OpenStore("file://elsewhere/x", StoreOptions{"run-a", {}});
  EXPECT_TRUE(absl::IsInvalidArgument(s.status()));
  EXPECT_THAT(std::string(s.status().message()), HasSubstr("elsewhere"));
}

TEST(OpenStoreTest, MemUri) { EXPECT_EQ(UriOf("mem://open-store-test"), "mem://open-store-test"); }

TEST(OpenStoreTest, UnknownSchemeListsTheSupportedOnes) {
  for (std::string_view uri : {"gs://b/p", "http://x/y", "ftp://h/p"}) {
    auto s = OpenStore(uri, StoreOptions{"run-a", {}});
    ASSERT_FALSE(s.ok()) << uri;
    EXPECT_TRUE(absl::IsInvalidArgument(s.status()));
    EXPECT_THAT(std::string(s.status().message()), HasSubstr("file:///abs/path"));
    EXPECT_THAT(std::string(s.status().message()), HasSubstr("mem://NAME"));
  }
}

TEST(OpenStoreTest, EmptyUriAndBadRunIdAreRefused) {
  EXPECT_TRUE(absl::IsInvalidArgument(OpenStore("", StoreOptions{"run-a", {}}).status()));
  EXPECT_TRUE(absl::IsInvalidArgument(OpenStore("mem://", StoreOptions{"run-a", {}}).status()));
  TempDir tmp;
  auto s = OpenStore(tmp.path().string(), StoreOptions{"a b", {}});
  EXPECT_TRUE(absl::IsInvalidArgument(s.status()));
  EXPECT_THAT(std::string(s.status().message()), HasSubstr("run id"));
}

}  // namespace
}  // namespace stitch

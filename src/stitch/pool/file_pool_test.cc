#include "stitch/pool/file_pool.h"

#include <chrono>
#include <fstream>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "stitch/pool/pool.h"
#include "tests/support/loopback_http.h"
#include "tests/support/temp_dir.h"

namespace stitch {
namespace {

using ::stitch::testing::LoopbackHttpServer;
using ::stitch::testing::TempDir;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::IsEmpty;

void Write(const std::filesystem::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::trunc);
  out << text;
}

// Rewrites the file with a new modification time, so that a rewrite of the
// same size within the file system's time granularity is still seen.
void Rewrite(const std::filesystem::path& path, const std::string& text) {
  const auto before = std::filesystem::last_write_time(path);
  Write(path, text);
  std::filesystem::last_write_time(path, before + std::chrono::seconds(1));
}

TEST(FilePoolTest, ListsOneUrlPerLineSkippingCommentsAndBlanks) {
  TempDir tmp;
  Write(tmp / "pool", "# replicas\nhttp://a:1/\n\n  http://b:2  \nhttp://a:1\n");
  auto pool = MakePool("file:" + (tmp / "pool").string());
  ASSERT_TRUE(pool.ok()) << pool.status();
  auto urls = (*pool)->Discover();
  ASSERT_TRUE(urls.ok()) << urls.status();
  EXPECT_THAT(*urls, ElementsAre("http://a:1", "http://b:2"));
  EXPECT_EQ((*pool)->spec(), "file:" + (tmp / "pool").string());
}

TEST(FilePoolTest, FollowsTheFileAsItGrowsAndShrinks) {
  TempDir tmp;
  const auto path = tmp / "pool";
  auto pool = FilePool::Parse("file:" + path.string());
  ASSERT_TRUE(pool.ok());
  EXPECT_TRUE(absl::IsNotFound((*pool)->Discover().status()));
  Write(path, "");
  ASSERT_TRUE((*pool)->Discover().ok());
  EXPECT_THAT(*(*pool)->Discover(), IsEmpty());
  Rewrite(path, "http://a:1\n");
  EXPECT_THAT(*(*pool)->Discover(), ElementsAre("http://a:1"));
  Rewrite(path, "http://a:1\nhttp://b:2\n");
  EXPECT_THAT(*(*pool)->Discover(), ElementsAre("http://a:1", "http://b:2"));
  Rewrite(path, "http://b:2\n");
  EXPECT_THAT(*(*pool)->Discover(), ElementsAre("http://b:2"));
}

TEST(FilePoolTest, ABadLineIsAnErrorNamingIt) {
  TempDir tmp;
  Write(tmp / "pool", "http://a:1\nftp://b\n");
  auto pool = MakePool("file:" + (tmp / "pool").string());
  ASSERT_TRUE(pool.ok());
  auto urls = (*pool)->Discover();
  ASSERT_TRUE(absl::IsInvalidArgument(urls.status())) << urls.status();
  EXPECT_THAT(std::string(urls.status().message()), HasSubstr("line 2"));
  EXPECT_TRUE(absl::IsInvalidArgument(MakePool("file:").status()));
}

TEST(FilePoolTest, WakesTheReplicasListedNow) {
  TempDir tmp;
  LoopbackHttpServer a;
  LoopbackHttpServer b;
  Write(tmp / "pool", a.url() + "\n");
  auto pool = MakePool("file:" + (tmp / "pool").string());
  ASSERT_TRUE(pool.ok());
  EXPECT_EQ((*pool)->Wake(), 1);
  Rewrite(tmp / "pool", a.url() + "\n" + b.url() + "\n");
  EXPECT_EQ((*pool)->Wake(), 2);
  EXPECT_THAT(a.requests(), ElementsAre("POST /wake", "POST /wake"));
  EXPECT_THAT(b.requests(), ElementsAre("POST /wake"));
}

}  // namespace
}  // namespace stitch

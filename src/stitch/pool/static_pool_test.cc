#include "stitch/pool/static_pool.h"

#include <chrono>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "stitch/pool/pool.h"
#include "tests/support/loopback_http.h"

namespace stitch {
namespace {

using ::stitch::testing::LoopbackHttpServer;
using ::stitch::testing::UnreachableUrl;
using ::testing::ElementsAre;
using ::testing::HasSubstr;
using namespace std::chrono_literals;

std::vector<std::string> Discover(std::string_view spec) {
  auto pool = MakePool(spec);
  EXPECT_TRUE(pool.ok()) << spec << ": " << pool.status();
  if (!pool.ok()) return {};
  auto urls = (*pool)->Discover();
  EXPECT_TRUE(urls.ok());
  return urls.ok() ? *urls : std::vector<std::string>{};
}

TEST(StaticPoolTest, ParsesStaticSpecs) {
  EXPECT_THAT(Discover("static:http://a:1,https://b:2/"), ElementsAre("http://a:1", "https://b:2"));
  EXPECT_THAT(Discover("static: http://a:1 , ,http://a:1"), ElementsAre("http://a:1"));
  EXPECT_THAT(Discover("http://10.0.0.5:8000,http://10.0.0.6:8000/replica"),
              ElementsAre("http://10.0.0.5:8000", "http://10.0.0.6:8000/replica"));
}

TEST(StaticPoolTest, SpecRoundTrips) {
  auto pool = MakePool("http://a:1,http://b:2");
  ASSERT_TRUE(pool.ok());
  EXPECT_EQ((*pool)->spec(), "static:http://a:1,http://b:2");
}

TEST(StaticPoolTest, RejectsWhatIsNotAReplicaUrl) {
  for (std::string_view spec :
       {"static:", "static:localhost:8000", "static:ftp://a/", "static:http://a:1,nope",
        "static:http://a:1/?q=1", "static:http:///path"}) {
    auto pool = MakePool(spec);
    EXPECT_TRUE(absl::IsInvalidArgument(pool.status())) << spec << ": " << pool.status();
  }
  auto unknown = MakePool("dns:replicas.local");
  ASSERT_FALSE(unknown.ok());
  EXPECT_THAT(std::string(unknown.status().message()), HasSubstr("static:URL,URL"));
}

TEST(StaticPoolTest, WakePostsToEveryReplicaAndCountsAnswers) {
  LoopbackHttpServer a;
  LoopbackHttpServer b;
  auto pool = StaticPool::Parse("static:" + a.url() + "," + b.url() + "/");
  ASSERT_TRUE(pool.ok()) << pool.status();
  EXPECT_EQ((*pool)->Wake(), 2);
  EXPECT_THAT(a.requests(), ElementsAre("POST /wake"));
  EXPECT_THAT(b.requests(), ElementsAre("POST /wake"));
}

TEST(StaticPoolTest, WakesPresentTheBearerTokenWhenGivenOne) {
  LoopbackHttpServer a;
  auto with = StaticPool::Parse("static:" + a.url(), WakeOptions{.bearer_token = "tok-1"});
  ASSERT_TRUE(with.ok()) << with.status();
  EXPECT_EQ((*with)->Wake(), 1);
  auto without = StaticPool::Parse("static:" + a.url());
  ASSERT_TRUE(without.ok()) << without.status();
  EXPECT_EQ((*without)->Wake(), 1);
  EXPECT_THAT(a.authorizations(), ElementsAre("Bearer tok-1", ""));
}

TEST(StaticPoolTest, FailedWakesAreCountedOutNeverFatal) {
  LoopbackHttpServer ok;
  LoopbackHttpServer failing(LoopbackHttpServer::Options{.status = 500});
  auto pool = StaticPool::Parse(ok.url() + "," + failing.url() + "," + UnreachableUrl(),
                                WakeOptions{.timeout = 2000ms});
  ASSERT_TRUE(pool.ok()) << pool.status();
  EXPECT_EQ((*pool)->Wake(), 1);
  EXPECT_THAT(ok.requests(), ElementsAre("POST /wake"));
  EXPECT_THAT(failing.requests(), ElementsAre("POST /wake"));
}

TEST(StaticPoolTest, AHangingReplicaCostsAtMostTheTimeout) {
  LoopbackHttpServer ok;
  LoopbackHttpServer hanging(LoopbackHttpServer::Options{.hang = true});
  auto pool = StaticPool::Parse(hanging.url() + "," + ok.url(), WakeOptions{.timeout = 300ms});
  ASSERT_TRUE(pool.ok());
  auto start = std::chrono::steady_clock::now();
  EXPECT_EQ((*pool)->Wake(), 1);
  auto took = std::chrono::steady_clock::now() - start;
  // Concurrent: the answering replica is not stuck behind the hanging one,
  // and the hanging one is given up on after the timeout.
  EXPECT_GE(took, 250ms);
  EXPECT_LT(took, 5s);
  EXPECT_THAT(ok.requests(), ElementsAre("POST /wake"));
  EXPECT_TRUE(hanging.WaitForRequests(1, 5s));
}

TEST(StaticPoolTest, ConcurrencyIsBounded) {
  // Four hanging replicas, two at a time: the wake takes two timeouts, not one.
  std::vector<std::unique_ptr<LoopbackHttpServer>> servers;
  std::string spec = "static:";
  for (int i = 0; i < 4; ++i) {
    servers.push_back(
        std::make_unique<LoopbackHttpServer>(LoopbackHttpServer::Options{.hang = true}));
    if (i > 0) spec += ",";
    spec += servers.back()->url();
  }
  auto pool = StaticPool::Parse(spec, WakeOptions{.timeout = 300ms, .max_concurrency = 2});
  ASSERT_TRUE(pool.ok());
  auto start = std::chrono::steady_clock::now();
  EXPECT_EQ((*pool)->Wake(), 0);
  EXPECT_GE(std::chrono::steady_clock::now() - start, 550ms);
  for (auto& s : servers) EXPECT_TRUE(s->WaitForRequests(1, 5s));
}

TEST(StaticPoolTest, EmptyListWakesNobody) { EXPECT_EQ(WakeReplicas({}, WakeOptions{}), 0); }

}  // namespace
}  // namespace stitch

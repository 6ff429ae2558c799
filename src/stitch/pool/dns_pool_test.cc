#include "stitch/pool/dns_pool.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "stitch/pool/pool.h"
#include "tests/support/loopback_http.h"

namespace stitch {
namespace {

using ::stitch::testing::LoopbackHttpServer;
using ::testing::Contains;
using ::testing::ElementsAre;
using ::testing::HasSubstr;

TEST(DnsPoolTest, ResolvesANameFromTheSystemResolver) {
  // localhost comes from /etc/hosts: 127.0.0.1, and ::1 where IPv6 is set up.
  auto pool = MakePool("dns:localhost:8123");
  ASSERT_TRUE(pool.ok()) << pool.status();
  auto urls = (*pool)->Discover();
  ASSERT_TRUE(urls.ok()) << urls.status();
  EXPECT_THAT(*urls, Contains("http://127.0.0.1:8123"));
  for (const std::string& url : *urls) EXPECT_TRUE(url.ends_with(":8123")) << url;
  EXPECT_EQ((*pool)->spec(), "dns:localhost:8123");
}

TEST(DnsPoolTest, AddressLiteralsResolveToThemselves) {
  auto v4 = MakePool("dns:127.0.0.1:80");
  ASSERT_TRUE(v4.ok());
  EXPECT_THAT(*(*v4)->Discover(), ElementsAre("http://127.0.0.1:80"));
  auto v6 = MakePool("dns:[::1]:81");
  ASSERT_TRUE(v6.ok()) << v6.status();
  EXPECT_THAT(*(*v6)->Discover(), ElementsAre("http://[::1]:81"));
  EXPECT_EQ((*v6)->spec(), "dns:[::1]:81");
}

TEST(DnsPoolTest, RejectsMalformedSpecs) {
  for (std::string_view spec : {"dns:", "dns:name", "dns::80", "dns:name:0", "dns:name:70000",
                                "dns:name:http", "dns:[::1:80", "dns:::1:80"}) {
    auto pool = MakePool(spec);
    ASSERT_TRUE(absl::IsInvalidArgument(pool.status())) << spec << ": " << pool.status();
    EXPECT_THAT(std::string(pool.status().message()), HasSubstr("dns:NAME:PORT")) << spec;
  }
}

TEST(DnsPoolTest, ANameThatDoesNotResolveIsUnavailable) {
  auto pool = MakePool("dns:no-such-replica.invalid:8000");
  ASSERT_TRUE(pool.ok());
  auto urls = (*pool)->Discover();
  EXPECT_TRUE(absl::IsUnavailable(urls.status())) << urls.status();
  EXPECT_EQ((*pool)->Wake(), 0);
}

TEST(DnsPoolTest, WakesEveryResolvedAddress) {
  LoopbackHttpServer replica;
  const std::string port = replica.url().substr(replica.url().rfind(':') + 1);
  auto pool = MakePool("dns:127.0.0.1:" + port);
  ASSERT_TRUE(pool.ok());
  EXPECT_EQ((*pool)->Wake(), 1);
  EXPECT_THAT(replica.requests(), ElementsAre("POST /wake"));
}

}  // namespace
}  // namespace stitch

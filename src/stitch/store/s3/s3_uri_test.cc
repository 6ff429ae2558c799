#include "stitch/store/s3/s3_uri.h"

#include <gtest/gtest.h>

#include "absl/strings/match.h"

namespace stitch {
namespace {

S3Environment NoEnv() { return S3Environment{}; }

TEST(S3UriTest, ParsesBucketPrefixEndpointAndRegion) {
  auto loc = ParseS3Uri("s3://my-bucket/runs/a/?endpoint=http://127.0.0.1:9000/&region=eu-west-1",
                        NoEnv());
  ASSERT_TRUE(loc.ok()) << loc.status().message();
  EXPECT_EQ(loc->bucket, "my-bucket");
  EXPECT_EQ(loc->prefix, "runs/a");
  EXPECT_EQ(loc->endpoint, "http://127.0.0.1:9000");
  EXPECT_EQ(loc->region, "eu-west-1");
  EXPECT_EQ(loc->Display(), "s3://my-bucket/runs/a");
  EXPECT_EQ(loc->Key("latest"), "runs/a/latest");
  // The normalized URI reopens to the same place.
  auto again = ParseS3Uri(loc->uri, NoEnv());
  ASSERT_TRUE(again.ok()) << loc->uri << ": " << again.status().message();
  EXPECT_EQ(again->endpoint, loc->endpoint);
  EXPECT_EQ(again->region, loc->region);
  EXPECT_EQ(again->prefix, loc->prefix);
}

TEST(S3UriTest, FillsInFromTheEnvironment) {
  S3Environment env;
  env.region = "ap-south-1";
  env.endpoint_url = "https://minio.example:9443";
  auto loc = ParseS3Uri("s3://bucket", env);
  ASSERT_TRUE(loc.ok());
  EXPECT_EQ(loc->prefix, "");
  EXPECT_EQ(loc->region, "ap-south-1");
  EXPECT_EQ(loc->endpoint, "https://minio.example:9443");
  EXPECT_EQ(loc->Key("latest"), "latest");
  // The URI wins over the environment; us-east-1 is the last resort.
  auto own = ParseS3Uri("s3://bucket/p?region=us-west-2", env);
  ASSERT_TRUE(own.ok());
  EXPECT_EQ(own->region, "us-west-2");
  auto bare = ParseS3Uri("s3://bucket/p", NoEnv());
  ASSERT_TRUE(bare.ok());
  EXPECT_EQ(bare->region, "us-east-1");
  EXPECT_EQ(bare->endpoint, "");
}

TEST(S3UriTest, PercentDecodesThePrefix) {
  auto loc = ParseS3Uri("s3://bucket/a%20b/c+d", NoEnv());
  ASSERT_TRUE(loc.ok());
  EXPECT_EQ(loc->prefix, "a b/c+d");
}

TEST(S3UriTest, RefusesWhatS3WouldNot) {
  for (const char* bad : {"s3://",
                          "s3:///p",
                          "http://bucket/p",
                          "s3://ab/p",
                          "s3://Bucket/p",
                          "s3://bu_cket/p",
                          "s3://-bucket/p",
                          "s3://buck..et/p",
                          "s3://bucket/a//b",
                          "s3://bucket/./b",
                          "s3://bucket/a/..",
                          "s3://bucket/p?x=1",
                          "s3://bucket/p?region=a&region=b",
                          "s3://bucket/p?endpoint=ftp://h",
                          "s3://bucket/p?endpoint=http://u@h/",
                          "s3://bucket/p?endpoint=nohost",
                          "s3://bucket/p?region=EU",
                          "s3://u:p@bucket/p",
                          "s3://bucket:80/p",
                          "s3://bucket/p#f",
                          "s3://bucket/a%5Cb",
                          "not a uri"}) {
    auto loc = ParseS3Uri(bad, NoEnv());
    EXPECT_TRUE(absl::IsInvalidArgument(loc.status())) << bad;
    EXPECT_TRUE(absl::StrContains(loc.status().message(), "s3://BUCKET")) << loc.status().message();
  }
}

// Unsigned access is asked for in the URI, in so many words, and kept in
// its normalized form.
TEST(S3UriTest, AnonymousAccessIsAskedForByName) {
  auto plain = ParseS3Uri("s3://bucket/p", NoEnv());
  ASSERT_TRUE(plain.ok());
  EXPECT_FALSE(plain->anonymous);
  auto loc = ParseS3Uri("s3://bucket/p?region=eu-west-1&anonymous=true", NoEnv());
  ASSERT_TRUE(loc.ok()) << loc.status().message();
  EXPECT_TRUE(loc->anonymous);
  EXPECT_EQ(loc->uri, "s3://bucket/p?region=eu-west-1&anonymous=true");
  auto again = ParseS3Uri(loc->uri, NoEnv());
  ASSERT_TRUE(again.ok());
  EXPECT_TRUE(again->anonymous);
  auto off = ParseS3Uri("s3://bucket/p?anonymous=false", NoEnv());
  ASSERT_TRUE(off.ok());
  EXPECT_FALSE(off->anonymous);
  EXPECT_EQ(off->uri, "s3://bucket/p");
  for (const char* bad :
       {"s3://bucket/p?anonymous=1", "s3://bucket/p?anonymous=yes",
        "s3://bucket/p?anonymous=", "s3://bucket/p?anonymous=true&anonymous=true"}) {
    auto refused = ParseS3Uri(bad, NoEnv());
    EXPECT_TRUE(absl::IsInvalidArgument(refused.status())) << bad;
    EXPECT_TRUE(absl::StrContains(refused.status().message(), "anonymous"))
        << refused.status().message();
  }
}

TEST(S3UriTest, RequestUrlsArePathStyleWithAnEndpointAndEncodedForSigV4) {
  auto loc = ParseS3Uri("s3://bucket/p?endpoint=http://127.0.0.1:9000", NoEnv());
  ASSERT_TRUE(loc.ok());
  EXPECT_EQ(loc->RequestUrl("p/a b+c=d/x~y.z", {}),
            "http://127.0.0.1:9000/bucket/p/a%20b%2Bc%3Dd/x~y.z");
  // Sorted by name, every reserved character encoded (the continuation
  // token's '/', '+' and '=' included), empty values kept as "k=".
  EXPECT_EQ(loc->RequestUrl("", {{"prefix", "p/u"},
                                 {"list-type", "2"},
                                 {"continuation-token", "a+b/c="},
                                 {"uploads", ""}}),
            "http://127.0.0.1:9000/bucket?continuation-token=a%2Bb%2Fc%3D&list-type=2&prefix=p%"
            "2Fu&uploads=");
}

TEST(S3UriTest, RequestUrlsAreVirtualHostedOnAws) {
  auto loc = ParseS3Uri("s3://bucket/p?region=eu-west-1", NoEnv());
  ASSERT_TRUE(loc.ok());
  EXPECT_EQ(loc->RequestUrl("p/latest", {}), "https://bucket.s3.eu-west-1.amazonaws.com/p/latest");
  // A dotted bucket cannot match the wildcard certificate: path-style.
  auto dotted = ParseS3Uri("s3://my.bucket/p", NoEnv());
  ASSERT_TRUE(dotted.ok());
  EXPECT_EQ(dotted->RequestUrl("p/latest", {}),
            "https://s3.us-east-1.amazonaws.com/my.bucket/p/latest");
}

}  // namespace
}  // namespace stitch

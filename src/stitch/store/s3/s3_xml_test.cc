#include "stitch/store/s3/s3_xml.h"

#include <gtest/gtest.h>

#include "absl/strings/match.h"
#include "stitch/io/sha256.h"

namespace stitch {
namespace {

TEST(S3XmlTest, ParsesAnErrorDocument) {
  auto e = ParseS3Error(
      "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>NoSuchKey</Code>"
      "<Message>The specified key &amp; more does not exist.</Message><Key>a</Key></Error>");
  ASSERT_TRUE(e.ok()) << e.status().message();
  EXPECT_EQ(e->code, "NoSuchKey");
  EXPECT_EQ(e->message, "The specified key & more does not exist.");
  EXPECT_FALSE(ParseS3Error("<ListBucketResult/>").ok());
  EXPECT_FALSE(ParseS3Error("not xml").ok());
  EXPECT_FALSE(ParseS3Error("").ok());
}

TEST(S3XmlTest, ParsesListObjectsV2Pages) {
  const char* page =
      R"(<?xml version="1.0" encoding="UTF-8"?>
<ListBucketResult xmlns="http://s3.amazonaws.com/doc/2006-03-01/">
  <Name>b</Name><Prefix>p/</Prefix><KeyCount>2</KeyCount><MaxKeys>2</MaxKeys>
  <IsTruncated>true</IsTruncated>
  <Contents><Key>p/a</Key><Size>10</Size><ETag>"x"</ETag></Contents>
  <Contents><Key>p/b &lt;1&gt;</Key><Size>0</Size></Contents>
  <NextContinuationToken>tok+/=</NextContinuationToken>
</ListBucketResult>)";
  auto parsed = ParseListObjectsV2(page);
  ASSERT_TRUE(parsed.ok()) << parsed.status().message();
  ASSERT_EQ(parsed->objects.size(), 2u);
  EXPECT_EQ(parsed->objects[0].key, "p/a");
  EXPECT_EQ(parsed->objects[0].size, 10u);
  EXPECT_EQ(parsed->objects[1].key, "p/b <1>");
  EXPECT_TRUE(parsed->truncated);
  EXPECT_EQ(parsed->next_continuation_token, "tok+/=");

  auto last =
      ParseListObjectsV2("<ListBucketResult><IsTruncated>false</IsTruncated></ListBucketResult>");
  ASSERT_TRUE(last.ok());
  EXPECT_TRUE(last->objects.empty());
  EXPECT_FALSE(last->truncated);

  EXPECT_FALSE(ParseListObjectsV2("<ListBucketResult><IsTruncated>true</IsTruncated>"
                                  "</ListBucketResult>")
                   .ok());
  EXPECT_FALSE(ParseListObjectsV2("<ListBucketResult><Contents><Key>k</Key><Size>-1</Size>"
                                  "</Contents></ListBucketResult>")
                   .ok());
  EXPECT_FALSE(ParseListObjectsV2("<ListBucketResult><Contents>").ok());
}

TEST(S3XmlTest, ParsesTheUploadIdOfAMultipartUpload) {
  auto id = ParseInitiateMultipartUpload(
      "<InitiateMultipartUploadResult><Bucket>b</Bucket><Key>k</Key>"
      "<UploadId>abc-123</UploadId></InitiateMultipartUploadResult>");
  ASSERT_TRUE(id.ok());
  EXPECT_EQ(*id, "abc-123");
  EXPECT_FALSE(ParseInitiateMultipartUpload("<InitiateMultipartUploadResult/>").ok());
}

TEST(S3XmlTest, RefusesDoctypesAndDeepNesting) {
  auto entity = ParseXml(
      "<!DOCTYPE r [<!ENTITY a \"aaaa\"><!ENTITY b "
      "\"&a;&a;&a;\">]><Error><Code>&b;</Code></Error>");
  EXPECT_FALSE(entity.ok());
  EXPECT_TRUE(absl::StrContains(entity.status().message(), "DOCTYPE"));
  std::string deep;
  for (int i = 0; i < 100; ++i) deep += "<a>";
  for (int i = 0; i < 100; ++i) deep += "</a>";
  EXPECT_FALSE(ParseXml(deep).ok());
  EXPECT_FALSE(ParseXml("<a></a><b></b>").ok());
}

TEST(S3XmlTest, CompleteMultipartUploadBodyEscapesEtags) {
  std::string body = CompleteMultipartUploadXml({"\"e1\"", "\"e&2\""});
  auto doc = ParseXml(body);
  ASSERT_TRUE(doc.ok()) << body;
  ASSERT_EQ(doc->children.size(), 2u);
  EXPECT_EQ(doc->children[0].ChildText("PartNumber"), "1");
  EXPECT_EQ(doc->children[0].ChildText("ETag"), "\"e1\"");
  EXPECT_EQ(doc->children[1].ChildText("PartNumber"), "2");
  EXPECT_EQ(doc->children[1].ChildText("ETag"), "\"e&2\"");
}

TEST(Sha256Test, MatchesKnownDigests) {
  EXPECT_EQ(Sha256Hex(""), kEmptySha256);
  EXPECT_EQ(Sha256Hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  Sha256 streaming;
  streaming.Update("a");
  streaming.Update("bc");
  EXPECT_EQ(streaming.FinishHex(), Sha256Hex("abc"));
  EXPECT_EQ(streaming.FinishHex(), kEmptySha256);  // starts over
  EXPECT_EQ(Sha256HexToBase64(Sha256Hex("abc")), "ungWv48Bz+pBQUDeXa4iI7ADYaOWF3qctBD/YfIAFa0=");
  EXPECT_TRUE(IsSha256Hex(Sha256Hex("x")));
  EXPECT_FALSE(IsSha256Hex("abc"));
}

}  // namespace
}  // namespace stitch

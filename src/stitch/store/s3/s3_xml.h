// The XML documents the S3 store exchanges with the service, read with
// libexpat (never by searching strings) and written with escaping.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

namespace stitch {

// An element of a parsed document: its (unqualified) name, its text with
// surrounding whitespace removed, and its child elements in order.
struct XmlElement {
  std::string name;
  std::string text;
  std::vector<XmlElement> children;

  // The first child named `name`, or nullptr.
  const XmlElement* Child(std::string_view name) const;
  // The text of the first child named `name`, or "" when absent.
  std::string ChildText(std::string_view name) const;
};

// Parses a whole document. InvalidArgument on malformed XML, a DOCTYPE
// (no entity expansion ever happens), or nesting deeper than 64.
[[nodiscard]] absl::StatusOr<XmlElement> ParseXml(std::string_view xml);

// An S3 error document: <Error><Code>..</Code><Message>..</Message></Error>.
struct S3ErrorDocument {
  std::string code;
  std::string message;
};
// The error in `xml`, or InvalidArgument when it is not an <Error> document.
[[nodiscard]] absl::StatusOr<S3ErrorDocument> ParseS3Error(std::string_view xml);

// One page of a ListObjectsV2 answer.
struct S3ObjectSummary {
  std::string key;
  uint64_t size = 0;
};
struct S3ListPage {
  std::vector<S3ObjectSummary> objects;
  bool truncated = false;
  std::string next_continuation_token;  // set when truncated
};
[[nodiscard]] absl::StatusOr<S3ListPage> ParseListObjectsV2(std::string_view xml);

// The UploadId of an InitiateMultipartUploadResult.
[[nodiscard]] absl::StatusOr<std::string> ParseInitiateMultipartUpload(std::string_view xml);

// The body of a CompleteMultipartUpload request for parts 1..N with the
// ETags the service returned for each, in order.
std::string CompleteMultipartUploadXml(const std::vector<std::string>& part_etags);

}  // namespace stitch

// The percent-encoding AWS Signature Version 4 requires of request paths,
// query strings and form bodies. Depends on nothing else of the S3 store, so
// that the URI parser (s3_uri.h) and the credential sources
// (s3_credentials.h) can both use it without depending on each other.
#pragma once

#include <string>
#include <string_view>

namespace stitch {

// Whether SigV4Encode leaves '/' as is (object key paths) or encodes it
// (query parameters, form fields).
enum class SlashEncoding { kKeep, kEncode };

// Percent-encodes `text` as SigV4 requires for URI paths and query strings:
// everything but RFC 3986 unreserved characters (and '/' with
// SlashEncoding::kKeep) becomes %XX with uppercase hex. Pure; thread-safe.
std::string SigV4Encode(std::string_view text, SlashEncoding slash);

}  // namespace stitch

// Where an S3 store lives and how to reach it: the `s3://` store URI, the
// standard AWS environment variables, and the request URLs they make.
//
//   s3://BUCKET[/PREFIX][?endpoint=URL][&region=REGION][&anonymous=true]
//
// The endpoint comes from `?endpoint=`, else AWS_ENDPOINT_URL_S3, else
// AWS_ENDPOINT_URL, else AWS's own virtual-hosted endpoint for the region;
// with an explicit endpoint (MinIO, Ceph, R2, a local test server) requests
// use path-style addressing. The region comes from `?region=`, else
// AWS_REGION, else AWS_DEFAULT_REGION, else the profile's `region` in the
// AWS config file, else (on AWS's own endpoint only) instance metadata, else
// us-east-1. Credentials: s3_credentials.h; `anonymous=true` sends every
// request unsigned without looking for any (a public bucket: the AWS CLI's
// --no-sign-request, boto3's signature_version=UNSIGNED), and without it a
// store with no credentials anywhere is refused rather than read unsigned.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "stitch/store/s3/s3_credentials.h"

namespace stitch {

// The AWS settings a process was started with. Separate from the process
// environment so that tests can state them.
struct S3Environment {
  std::string access_key_id;      // AWS_ACCESS_KEY_ID
  std::string secret_access_key;  // AWS_SECRET_ACCESS_KEY
  std::string session_token;      // AWS_SESSION_TOKEN (optional)
  // AWS_REGION, else AWS_DEFAULT_REGION, else the profile's (optional).
  std::string region;
  std::string endpoint_url;  // AWS_ENDPOINT_URL_S3, else AWS_ENDPOINT_URL (optional)
  // The other credential sources (s3_credentials.h); all off when built by
  // hand, so that only the keys above are used.
  AwsCredentialSettings credentials;

  // Reads the variables above from the process environment.
  static S3Environment FromProcess();
};

struct S3Location {
  std::string bucket;
  // The key prefix every object of the store lives under, without leading or
  // trailing '/' ("" for the bucket's root). Percent-decoded.
  std::string prefix;
  std::string region;
  // Scheme, host, port and optional base path of the service, without a
  // trailing '/' ("http://127.0.0.1:9000"); "" for AWS's own endpoint.
  std::string endpoint;
  // `anonymous=true`: requests go unsigned and no credential source is
  // consulted. False: requests are signed, and without credentials refused.
  bool anonymous = false;
  // The URI as given, normalized: "s3://bucket/prefix" plus the query
  // parameters it named. Reopening it gives the same location.
  std::string uri;

  // "s3://bucket/prefix", for messages.
  std::string Display() const;
  // "s3://bucket/<key>", for messages about one object.
  std::string DisplayKey(std::string_view key) const;
  // The full key of `relative` under the prefix ("prefix/latest").
  std::string Key(std::string_view relative) const;

  // The request URL of `key` (may be empty: the bucket itself) with
  // `query`, percent-encoded and sorted as SigV4 requires (libcurl 7.88
  // signs the URL's query exactly as written). Path-style with an explicit
  // endpoint; virtual-hosted on AWS unless the bucket name holds a '.'
  // (which TLS wildcard certificates cannot cover).
  std::string RequestUrl(std::string_view key,
                         std::vector<std::pair<std::string, std::string>> query) const;
};

// Parses an `s3://` store URI (with Boost.URL), filling in what it leaves
// out from `env`. InvalidArgument, naming the URI, for: another scheme, a
// bucket name S3 would refuse, an empty, "." or ".." prefix segment, user
// info, a port or fragment, an unknown or repeated query parameter, an
// endpoint that is not an absolute http(s) URL, a region that is not a
// plain token, an `anonymous` other than "true" or "false".
[[nodiscard]] absl::StatusOr<S3Location> ParseS3Uri(std::string_view uri, const S3Environment& env);

}  // namespace stitch

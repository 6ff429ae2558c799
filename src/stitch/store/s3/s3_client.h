// S3Client: signed S3 requests over libcurl, with retries.
//
// Each request is signed (unsigned only for a location that asks for it with
// anonymous=true), with the credentials current when it starts
// (s3_credentials.h: the SDKs' chain of sources, refreshed ahead of expiry),
// by libcurl's AWS SigV4 (CURLOPT_AWS_SIGV4,
// "aws:amz:REGION:s3"). libcurl 7.88 signs S3 correctly only when the
// request carries `x-amz-content-sha256` and its query is already sorted and
// percent-encoded, so the client always sends the payload's SHA-256 and
// builds URLs with S3Location::RequestUrl. TLS peers are always verified.
//
// Retries: connection failures, timeouts, stalled transfers, 5xx, 429 and
// S3's 400 RequestTimeout are retried with exponential backoff and full
// jitter, up to S3ClientOptions::max_attempts attempts in all. Other 4xx
// answers are returned at once, except an expired-token answer to a request
// signed with temporary credentials, which is retried with fresh ones.
//
// Thread-safety: safe to call from several threads at once; each request
// borrows one of the client's curl handles (which keep their connections).
#pragma once

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "stitch/io/byte_sink.h"
#include "stitch/store/s3/s3_credentials.h"
#include "stitch/store/s3/s3_uri.h"

namespace stitch {

struct S3ClientOptions {
  // Attempts per request, the first included. At least 1.
  int max_attempts = 5;
  // Backoff before retry k (k = 1, 2, ...) is uniform in
  // [0, min(max_backoff, initial_backoff * 2^(k-1))].
  absl::Duration initial_backoff = absl::Milliseconds(100);
  absl::Duration max_backoff = absl::Seconds(5);
  absl::Duration connect_timeout = absl::Seconds(10);
  // A transfer slower than 1 KiB/s for this long is abandoned (and retried).
  absl::Duration stall_timeout = absl::Seconds(60);
  // How the client waits between attempts; absl::SleepFor when unset.
  std::function<void(absl::Duration)> sleep;
  // Where request credentials come from; when null, the SDKs' default chain
  // over the S3Environment given to Create.
  std::shared_ptr<AwsCredentialsProvider> credentials;
};

struct S3Request {
  std::string method = "GET";  // GET, HEAD, PUT, POST or DELETE
  std::string key;             // full object key; "" for the bucket
  std::vector<std::pair<std::string, std::string>> query;
  std::vector<std::pair<std::string, std::string>> headers;
  // The payload: `body`, or, when `body_file` is set, `body_size` bytes of
  // that file from `body_offset`.
  std::string body;
  std::optional<std::filesystem::path> body_file;
  uint64_t body_offset = 0;
  uint64_t body_size = 0;
  // Hex SHA-256 of the payload; computed from `body` when left empty.
  // REQUIRES: set when `body_file` is.
  std::string payload_sha256;
  // Where a 2xx body goes; buffered into S3Response::body when null.
  ByteSink* sink = nullptr;
  // The largest body buffered (OutOfRange beyond, before any of it is held
  // when the answer declares its length); 0: the client's own limit, 256 MiB.
  uint64_t max_buffered_body = 0;
};

struct S3Response {
  long status = 0;
  std::map<std::string, std::string> headers;  // names lowercased
  std::string body;
  int attempts = 0;
  // Where the credentials that signed the last attempt came from; "" when it
  // went unsigned.
  std::string credentials_source;

  bool ok() const { return status >= 200 && status < 300; }
  // The header's value, or "" when absent. `name` must be lowercase.
  std::string Header(std::string_view name) const;
  // The object's user metadata `x-amz-meta-<name>`, or "".
  std::string Metadata(std::string_view name) const { return Header(MetaHeader(name)); }
  static std::string MetaHeader(std::string_view name);
  // The S3 error code in the body ("NoSuchKey"), or "" when there is none.
  std::string ErrorCode() const;
};

// The user-metadata key under which every object the S3 store writes records
// its SHA-256 (hex): `x-amz-meta-stitch-sha256`, the key the original Python
// Stitch writes and checks, so either can read what the other wrote.
inline constexpr std::string_view kSha256MetadataKey = "stitch-sha256";
// The key earlier versions of this store wrote and read
// (`x-amz-meta-sha256`): written too, with the same value, so that sidecars
// of those versions keep reading what a newer publisher wrote while a fleet
// is upgraded; read when the original's key is absent.
inline constexpr std::string_view kLegacySha256MetadataKey = "sha256";

// The SHA-256 an object's answer records (lowercased hex, unvalidated), from
// kSha256MetadataKey, else kLegacySha256MetadataKey; "" when neither is
// there. DataLoss when both are there and disagree: the object cannot be
// trusted.
[[nodiscard]] absl::StatusOr<std::string> RecordedSha256(const S3Response& response);

// What an object is, from a HEAD or GET answer.
struct S3ObjectInfo {
  uint64_t size = 0;
  std::string etag;             // as sent, quotes included
  std::string sha256;           // RecordedSha256, "" when absent
  std::string checksum_sha256;  // x-amz-checksum-sha256 (base64), "" when absent

  static absl::StatusOr<S3ObjectInfo> FromResponse(const S3Response& response);
};

class S3Client {
 public:
  // REQUIRES: options.max_attempts >= 1. InvalidArgument when only one of
  // the access key id and the secret is set. Requests are signed; with
  // `location.anonymous` they go unsigned and no credentials are looked up.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<S3Client>> Create(
      S3Location location, const S3Environment& env, S3ClientOptions options = {});
  ~S3Client();

  const S3Location& location() const { return location_; }

  // Sends `request`, retrying as described above. Returns the final answer
  // whatever its status (a 5xx after the last attempt included); an error
  // only when no answer came (Unavailable, naming the endpoint and the
  // cause, after the retries), when the body's file or the sink failed
  // (their own error), or when no credentials could be had: the
  // provider's error, or Unauthenticated when no source has any and the
  // location is not anonymous (one line naming the sources tried and
  // anonymous=true), as the AWS SDKs refuse with NoCredentialsError.
  [[nodiscard]] absl::StatusOr<S3Response> Send(const S3Request& request);

  // The one-line error for a non-2xx answer to `operation` ("read",
  // "upload") on `key`: PermissionDenied (403, with what to check),
  // NotFound (404: the bucket or the key), FailedPrecondition (a redirect
  // to another region, 412), Aborted (409), Unavailable (5xx, 429),
  // InvalidArgument (other 4xx).
  absl::Status ErrorFor(const S3Response& response, std::string_view operation,
                        std::string_view key) const;

  // Requests sent, retries included (tests use it to count round trips).
  int64_t attempts_sent() const { return attempts_.load(); }

 private:
  struct Handle;
  S3Client(S3Location location, S3ClientOptions options);
  std::unique_ptr<Handle> Acquire();
  void Release(std::unique_ptr<Handle> handle);
  // The refusal of a signed request when no credential source has any.
  absl::Status NoCredentialsError() const;
  // One attempt. Fills `response`; a non-OK status is a transport failure
  // (`retryable` says whether another attempt may help).
  absl::Status Perform(Handle& handle, const S3Request& request, const std::string& url,
                       const std::string& payload_sha256, const AwsCredentials* credentials,
                       S3Response& response, bool& retryable);
  absl::Duration Backoff(int retry);

  const S3Location location_;
  const S3ClientOptions options_;  // options_.credentials is set
  const std::string sigv4_;        // "aws:amz:REGION:s3"
  std::atomic<int64_t> attempts_{0};

  absl::Mutex mu_;
  std::vector<std::unique_ptr<Handle>> idle_ ABSL_GUARDED_BY(mu_);
};

}  // namespace stitch

// What the credential sources (s3_credential_sources.h) share: reading a
// small file (a token, a key file), one HTTP exchange with a credential
// service (STS, a container endpoint, instance metadata), and the JSON
// credential document those services serve. Internal to the store library.
//
// Thread-safety: every function here is safe to call from several threads
// at once. Each may block (file reads, HTTP): never call one on an
// event-loop thread.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "stitch/store/s3/s3_credentials.h"

namespace stitch {

// `text` without leading and trailing ASCII whitespace.
std::string TrimWhitespace(std::string_view text);

// The whole of the file at `path`, at most 1 MiB (tokens and credential
// files are small; anything larger is not one). FailedPrecondition naming
// `what` and `path` when it cannot be read or is larger.
[[nodiscard]] absl::StatusOr<std::string> ReadCredentialFile(const std::string& path,
                                                             std::string_view what);

// One request to a credential service.
struct CredentialHttpCall {
  std::string method = "GET";  // "GET", "POST" or "PUT"
  std::string url;
  std::vector<std::string> headers;  // "Name: value"
  std::string body;                  // sent with POST only
  absl::Duration timeout = absl::Seconds(10);
  // Link-local credential services are never reached through a proxy.
  bool direct = false;
  // Signs the request with SigV4 for `sigv4` ("aws:amz:REGION:sts") when
  // set. Not owned; must outlive the call.
  const AwsCredentials* signer = nullptr;
  std::string sigv4;
};

struct CredentialHttpAnswer {
  long status = 0;
  std::string body;  // at most 1 MiB
};

// Sends `call` (libcurl; http and https only). Any HTTP status is an
// answer; Unavailable (naming the method and URL) when none came: refused,
// timed out, or an answer over 1 MiB.
[[nodiscard]] absl::StatusOr<CredentialHttpAnswer> CredentialHttpExchange(
    const CredentialHttpCall& call);

// An RFC 3339 expiration ("2026-01-01T00:00:00Z"); InvalidArgument quoting
// `text` otherwise.
[[nodiscard]] absl::StatusOr<absl::Time> ParseCredentialExpiration(std::string_view text);

// The credentials in the JSON document container credential endpoints and
// instance metadata serve (AccessKeyId, SecretAccessKey, Token,
// Expiration; `source` left empty). PermissionDenied when its Code is
// present and not "Success"; InvalidArgument when it is not a JSON object,
// lacks either key, or has a malformed Expiration.
[[nodiscard]] absl::StatusOr<AwsCredentials> CredentialsFromJson(std::string_view text);

}  // namespace stitch

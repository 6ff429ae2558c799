// AWS STS, as the credential sources use it (s3_credential_sources.h): where
// it is, and the two exchanges that turn an identity into temporary
// credentials. Internal to the store library.
//
// Thread-safety: the functions are safe to call from several threads at
// once; each blocks on one HTTP exchange: never call one on an event-loop
// thread.
#pragma once

#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "stitch/store/s3/s3_credentials.h"

namespace stitch {

// Where STS requests go and how they are made.
struct StsEndpoint {
  std::string endpoint;  // "https://sts.us-east-1.amazonaws.com"; no trailing '/'
  std::string region;    // the region requests are signed for
  absl::Duration timeout = absl::Seconds(10);
  // DurationSeconds asked for; zero leaves it to STS.
  absl::Duration session_duration = absl::ZeroDuration();

  // `settings.sts_endpoint_url` (else AWS's own endpoint for the region),
  // `settings.region` (else us-east-1), and the options' HTTP timeout and
  // session duration.
  static StsEndpoint From(const AwsCredentialSettings& settings,
                          const AwsCredentialsOptions& options);
};

// "stitch-<unix seconds>", the session name used when none is configured.
std::string DefaultStsSessionName();

// Calls `action` (AssumeRole, AssumeRoleWithWebIdentity) with `fields`
// (RoleArn, RoleSessionName, ...) form-encoded, signed with `signer` when
// not null (not owned), unsigned otherwise, and returns the temporary
// credentials STS issued (`source` left empty). Errors name the action and
// the endpoint: Unavailable when STS did not answer, answered 5xx or 429, or
// answered without complete credentials; PermissionDenied for any other
// refusal, with STS's error code and message.
[[nodiscard]] absl::StatusOr<AwsCredentials> StsAssumeRole(
    const StsEndpoint& sts, std::string_view action,
    std::vector<std::pair<std::string, std::string>> fields, const AwsCredentials* signer);

// AssumeRoleWithWebIdentity for `role_arn` with the token read from
// `token_file` now (Kubernetes rotates it) and `session_name` (else
// DefaultStsSessionName()). FailedPrecondition when the file cannot be read
// or holds only whitespace; else as StsAssumeRole.
[[nodiscard]] absl::StatusOr<AwsCredentials> StsAssumeRoleWithWebIdentity(
    const StsEndpoint& sts, const std::string& token_file, const std::string& role_arn,
    const std::string& session_name);

}  // namespace stitch

// Credentials for S3 requests, resolved the way the AWS SDKs resolve them,
// in their order, and refreshed before they expire:
//
//   1. environment: AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and, for
//      temporary credentials, AWS_SESSION_TOKEN;
//   2. web identity: AWS_WEB_IDENTITY_TOKEN_FILE and AWS_ROLE_ARN (with
//      AWS_ROLE_SESSION_NAME), exchanged with STS AssumeRoleWithWebIdentity
//      (Kubernetes service-account roles); the token file is read again at
//      every refresh, since Kubernetes rotates it;
//   3. the shared files' profile (AWS_PROFILE, else "default") in
//      AWS_SHARED_CREDENTIALS_FILE (~/.aws/credentials) and AWS_CONFIG_FILE
//      (~/.aws/config): static keys, `role_arn` with
//      `web_identity_token_file`, or `role_arn` with `source_profile` (STS
//      AssumeRole signed with the source profile's static keys);
//   4. container credentials: AWS_CONTAINER_CREDENTIALS_FULL_URI or
//      AWS_CONTAINER_CREDENTIALS_RELATIVE_URI (ECS, EKS Pod Identity), with
//      AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE (read at every fetch) or
//      AWS_CONTAINER_AUTHORIZATION_TOKEN;
//   5. EC2 instance metadata with IMDSv2 session tokens (IMDSv1 when the
//      service refuses tokens), unless AWS_EC2_METADATA_DISABLED=true.
//
// The first source that is configured decides: a source that is configured
// but fails (an unreadable token file, STS refusing the token, a profile
// that does not exist) is an error naming every source tried, rather than a
// silent fall-through to the next. When no source is configured and
// instance metadata does not answer, requests go unsigned (public buckets).
//
// Endpoints follow the SDKs' overrides: STS at AWS_ENDPOINT_URL_STS, else
// AWS_ENDPOINT_URL, else https://sts.REGION.amazonaws.com; instance metadata
// at AWS_EC2_METADATA_SERVICE_ENDPOINT, else http://169.254.169.254.
//
// Temporary credentials are refreshed ahead of their expiry (15 minutes, or
// half their lifetime when they live less than 30 minutes), so that a
// request signed with what Current() returns has that long to start; a
// failed refresh keeps the current credentials while they are still valid
// and tries again later. A request is signed when it starts (each attempt,
// each part of a multipart upload), and S3 checks a signature only when a
// request starts, so a long transfer never fails because the credentials
// rotated while it ran.
//
// The types and the provider port only: each source on its own is in
// s3_credential_sources.h, the chain over them in s3_credential_chain.h.
#pragma once

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"

namespace stitch {

// Where the credential sources other than the static keys are, as the
// process environment names them. An AwsCredentialSettings built by hand
// has every field empty, which turns every such source off;
// AwsCredentialSettingsFromProcess() (s3_credential_chain.h) fills in the
// SDKs' defaults.
struct AwsCredentialSettings {
  // Web identity (AWS_WEB_IDENTITY_TOKEN_FILE, AWS_ROLE_ARN,
  // AWS_ROLE_SESSION_NAME).
  std::string web_identity_token_file;
  std::string role_arn;
  std::string role_session_name;
  // The shared files (AWS_SHARED_CREDENTIALS_FILE, AWS_CONFIG_FILE; ""
  // skips a file) and the profile to use in them (AWS_PROFILE, else
  // AWS_DEFAULT_PROFILE). An empty profile means "default", which may be
  // absent; a named profile must exist.
  std::string shared_credentials_file;
  std::string config_file;
  std::string profile;
  // Container credentials (AWS_CONTAINER_CREDENTIALS_FULL_URI, ..._RELATIVE_URI,
  // AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE, AWS_CONTAINER_AUTHORIZATION_TOKEN)
  // and the host a relative URI is taken from (http://169.254.170.2).
  std::string container_full_uri;
  std::string container_relative_uri;
  std::string container_authorization_token_file;
  std::string container_authorization_token;
  std::string container_host;
  // The instance metadata service ("" when not to be asked).
  std::string ec2_metadata_endpoint;
  // STS (AWS_ENDPOINT_URL_STS, else AWS_ENDPOINT_URL; "" for AWS's own) and
  // the region its requests go to and are signed for.
  std::string sts_endpoint_url;
  std::string region;
};

// One set of keys and where it came from.
struct AwsCredentials {
  std::string access_key_id;
  std::string secret_access_key;
  std::string session_token;  // "" for long-term keys
  // When temporary credentials stop working; nullopt for long-term keys.
  std::optional<absl::Time> expiration;
  // For messages: "environment variables (AWS_ACCESS_KEY_ID)",
  // "web identity (role arn:aws:iam::1:role/r)", ...
  std::string source;
};

// The port the S3 client signs with. Thread-safe.
class AwsCredentialsProvider {
 public:
  virtual ~AwsCredentialsProvider() = default;

  // The credentials to sign one request with, valid for a while yet;
  // nullopt when no source has any (the request goes unsigned). Errors
  // (PermissionDenied, Unavailable, InvalidArgument) name the sources tried
  // and what failed. May block on a credential service: never call it on an
  // event-loop thread.
  [[nodiscard]] virtual absl::StatusOr<std::optional<AwsCredentials>> Current() = 0;

  // Forgets cached temporary credentials (the service said they expired),
  // so that the next Current() fetches new ones.
  virtual void Invalidate() = 0;

  // The sources this provider tries, in order, for messages:
  // "environment variables, web identity, profile \"default\" (...), ...".
  virtual std::string SourcesTried() const = 0;
};

struct AwsCredentialsOptions {
  // The clock expirations are compared with; absl::Now when unset.
  std::function<absl::Time()> now;
  // How long before expiry temporary credentials are replaced.
  absl::Duration refresh_ahead = absl::Minutes(15);
  // After a failed refresh (while the current credentials still work), how
  // long to wait before trying again.
  absl::Duration retry_refresh_after = absl::Seconds(10);
  // When no source had credentials, how long to go unsigned before looking
  // again (instance metadata may come up later).
  absl::Duration retry_none_after = absl::Minutes(5);
  // Each exchange with STS or a container credentials endpoint.
  absl::Duration http_timeout = absl::Seconds(10);
  // Each exchange with the instance metadata service (1 s in the SDKs: off
  // EC2 nothing answers, and waiting longer only delays everything else).
  absl::Duration metadata_timeout = absl::Seconds(1);
  // STS sessions' length (DurationSeconds); zero leaves it to STS (1 hour).
  absl::Duration sts_session_duration = absl::ZeroDuration();
};

}  // namespace stitch

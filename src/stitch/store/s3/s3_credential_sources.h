// The credential sources the default chain (s3_credentials.h) walks, each
// usable and testable on its own, and the chain over any list of them.
//
// A source answers Fetch() in one of three ways:
//   - nullopt: it is not configured here (no variables, no file, no
//     service answering); the chain tries the next one;
//   - credentials, with `source` saying where they came from;
//   - an error: it is configured but failed (an unreadable token file, a
//     refusal, a malformed answer). The chain stops there and reports it.
// Fetch() reads files and calls services anew each time (tokens rotate);
// caching and refreshing are the chain's.
//
// Thread-safety: a source holds only its configuration, set at
// construction; Fetch() and Name() may be called from several threads at
// once. Fetch() may block on a file or a credential service: never call it
// on an event-loop thread.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/time/time.h"
#include "stitch/store/s3/s3_credentials.h"
#include "stitch/store/s3/s3_sts.h"

namespace stitch {

class AwsCredentialSource {
 public:
  virtual ~AwsCredentialSource() = default;
  // For "sources tried" lists: "environment variables", "profile
  // \"default\" in ~/.aws/credentials", ...
  virtual std::string Name() const = 0;
  // See the file comment.
  [[nodiscard]] virtual absl::StatusOr<std::optional<AwsCredentials>> Fetch() = 0;
};

// The static keys of the environment (AWS_ACCESS_KEY_ID,
// AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN) as given; not configured when
// the access key id is empty. Never fails.
class EnvironmentCredentialSource final : public AwsCredentialSource {
 public:
  explicit EnvironmentCredentialSource(AwsCredentials keys);
  std::string Name() const override;
  absl::StatusOr<std::optional<AwsCredentials>> Fetch() override;

 private:
  AwsCredentials keys_;
};

// STS AssumeRoleWithWebIdentity with the token in
// `settings.web_identity_token_file` for `settings.role_arn`. Not
// configured when both are empty; InvalidArgument when only one is set;
// otherwise as StsAssumeRoleWithWebIdentity (s3_sts.h).
class WebIdentityCredentialSource final : public AwsCredentialSource {
 public:
  WebIdentityCredentialSource(const AwsCredentialSettings& settings, StsEndpoint sts);
  std::string Name() const override;
  absl::StatusOr<std::optional<AwsCredentials>> Fetch() override;

 private:
  const std::string token_file_;
  const std::string role_arn_;
  const std::string session_name_;
  const StsEndpoint sts_;
};

// The profile `settings.profile` ("default" when empty) of the shared
// credentials and config files, the credentials file winning for keys set
// in both: static keys; `role_arn` with `web_identity_token_file`; or
// `role_arn` with `source_profile` (AssumeRole signed with that profile's
// keys; chains up to four deep). Not configured when both file names are
// empty, or when the "default" profile is absent or holds no keys. Errors:
// NotFound for a named profile in neither file (or one without keys);
// InvalidArgument for half-set keys, a role without a way to assume it, or
// credential_process / SSO settings (not supported); STS's errors.
class ProfileCredentialSource final : public AwsCredentialSource {
 public:
  ProfileCredentialSource(const AwsCredentialSettings& settings, StsEndpoint sts);
  std::string Name() const override;
  absl::StatusOr<std::optional<AwsCredentials>> Fetch() override;

 private:
  using Keys = std::map<std::string, std::string>;
  using Profiles = std::map<std::string, Keys>;
  absl::StatusOr<std::optional<AwsCredentials>> Resolve(const std::string& name,
                                                        const Profiles& creds,
                                                        const Profiles& config, bool must_exist,
                                                        int depth);
  absl::StatusOr<std::optional<AwsCredentials>> AssumeProfileRole(const std::string& name,
                                                                  const Keys& keys,
                                                                  const Profiles& creds,
                                                                  const Profiles& config,
                                                                  int depth);
  // The file names that are set, joined by " or ", for messages.
  std::string FilesText() const;

  const std::string credentials_file_;
  const std::string config_file_;
  const std::string profile_;
  const bool named_;
  const StsEndpoint sts_;
};

// The container credentials endpoint: `settings.container_relative_uri`
// under `settings.container_host` (http://169.254.170.2 when empty), else
// `settings.container_full_uri`, which must be https or http to loopback or
// a container agent's address (InvalidArgument otherwise). Sends the token
// read from `settings.container_authorization_token_file` at every fetch,
// else `settings.container_authorization_token`, as Authorization. Not
// configured when neither URI is set. Errors: Unavailable when nothing
// answers, PermissionDenied for a status other than 200, and those of
// CredentialsFromJson (s3_credential_io.h).
class ContainerCredentialSource final : public AwsCredentialSource {
 public:
  ContainerCredentialSource(const AwsCredentialSettings& settings, absl::Duration timeout);
  std::string Name() const override;
  absl::StatusOr<std::optional<AwsCredentials>> Fetch() override;

 private:
  // The URL to ask, or nullopt when not configured.
  absl::StatusOr<std::optional<std::string>> Url() const;

  const std::string full_uri_;
  const std::string relative_uri_;
  const std::string token_file_;
  const std::string token_;
  const std::string host_;
  const absl::Duration timeout_;
};

// EC2 instance metadata at `endpoint` (a trailing '/' ignored), IMDSv2 with
// a session token, IMDSv1 when the service refuses tokens (403, 404, 405):
// the credentials of the instance's first role. Not configured when the
// endpoint is empty, nothing answers within `timeout`, or the instance has
// no role. Unavailable when the service answers an unexpected status.
class InstanceMetadataCredentialSource final : public AwsCredentialSource {
 public:
  InstanceMetadataCredentialSource(std::string endpoint, absl::Duration timeout);
  std::string Name() const override;
  absl::StatusOr<std::optional<AwsCredentials>> Fetch() override;

 private:
  std::string endpoint_;
  const absl::Duration timeout_;
};

// The region instance metadata reports (placement/region), or "" when the
// service does not answer within `timeout`.
std::string InstanceMetadataRegion(std::string_view endpoint,
                                   absl::Duration timeout = absl::Seconds(1));

// The value of `key` in `profile` of the AWS config file at `path` (section
// "[default]" or "[profile NAME]"), or "" when the file, the profile or the
// key is absent.
std::string ConfigFileValue(const std::string& path, std::string_view profile,
                            std::string_view key);

}  // namespace stitch

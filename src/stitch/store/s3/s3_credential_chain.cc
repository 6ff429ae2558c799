#include "stitch/store/s3/s3_credential_chain.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <cstdlib>

#include "absl/base/thread_annotations.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/synchronization/mutex.h"
#include "stitch/store/s3/s3_credential_io.h"

namespace stitch {
namespace {

// Credentials with less than this left are not handed out for a new request.
constexpr absl::Duration kMinimumValidity = absl::Minutes(1);

std::string GetEnv(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? std::string() : std::string(v);
}

class CredentialsChain final : public AwsCredentialsProvider {
 public:
  CredentialsChain(std::vector<std::unique_ptr<AwsCredentialSource>> sources,
                   AwsCredentialsOptions options)
      : sources_(std::move(sources)), options_(std::move(options)) {
    if (!options_.now) options_.now = [] { return absl::Now(); };
  }

  absl::StatusOr<std::optional<AwsCredentials>> Current() override {
    absl::MutexLock lock(&mu_);
    const absl::Time now = options_.now();
    if (resolved_) {
      if (!cached_) {
        if (now < retry_at_) return std::nullopt;
      } else if (Fresh(now)) {
        return cached_;
      } else if (now < retry_at_ && StillValid(now)) {
        return cached_;
      }
    }
    // Temporary credentials are refreshed from the source that gave them;
    // otherwise the chain is walked from the start.
    absl::StatusOr<std::optional<AwsCredentials>> found =
        cached_ && source_index_ >= 0 ? sources_[source_index_]->Fetch() : Walk();
    if (found.ok() && found->has_value()) {
      if (!resolved_ || !cached_ || cached_->access_key_id != (*found)->access_key_id) {
        spdlog::debug("S3 credentials from {}{}", (*found)->source,
                      (*found)->expiration
                          ? absl::StrCat(", valid until ",
                                         absl::FormatTime(absl::RFC3339_sec, *(*found)->expiration,
                                                          absl::UTCTimeZone()))
                          : std::string());
      }
      cached_ = *std::move(found);
      obtained_ = now;
      invalidated_ = false;
      resolved_ = true;
      return cached_;
    }
    if (cached_ && StillValid(now)) {
      // Keep signing with what still works; try again a little later.
      spdlog::warn("S3 credentials from {} expire at {} and could not be refreshed yet: {}",
                   cached_->source,
                   absl::FormatTime(absl::RFC3339_sec, *cached_->expiration, absl::UTCTimeZone()),
                   found.ok() ? "the source has none now" : std::string(found.status().message()));
      retry_at_ = now + options_.retry_refresh_after;
      return cached_;
    }
    if (cached_) {
      const std::string source = cached_->source;
      cached_.reset();
      resolved_ = false;
      if (found.ok()) {
        return absl::UnavailableError(
            absl::StrCat("S3 credentials from ", source,
                         " expired and the source has none now (sources: ", SourcesTried(), ")"));
      }
      return absl::Status(
          found.status().code(),
          absl::StrCat("S3 credentials from ", source, " expired and cannot be refreshed: ",
                       found.status().message(), " (sources: ", SourcesTried(), ")"));
    }
    if (!found.ok()) return found.status();
    resolved_ = true;
    retry_at_ = now + options_.retry_none_after;
    return std::nullopt;
  }

  void Invalidate() override {
    absl::MutexLock lock(&mu_);
    if (cached_ && cached_->expiration) invalidated_ = true;
  }

  std::string SourcesTried() const override {
    return absl::StrJoin(sources_, ", ",
                         [](std::string* out, const std::unique_ptr<AwsCredentialSource>& s) {
                           absl::StrAppend(out, s->Name());
                         });
  }

 private:
  absl::Duration Ahead() const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    absl::Duration lifetime = *cached_->expiration - obtained_;
    return std::min(options_.refresh_ahead, lifetime / 2);
  }
  bool Fresh(absl::Time now) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!cached_->expiration) return true;
    return !invalidated_ && now + Ahead() < *cached_->expiration;
  }
  bool StillValid(absl::Time now) const ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    if (!cached_->expiration) return true;
    return !invalidated_ && now + kMinimumValidity < *cached_->expiration;
  }

  // The first configured source's credentials; an error names every source
  // tried up to the one that failed.
  absl::StatusOr<std::optional<AwsCredentials>> Walk() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_) {
    std::vector<std::string> tried;
    for (size_t i = 0; i < sources_.size(); ++i) {
      tried.push_back(sources_[i]->Name());
      auto found = sources_[i]->Fetch();
      if (!found.ok()) {
        return absl::Status(found.status().code(),
                            absl::StrCat("S3 credentials: ", found.status().message(),
                                         " (sources tried: ", absl::StrJoin(tried, ", "), ")"));
      }
      if (found->has_value()) {
        source_index_ = static_cast<int>(i);
        return found;
      }
    }
    source_index_ = -1;
    return std::nullopt;
  }

  const std::vector<std::unique_ptr<AwsCredentialSource>> sources_;
  AwsCredentialsOptions options_;
  absl::Mutex mu_;
  bool resolved_ ABSL_GUARDED_BY(mu_) = false;
  std::optional<AwsCredentials> cached_ ABSL_GUARDED_BY(mu_);
  absl::Time obtained_ ABSL_GUARDED_BY(mu_);
  bool invalidated_ ABSL_GUARDED_BY(mu_) = false;
  int source_index_ ABSL_GUARDED_BY(mu_) = -1;
  absl::Time retry_at_ ABSL_GUARDED_BY(mu_) = absl::InfinitePast();
};

}  // namespace

std::shared_ptr<AwsCredentialsProvider> MakeCredentialsChain(
    std::vector<std::unique_ptr<AwsCredentialSource>> sources, AwsCredentialsOptions options) {
  return std::make_shared<CredentialsChain>(std::move(sources), std::move(options));
}

AwsCredentialSettings AwsCredentialSettingsFromProcess() {
  AwsCredentialSettings s;
  s.web_identity_token_file = GetEnv("AWS_WEB_IDENTITY_TOKEN_FILE");
  s.role_arn = GetEnv("AWS_ROLE_ARN");
  s.role_session_name = GetEnv("AWS_ROLE_SESSION_NAME");
  const std::string home = GetEnv("HOME");
  s.shared_credentials_file = GetEnv("AWS_SHARED_CREDENTIALS_FILE");
  if (s.shared_credentials_file.empty() && !home.empty()) {
    s.shared_credentials_file = absl::StrCat(home, "/.aws/credentials");
  }
  s.config_file = GetEnv("AWS_CONFIG_FILE");
  if (s.config_file.empty() && !home.empty()) s.config_file = absl::StrCat(home, "/.aws/config");
  s.profile = GetEnv("AWS_PROFILE");
  if (s.profile.empty()) s.profile = GetEnv("AWS_DEFAULT_PROFILE");
  s.container_full_uri = GetEnv("AWS_CONTAINER_CREDENTIALS_FULL_URI");
  s.container_relative_uri = GetEnv("AWS_CONTAINER_CREDENTIALS_RELATIVE_URI");
  s.container_authorization_token_file = GetEnv("AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE");
  s.container_authorization_token = GetEnv("AWS_CONTAINER_AUTHORIZATION_TOKEN");
  s.container_host = "http://169.254.170.2";
  if (!absl::EqualsIgnoreCase(TrimWhitespace(GetEnv("AWS_EC2_METADATA_DISABLED")), "true")) {
    s.ec2_metadata_endpoint = GetEnv("AWS_EC2_METADATA_SERVICE_ENDPOINT");
    if (s.ec2_metadata_endpoint.empty()) {
      s.ec2_metadata_endpoint =
          absl::EqualsIgnoreCase(GetEnv("AWS_EC2_METADATA_SERVICE_ENDPOINT_MODE"), "IPv6")
              ? "http://[fd00:ec2::254]"
              : "http://169.254.169.254";
    }
  }
  s.sts_endpoint_url = GetEnv("AWS_ENDPOINT_URL_STS");
  if (s.sts_endpoint_url.empty()) s.sts_endpoint_url = GetEnv("AWS_ENDPOINT_URL");
  s.region = GetEnv("AWS_REGION");
  if (s.region.empty()) s.region = GetEnv("AWS_DEFAULT_REGION");
  if (s.region.empty()) {
    s.region = ConfigFileValue(s.config_file, s.profile.empty() ? "default" : s.profile, "region");
  }
  return s;
}

absl::StatusOr<std::shared_ptr<AwsCredentialsProvider>> MakeDefaultCredentialsChain(
    const AwsCredentials& static_keys, const AwsCredentialSettings& settings,
    AwsCredentialsOptions options) {
  if (static_keys.access_key_id.empty() != static_keys.secret_access_key.empty()) {
    return absl::InvalidArgumentError(
        "only one of AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY is set; set both (or neither, "
        "to use the other credential sources)");
  }
  const StsEndpoint sts = StsEndpoint::From(settings, options);
  std::vector<std::unique_ptr<AwsCredentialSource>> sources;
  sources.push_back(std::make_unique<EnvironmentCredentialSource>(static_keys));
  sources.push_back(std::make_unique<WebIdentityCredentialSource>(settings, sts));
  sources.push_back(std::make_unique<ProfileCredentialSource>(settings, sts));
  sources.push_back(std::make_unique<ContainerCredentialSource>(settings, options.http_timeout));
  sources.push_back(std::make_unique<InstanceMetadataCredentialSource>(
      settings.ec2_metadata_endpoint, options.metadata_timeout));
  return MakeCredentialsChain(std::move(sources), std::move(options));
}

}  // namespace stitch

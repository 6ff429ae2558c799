// The environment, web identity, container and instance metadata sources
// (s3_credential_sources.h). The profile source: s3_profile_source.cc.
#include "stitch/store/s3/s3_credential_sources.h"

#include <boost/url/parse.hpp>
#include <boost/url/url_view.hpp>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "stitch/core/errors.h"
#include "stitch/store/s3/s3_credential_io.h"

namespace stitch {
namespace {

constexpr std::string_view kImdsTokenTtlSeconds = "21600";

// Whether a container credentials URL may be used over plain http: only to
// this host or to the container agents' link-local addresses, as the SDKs
// allow (anything else could read the authorization token in transit).
bool AllowedContainerUrl(const std::string& url) {
  auto parsed = boost::urls::parse_absolute_uri(url);
  if (!parsed) return false;
  std::string scheme = absl::AsciiStrToLower(std::string(parsed->scheme()));
  if (scheme == "https") return true;
  if (scheme != "http") return false;
  std::string host = absl::AsciiStrToLower(std::string(parsed->host_address()));
  if (host.size() > 2 && host.front() == '[') host = host.substr(1, host.size() - 2);
  return host == "localhost" || absl::StartsWith(host, "127.") || host == "::1" ||
         host == "169.254.170.2" || host == "169.254.170.23" || host == "fd00:ec2::23";
}

// IMDSv2: a session token first; IMDSv1 when the service refuses tokens
// (403, 404, 405), as the SDKs do. The headers to send with each metadata
// request; nullopt when nothing answers.
absl::StatusOr<std::optional<std::vector<std::string>>> ImdsToken(const std::string& endpoint,
                                                                  absl::Duration timeout) {
  CredentialHttpCall call;
  call.method = "PUT";
  call.url = absl::StrCat(endpoint, "/latest/api/token");
  call.headers = {
      absl::StrCat("X-aws-ec2-metadata-token-ttl-seconds: ", AbslView(kImdsTokenTtlSeconds))};
  call.timeout = timeout;
  call.direct = true;
  auto answer = CredentialHttpExchange(call);
  if (!answer.ok()) return std::nullopt;
  if (answer->status == 200) {
    return std::optional<std::vector<std::string>>(std::vector<std::string>{
        absl::StrCat("X-aws-ec2-metadata-token: ", TrimWhitespace(answer->body))});
  }
  if (answer->status == 403 || answer->status == 404 || answer->status == 405) {
    return std::optional<std::vector<std::string>>(std::vector<std::string>{});
  }
  return absl::UnavailableError(absl::StrCat("instance metadata at ", endpoint,
                                             " refused a session token: HTTP ", answer->status));
}

}  // namespace

// ---- Environment ----

EnvironmentCredentialSource::EnvironmentCredentialSource(AwsCredentials keys)
    : keys_(std::move(keys)) {
  keys_.source = "environment variables (AWS_ACCESS_KEY_ID)";
}

std::string EnvironmentCredentialSource::Name() const { return "environment variables"; }

absl::StatusOr<std::optional<AwsCredentials>> EnvironmentCredentialSource::Fetch() {
  if (keys_.access_key_id.empty()) return std::nullopt;
  return keys_;
}

// ---- Web identity ----

WebIdentityCredentialSource::WebIdentityCredentialSource(const AwsCredentialSettings& s,
                                                         StsEndpoint sts)
    : token_file_(s.web_identity_token_file),
      role_arn_(s.role_arn),
      session_name_(s.role_session_name),
      sts_(std::move(sts)) {}

std::string WebIdentityCredentialSource::Name() const {
  return "web identity (AWS_WEB_IDENTITY_TOKEN_FILE)";
}

absl::StatusOr<std::optional<AwsCredentials>> WebIdentityCredentialSource::Fetch() {
  if (token_file_.empty() && role_arn_.empty()) return std::nullopt;
  if (token_file_.empty() || role_arn_.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        "web identity needs both AWS_WEB_IDENTITY_TOKEN_FILE and AWS_ROLE_ARN, but only ",
        token_file_.empty() ? "AWS_ROLE_ARN" : "AWS_WEB_IDENTITY_TOKEN_FILE", " is set"));
  }
  auto c = StsAssumeRoleWithWebIdentity(sts_, token_file_, role_arn_, session_name_);
  if (!c.ok()) {
    return Annotate(c.status(), absl::StrCat("web identity (role ", role_arn_, ", token file ",
                                             token_file_, ")"));
  }
  c->source = absl::StrCat("web identity (role ", role_arn_, ")");
  return std::optional<AwsCredentials>(*std::move(c));
}

// ---- Container credentials ----

ContainerCredentialSource::ContainerCredentialSource(const AwsCredentialSettings& s,
                                                     absl::Duration timeout)
    : full_uri_(s.container_full_uri),
      relative_uri_(s.container_relative_uri),
      token_file_(s.container_authorization_token_file),
      token_(s.container_authorization_token),
      host_(s.container_host.empty() ? "http://169.254.170.2" : s.container_host),
      timeout_(timeout) {}

std::string ContainerCredentialSource::Name() const {
  return "container credentials (AWS_CONTAINER_CREDENTIALS_*_URI)";
}

absl::StatusOr<std::optional<std::string>> ContainerCredentialSource::Url() const {
  if (!relative_uri_.empty()) {
    return std::optional<std::string>(
        absl::StrCat(host_, relative_uri_.front() == '/' ? "" : "/", relative_uri_));
  }
  if (full_uri_.empty()) return std::nullopt;
  if (!AllowedContainerUrl(full_uri_)) {
    return absl::InvalidArgumentError(
        absl::StrCat("AWS_CONTAINER_CREDENTIALS_FULL_URI ", full_uri_,
                     " must be https, or http to a loopback address or the container agent "
                     "(169.254.170.2, 169.254.170.23, fd00:ec2::23)"));
  }
  return std::optional<std::string>(full_uri_);
}

absl::StatusOr<std::optional<AwsCredentials>> ContainerCredentialSource::Fetch() {
  auto url = Url();
  if (!url.ok()) return url.status();
  if (!url->has_value()) return std::nullopt;
  CredentialHttpCall call;
  call.url = **url;
  call.timeout = timeout_;
  call.direct = true;
  std::string token = token_;
  if (!token_file_.empty()) {
    auto text = ReadCredentialFile(token_file_, "container authorization token file");
    if (!text.ok()) return Annotate(text.status(), "container credentials");
    token = TrimWhitespace(*text);
  }
  if (!token.empty()) {
    if (absl::StrContains(token, '\r') || absl::StrContains(token, '\n')) {
      return absl::InvalidArgumentError(
          "container credentials: the authorization token holds a line break");
    }
    call.headers.push_back(absl::StrCat("Authorization: ", token));
  }
  auto answer = CredentialHttpExchange(call);
  if (!answer.ok()) return Annotate(answer.status(), "container credentials");
  if (answer->status != 200) {
    return absl::PermissionDeniedError(absl::StrCat("container credentials at ", call.url,
                                                    " answered HTTP ", answer->status, ": ",
                                                    absl::ClippedSubstr(answer->body, 0, 200)));
  }
  auto c = CredentialsFromJson(answer->body);
  if (!c.ok()) return Annotate(c.status(), absl::StrCat("container credentials at ", call.url));
  c->source = absl::StrCat("container credentials (", call.url, ")");
  return std::optional<AwsCredentials>(*std::move(c));
}

// ---- Instance metadata ----

InstanceMetadataCredentialSource::InstanceMetadataCredentialSource(std::string endpoint,
                                                                   absl::Duration timeout)
    : endpoint_(std::move(endpoint)), timeout_(timeout) {
  while (!endpoint_.empty() && endpoint_.back() == '/') endpoint_.pop_back();
}

std::string InstanceMetadataCredentialSource::Name() const {
  return absl::StrCat("EC2 instance metadata (", endpoint_, ")");
}

absl::StatusOr<std::optional<AwsCredentials>> InstanceMetadataCredentialSource::Fetch() {
  if (endpoint_.empty()) return std::nullopt;
  auto headers = ImdsToken(endpoint_, timeout_);
  if (!headers.ok()) return headers.status();
  if (!headers->has_value()) return std::nullopt;
  CredentialHttpCall call;
  call.url = absl::StrCat(endpoint_, "/latest/meta-data/iam/security-credentials/");
  call.headers = **headers;
  call.timeout = timeout_;
  call.direct = true;
  auto roles = CredentialHttpExchange(call);
  if (!roles.ok()) return std::nullopt;
  // 404: the instance has no role.
  if (roles->status == 404) return std::nullopt;
  if (roles->status != 200) {
    return absl::UnavailableError(absl::StrCat("instance metadata at ", endpoint_,
                                               " answered HTTP ", roles->status,
                                               " for the instance's role"));
  }
  std::vector<std::string> names =
      absl::StrSplit(roles->body, absl::ByAnyChar("\r\n"), absl::SkipWhitespace());
  if (names.empty()) return std::nullopt;
  const std::string role = TrimWhitespace(names.front());
  call.url = absl::StrCat(endpoint_, "/latest/meta-data/iam/security-credentials/", role);
  auto answer = CredentialHttpExchange(call);
  if (!answer.ok()) return Annotate(answer.status(), "instance metadata");
  if (answer->status != 200) {
    return absl::UnavailableError(absl::StrCat("instance metadata at ", endpoint_,
                                               " answered HTTP ", answer->status, " for role ",
                                               role, "'s credentials"));
  }
  auto c = CredentialsFromJson(answer->body);
  if (!c.ok()) return Annotate(c.status(), absl::StrCat("instance metadata role ", role));
  c->source = absl::StrCat("EC2 instance metadata (role ", role, ")");
  return std::optional<AwsCredentials>(*std::move(c));
}

std::string InstanceMetadataRegion(std::string_view endpoint_text, absl::Duration timeout) {
  std::string endpoint(endpoint_text);
  while (!endpoint.empty() && endpoint.back() == '/') endpoint.pop_back();
  if (endpoint.empty()) return "";
  auto headers = ImdsToken(endpoint, timeout);
  if (!headers.ok() || !headers->has_value()) return "";
  CredentialHttpCall call;
  call.url = absl::StrCat(endpoint, "/latest/meta-data/placement/region");
  call.headers = **headers;
  call.timeout = timeout;
  call.direct = true;
  auto answer = CredentialHttpExchange(call);
  if (!answer.ok() || answer->status != 200) return "";
  return TrimWhitespace(answer->body);
}

}  // namespace stitch

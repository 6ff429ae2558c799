#include "stitch/store/s3/s3_sts.h"

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "stitch/core/errors.h"
#include "stitch/store/s3/s3_credential_io.h"
#include "stitch/store/s3/s3_sigv4.h"
#include "stitch/store/s3/s3_xml.h"

namespace stitch {
namespace {

std::string Form(const std::vector<std::pair<std::string, std::string>>& fields) {
  return absl::StrJoin(fields, "&", [](std::string* out, const auto& kv) {
    absl::StrAppend(out, SigV4Encode(kv.first, SlashEncoding::kEncode), "=",
                    SigV4Encode(kv.second, SlashEncoding::kEncode));
  });
}

// The error for a non-200 answer: STS's own code and message when its body
// carries them.
absl::Status StsRefusal(const StsEndpoint& sts, std::string_view action,
                        const CredentialHttpAnswer& answer, const absl::StatusOr<XmlElement>& doc) {
  std::string code;
  std::string message;
  if (doc.ok()) {
    const XmlElement* error = doc->Child("Error");
    if (error != nullptr) {
      code = error->ChildText("Code");
      message = error->ChildText("Message");
    }
  }
  std::string what = absl::StrCat("STS ", AbslView(action), " at ", sts.endpoint, " answered HTTP ",
                                  answer.status, code.empty() ? "" : " ", code,
                                  message.empty() ? "" : " (", message, message.empty() ? "" : ")");
  if (answer.status >= 500 || answer.status == 429) return absl::UnavailableError(what);
  return absl::PermissionDeniedError(what);
}

}  // namespace

StsEndpoint StsEndpoint::From(const AwsCredentialSettings& s, const AwsCredentialsOptions& o) {
  StsEndpoint sts;
  sts.region = s.region.empty() ? "us-east-1" : s.region;
  sts.endpoint = s.sts_endpoint_url.empty()
                     ? absl::StrCat("https://sts.", sts.region, ".amazonaws.com")
                     : s.sts_endpoint_url;
  while (!sts.endpoint.empty() && sts.endpoint.back() == '/') sts.endpoint.pop_back();
  sts.timeout = o.http_timeout;
  sts.session_duration = o.sts_session_duration;
  return sts;
}

std::string DefaultStsSessionName() {
  return absl::StrCat("stitch-", absl::ToUnixSeconds(absl::Now()));
}

absl::StatusOr<AwsCredentials> StsAssumeRole(
    const StsEndpoint& sts, std::string_view action,
    std::vector<std::pair<std::string, std::string>> fields, const AwsCredentials* signer) {
  fields.insert(fields.begin(), {{"Action", std::string(action)}, {"Version", "2011-06-15"}});
  if (sts.session_duration > absl::ZeroDuration()) {
    fields.emplace_back("DurationSeconds",
                        absl::StrCat(absl::ToInt64Seconds(sts.session_duration)));
  }
  CredentialHttpCall call;
  call.method = "POST";
  call.url = absl::StrCat(sts.endpoint, "/");
  call.headers = {"Content-Type: application/x-www-form-urlencoded; charset=utf-8",
                  "Accept: application/xml"};
  call.body = Form(fields);
  call.timeout = sts.timeout;
  call.signer = signer;
  call.sigv4 = absl::StrCat("aws:amz:", sts.region, ":sts");
  if (signer != nullptr && !signer->session_token.empty()) {
    call.headers.push_back(absl::StrCat("x-amz-security-token: ", signer->session_token));
  }
  auto answer = CredentialHttpExchange(call);
  if (!answer.ok()) {
    return absl::UnavailableError(absl::StrCat("STS ", AbslView(action), " at ", sts.endpoint,
                                               " did not answer: ", answer.status().message()));
  }
  auto doc = ParseXml(answer->body);
  if (answer->status != 200) return StsRefusal(sts, action, *answer, doc);
  if (!doc.ok()) {
    return absl::UnavailableError(absl::StrCat("STS ", AbslView(action), " at ", sts.endpoint,
                                               " sent no XML: ", doc.status().message()));
  }
  const XmlElement* result = doc->Child(absl::StrCat(AbslView(action), "Result"));
  const XmlElement* creds = result == nullptr ? nullptr : result->Child("Credentials");
  if (creds == nullptr) {
    return absl::UnavailableError(absl::StrCat("STS ", AbslView(action), " at ", sts.endpoint,
                                               " answered without credentials"));
  }
  AwsCredentials c;
  c.access_key_id = creds->ChildText("AccessKeyId");
  c.secret_access_key = creds->ChildText("SecretAccessKey");
  c.session_token = creds->ChildText("SessionToken");
  auto expiration = ParseCredentialExpiration(creds->ChildText("Expiration"));
  if (c.access_key_id.empty() || c.secret_access_key.empty() || !expiration.ok()) {
    return absl::UnavailableError(absl::StrCat("STS ", AbslView(action), " at ", sts.endpoint,
                                               " answered with incomplete credentials"));
  }
  c.expiration = *expiration;
  return c;
}

absl::StatusOr<AwsCredentials> StsAssumeRoleWithWebIdentity(const StsEndpoint& sts,
                                                            const std::string& token_file,
                                                            const std::string& role_arn,
                                                            const std::string& session_name) {
  auto token = ReadCredentialFile(token_file, "web identity token file");
  if (!token.ok()) return token.status();
  std::string trimmed = TrimWhitespace(*token);
  if (trimmed.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("web identity token file ", token_file, " is empty"));
  }
  return StsAssumeRole(
      sts, "AssumeRoleWithWebIdentity",
      {{"RoleArn", role_arn},
       {"RoleSessionName", session_name.empty() ? DefaultStsSessionName() : session_name},
       {"WebIdentityToken", trimmed}},
      nullptr);
}

}  // namespace stitch

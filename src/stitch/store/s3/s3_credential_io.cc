#include "stitch/store/s3/s3_credential_io.h"

#include <curl/curl.h>

#include <algorithm>
#include <boost/json/parse.hpp>
#include <boost/json/value.hpp>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <memory>

#include "absl/strings/str_cat.h"
#include "absl/strings/strip.h"
#include "stitch/core/errors.h"
#include "stitch/store/s3/curl_handles.h"

namespace stitch {
namespace {

namespace json = boost::json;

constexpr size_t kMaxSmallFile = size_t{1} << 20;
constexpr size_t kMaxAnswer = size_t{1} << 20;

size_t Collect(char* data, size_t size, size_t count, void* user) {
  auto* body = static_cast<std::string*>(user);
  if (body->size() + size * count > kMaxAnswer) return 0;
  body->append(data, size * count);
  return size * count;
}

}  // namespace

std::string TrimWhitespace(std::string_view text) {
  return std::string(absl::StripAsciiWhitespace(AbslView(text)));
}

absl::StatusOr<std::string> ReadCredentialFile(const std::string& path, std::string_view what) {
  std::ifstream in(path, std::ios::binary);
  if (!in) {
    return absl::FailedPreconditionError(
        absl::StrCat("cannot read ", AbslView(what), " ", path, ": ", std::strerror(errno)));
  }
  std::string text;
  char buffer[8192];
  while (in.read(buffer, sizeof buffer) || in.gcount() > 0) {
    text.append(buffer, static_cast<size_t>(in.gcount()));
    if (text.size() > kMaxSmallFile) {
      return absl::FailedPreconditionError(
          absl::StrCat(AbslView(what), " ", path, " is larger than 1 MiB"));
    }
  }
  return text;
}

absl::StatusOr<CredentialHttpAnswer> CredentialHttpExchange(const CredentialHttpCall& call) {
  CurlEasy curl = NewCurlEasy();
  if (!curl) return absl::ResourceExhaustedError("cannot create a curl handle");
  CURL* c = curl.get();
  char error[CURL_ERROR_SIZE] = {};
  CredentialHttpAnswer answer;
  CurlSlist headers;
  for (const std::string& h : call.headers) {
    headers.reset(curl_slist_append(headers.release(), h.c_str()));
  }
  const long timeout_ms = std::max<long>(1, absl::ToInt64Milliseconds(call.timeout));
  curl_easy_setopt(c, CURLOPT_URL, call.url.c_str());
  curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(c, CURLOPT_ERRORBUFFER, error);
  curl_easy_setopt(c, CURLOPT_TIMEOUT_MS, timeout_ms);
  curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS, timeout_ms);
  curl_easy_setopt(c, CURLOPT_SSL_VERIFYPEER, 1L);
  curl_easy_setopt(c, CURLOPT_SSL_VERIFYHOST, 2L);
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, &Collect);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, &answer.body);
  if (call.direct) curl_easy_setopt(c, CURLOPT_PROXY, "");
  if (call.method == "POST") {
    curl_easy_setopt(c, CURLOPT_POSTFIELDS, call.body.c_str());
    curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(call.body.size()));
  } else if (call.method == "PUT") {
    curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, "PUT");
  }
  if (call.signer != nullptr) {
    curl_easy_setopt(c, CURLOPT_AWS_SIGV4, call.sigv4.c_str());
    curl_easy_setopt(c, CURLOPT_USERNAME, call.signer->access_key_id.c_str());
    curl_easy_setopt(c, CURLOPT_PASSWORD, call.signer->secret_access_key.c_str());
  }
  curl_easy_setopt(c, CURLOPT_HTTPHEADER, headers.get());
  CURLcode code = curl_easy_perform(c);
  if (code != CURLE_OK) {
    return absl::UnavailableError(absl::StrCat(
        call.method, " ", call.url, ": ", error[0] != '\0' ? error : curl_easy_strerror(code)));
  }
  curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &answer.status);
  return answer;
}

absl::StatusOr<absl::Time> ParseCredentialExpiration(std::string_view text) {
  absl::Time t;
  std::string error;
  if (!absl::ParseTime(absl::RFC3339_full, std::string(text), &t, &error)) {
    return absl::InvalidArgumentError(absl::StrCat("bad Expiration \"", AbslView(text), "\""));
  }
  return t;
}

absl::StatusOr<AwsCredentials> CredentialsFromJson(std::string_view text) {
  json::error_code ec;
  json::value v = json::parse(text, ec);
  if (ec || !v.is_object()) return absl::InvalidArgumentError("the answer is not a JSON object");
  const json::object& o = v.as_object();
  auto field = [&](const char* name) -> std::string {
    const json::value* f = o.if_contains(name);
    return f != nullptr && f->is_string() ? std::string(f->as_string()) : std::string();
  };
  std::string code = field("Code");
  if (!code.empty() && code != "Success") {
    return absl::PermissionDeniedError(
        absl::StrCat("the answer's Code is ", code, ": ", field("Message")));
  }
  AwsCredentials c;
  c.access_key_id = field("AccessKeyId");
  c.secret_access_key = field("SecretAccessKey");
  c.session_token = field("Token");
  if (c.access_key_id.empty() || c.secret_access_key.empty()) {
    return absl::InvalidArgumentError("the answer has no AccessKeyId and SecretAccessKey");
  }
  if (std::string expiration = field("Expiration"); !expiration.empty()) {
    auto t = ParseCredentialExpiration(expiration);
    if (!t.ok()) return t.status();
    c.expiration = *t;
  }
  return c;
}

}  // namespace stitch

#include "stitch/store/s3_credentials.h"

#include <curl/curl.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <boost/json/parse.hpp>
#include <boost/json/value.hpp>
#include <boost/url/parse.hpp>
#include <boost/url/url_view.hpp>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <sstream>

#include "absl/base/thread_annotations.h"
#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "absl/synchronization/mutex.h"
#include "stitch/core/errors.h"
#include "stitch/store/s3_sigv4.h"
#include "stitch/store/s3_xml.h"

namespace stitch {
namespace {

namespace json = boost::json;

// Tokens and credential files are small; anything larger is not one.
constexpr size_t kMaxSmallFile = size_t{1} << 20;
constexpr size_t kMaxAnswer = size_t{1} << 20;
// Credentials with less than this left are not handed out for a new request.
constexpr absl::Duration kMinimumValidity = absl::Minutes(1);
constexpr std::string_view kImdsTokenTtlSeconds = "21600";

std::string GetEnv(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? std::string() : std::string(v);
}

std::string Trimmed(absl::string_view s) { return std::string(absl::StripAsciiWhitespace(s)); }
std::string Trimmed(const std::string& s) { return Trimmed(AbslView(s)); }

absl::StatusOr<std::string> ReadSmallFile(const std::string& path, std::string_view what) {
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

void GlobalInitOnce() {
  static const CURLcode init = curl_global_init(CURL_GLOBAL_DEFAULT);
  (void)init;
}

// ---- One HTTP exchange (STS, container credentials, instance metadata) ----

struct HttpCall {
  std::string method = "GET";
  std::string url;
  std::vector<std::string> headers;  // "Name: value"
  std::string body;
  absl::Duration timeout = absl::Seconds(10);
  // Link-local credential services are never reached through a proxy.
  bool direct = false;
  // Signs the request with SigV4 for `sigv4` ("aws:amz:REGION:sts") when set.
  const AwsCredentials* signer = nullptr;
  std::string sigv4;
};

struct HttpAnswer {
  long status = 0;
  std::string body;
};

size_t Collect(char* data, size_t size, size_t count, void* user) {
  auto* body = static_cast<std::string*>(user);
  if (body->size() + size * count > kMaxAnswer) return 0;
  body->append(data, size * count);
  return size * count;
}

// Unavailable (naming the URL) when no answer came.
absl::StatusOr<HttpAnswer> Exchange(const HttpCall& call) {
  GlobalInitOnce();
  struct EasyDeleter {
    void operator()(CURL* c) const { curl_easy_cleanup(c); }
  };
  struct SlistDeleter {
    void operator()(curl_slist* l) const { curl_slist_free_all(l); }
  };
  std::unique_ptr<CURL, EasyDeleter> curl(curl_easy_init());
  if (!curl) return absl::ResourceExhaustedError("cannot create a curl handle");
  CURL* c = curl.get();
  char error[CURL_ERROR_SIZE] = {};
  HttpAnswer answer;
  std::unique_ptr<curl_slist, SlistDeleter> headers;
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

// ---- The shared config and credentials files ----

using ProfileKeys = std::map<std::string, std::string>;

enum class ProfileFileKind { kCredentials, kConfig };

// The profiles of one file. The AWS format is INI-like but not INI: a key
// with an empty value opens a nested block of indented `key = value` lines
// (`s3 =` then `  addressing_style = path`), which INI parsers either refuse
// or read as the profile's own keys. Only full-line comments exist.
std::map<std::string, ProfileKeys> ParseProfileFile(std::string_view text, ProfileFileKind kind) {
  std::map<std::string, ProfileKeys> out;
  ProfileKeys* current = nullptr;
  bool in_nested = false;
  for (absl::string_view raw : absl::StrSplit(AbslView(text), '\n')) {
    if (!raw.empty() && raw.back() == '\r') raw.remove_suffix(1);
    const bool indented = !raw.empty() && (raw.front() == ' ' || raw.front() == '\t');
    absl::string_view line = absl::StripAsciiWhitespace(raw);
    if (line.empty() || line.front() == '#' || line.front() == ';') continue;
    if (line.front() == '[') {
      in_nested = false;
      current = nullptr;
      if (line.back() != ']') continue;
      std::string name = Trimmed(line.substr(1, line.size() - 2));
      if (kind == ProfileFileKind::kConfig) {
        // "[default]" or "[profile NAME]"; other sections (sso-session,
        // services) hold no profile.
        absl::string_view rest = name;
        if (name == "default") {
          current = &out["default"];
        } else if (absl::ConsumePrefix(&rest, "profile") && !rest.empty() &&
                   absl::ascii_isspace(static_cast<unsigned char>(rest.front()))) {
          current = &out[Trimmed(rest)];
        }
      } else {
        current = &out[name];
      }
      continue;
    }
    if (current == nullptr) continue;
    if (indented && in_nested) continue;
    size_t eq = line.find('=');
    if (eq == absl::string_view::npos) continue;
    std::string key = absl::AsciiStrToLower(Trimmed(line.substr(0, eq)));
    std::string value = Trimmed(line.substr(eq + 1));
    in_nested = value.empty();
    if (!in_nested) (*current)[key] = std::move(value);
  }
  return out;
}

std::map<std::string, ProfileKeys> LoadProfileFile(const std::string& path, ProfileFileKind kind) {
  if (path.empty()) return {};
  std::ifstream in(path, std::ios::binary);
  if (!in) return {};
  std::stringstream text;
  text << in.rdbuf();
  return ParseProfileFile(text.str(), kind);
}

// ---- Credential documents ----

absl::StatusOr<absl::Time> ParseExpiration(std::string_view text) {
  absl::Time t;
  std::string error;
  if (!absl::ParseTime(absl::RFC3339_full, std::string(text), &t, &error)) {
    return absl::InvalidArgumentError(absl::StrCat("bad Expiration \"", AbslView(text), "\""));
  }
  return t;
}

// The JSON that container credential endpoints and instance metadata serve.
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
    auto t = ParseExpiration(expiration);
    if (!t.ok()) return t.status();
    c.expiration = *t;
  }
  return c;
}

// ---- STS ----

struct Sts {
  std::string endpoint;  // no trailing '/'
  std::string region;
  absl::Duration timeout;
  absl::Duration session_duration;
};

Sts MakeSts(const AwsCredentialSettings& s, const AwsCredentialsOptions& o) {
  Sts sts;
  sts.region = s.region.empty() ? "us-east-1" : s.region;
  sts.endpoint = s.sts_endpoint_url.empty()
                     ? absl::StrCat("https://sts.", sts.region, ".amazonaws.com")
                     : s.sts_endpoint_url;
  while (!sts.endpoint.empty() && sts.endpoint.back() == '/') sts.endpoint.pop_back();
  sts.timeout = o.http_timeout;
  sts.session_duration = o.sts_session_duration;
  return sts;
}

std::string Form(const std::vector<std::pair<std::string, std::string>>& fields) {
  return absl::StrJoin(fields, "&", [](std::string* out, const auto& kv) {
    absl::StrAppend(out, SigV4Encode(kv.first, SlashEncoding::kEncode), "=",
                    SigV4Encode(kv.second, SlashEncoding::kEncode));
  });
}

// AssumeRoleWithWebIdentity (unsigned, as STS takes it) or, with `signer`,
// AssumeRole.
absl::StatusOr<AwsCredentials> AssumeRole(const Sts& sts, std::string_view action,
                                          std::vector<std::pair<std::string, std::string>> fields,
                                          const AwsCredentials* signer) {
  fields.insert(fields.begin(), {{"Action", std::string(action)}, {"Version", "2011-06-15"}});
  if (sts.session_duration > absl::ZeroDuration()) {
    fields.emplace_back("DurationSeconds",
                        absl::StrCat(absl::ToInt64Seconds(sts.session_duration)));
  }
  HttpCall call;
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
  auto answer = Exchange(call);
  if (!answer.ok()) {
    return absl::UnavailableError(absl::StrCat("STS ", AbslView(action), " at ", sts.endpoint,
                                               " did not answer: ", answer.status().message()));
  }
  auto doc = ParseXml(answer->body);
  if (answer->status != 200) {
    std::string code;
    std::string message;
    if (doc.ok()) {
      const XmlElement* error = doc->Child("Error");
      if (error != nullptr) {
        code = error->ChildText("Code");
        message = error->ChildText("Message");
      }
    }
    std::string what =
        absl::StrCat("STS ", AbslView(action), " at ", sts.endpoint, " answered HTTP ",
                     answer->status, code.empty() ? "" : " ", code, message.empty() ? "" : " (",
                     message, message.empty() ? "" : ")");
    if (answer->status >= 500 || answer->status == 429) return absl::UnavailableError(what);
    return absl::PermissionDeniedError(what);
  }
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
  auto expiration = ParseExpiration(creds->ChildText("Expiration"));
  if (c.access_key_id.empty() || c.secret_access_key.empty() || !expiration.ok()) {
    return absl::UnavailableError(absl::StrCat("STS ", AbslView(action), " at ", sts.endpoint,
                                               " answered with incomplete credentials"));
  }
  c.expiration = *expiration;
  return c;
}

std::string DefaultSessionName() {
  return absl::StrCat("stitch-", absl::ToUnixSeconds(absl::Now()));
}

absl::StatusOr<AwsCredentials> WebIdentity(const Sts& sts, const std::string& token_file,
                                           const std::string& role_arn,
                                           const std::string& session_name) {
  auto token = ReadSmallFile(token_file, "web identity token file");
  if (!token.ok()) return token.status();
  std::string trimmed = Trimmed(*token);
  if (trimmed.empty()) {
    return absl::FailedPreconditionError(
        absl::StrCat("web identity token file ", token_file, " is empty"));
  }
  return AssumeRole(
      sts, "AssumeRoleWithWebIdentity",
      {{"RoleArn", role_arn},
       {"RoleSessionName", session_name.empty() ? DefaultSessionName() : session_name},
       {"WebIdentityToken", trimmed}},
      nullptr);
}

// ---- The sources ----

class Source {
 public:
  virtual ~Source() = default;
  // For "sources tried" lists.
  virtual std::string Name() const = 0;
  // nullopt: this source is not configured here, try the next one. An error:
  // it is configured but failed.
  virtual absl::StatusOr<std::optional<AwsCredentials>> Fetch() = 0;
};

class EnvironmentSource final : public Source {
 public:
  explicit EnvironmentSource(AwsCredentials keys) : keys_(std::move(keys)) {
    keys_.source = "environment variables (AWS_ACCESS_KEY_ID)";
  }
  std::string Name() const override { return "environment variables"; }
  absl::StatusOr<std::optional<AwsCredentials>> Fetch() override {
    if (keys_.access_key_id.empty()) return std::nullopt;
    return keys_;
  }

 private:
  AwsCredentials keys_;
};

class WebIdentitySource final : public Source {
 public:
  WebIdentitySource(const AwsCredentialSettings& s, Sts sts)
      : token_file_(s.web_identity_token_file),
        role_arn_(s.role_arn),
        session_name_(s.role_session_name),
        sts_(std::move(sts)) {}
  std::string Name() const override { return "web identity (AWS_WEB_IDENTITY_TOKEN_FILE)"; }
  absl::StatusOr<std::optional<AwsCredentials>> Fetch() override {
    if (token_file_.empty() && role_arn_.empty()) return std::nullopt;
    if (token_file_.empty() || role_arn_.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          "web identity needs both AWS_WEB_IDENTITY_TOKEN_FILE and AWS_ROLE_ARN, but only ",
          token_file_.empty() ? "AWS_ROLE_ARN" : "AWS_WEB_IDENTITY_TOKEN_FILE", " is set"));
    }
    auto c = WebIdentity(sts_, token_file_, role_arn_, session_name_);
    if (!c.ok()) {
      return Annotate(c.status(), absl::StrCat("web identity (role ", role_arn_, ", token file ",
                                               token_file_, ")"));
    }
    c->source = absl::StrCat("web identity (role ", role_arn_, ")");
    return std::optional<AwsCredentials>(*std::move(c));
  }

 private:
  const std::string token_file_;
  const std::string role_arn_;
  const std::string session_name_;
  const Sts sts_;
};

class ProfileSource final : public Source {
 public:
  ProfileSource(const AwsCredentialSettings& s, Sts sts)
      : credentials_file_(s.shared_credentials_file),
        config_file_(s.config_file),
        profile_(s.profile.empty() ? "default" : s.profile),
        named_(!s.profile.empty()),
        sts_(std::move(sts)) {}

  std::string Name() const override {
    std::vector<std::string> files;
    if (!credentials_file_.empty()) files.push_back(credentials_file_);
    if (!config_file_.empty()) files.push_back(config_file_);
    return absl::StrCat("profile \"", profile_, "\"",
                        files.empty() ? "" : absl::StrCat(" in ", absl::StrJoin(files, " and ")));
  }

  absl::StatusOr<std::optional<AwsCredentials>> Fetch() override {
    if (credentials_file_.empty() && config_file_.empty()) return std::nullopt;
    auto creds = LoadProfileFile(credentials_file_, ProfileFileKind::kCredentials);
    auto config = LoadProfileFile(config_file_, ProfileFileKind::kConfig);
    return Resolve(profile_, creds, config, named_, 0);
  }

 private:
  absl::StatusOr<std::optional<AwsCredentials>> Resolve(
      const std::string& name, const std::map<std::string, ProfileKeys>& creds,
      const std::map<std::string, ProfileKeys>& config, bool must_exist, int depth) {
    auto c = creds.find(name);
    auto f = config.find(name);
    if (c == creds.end() && f == config.end()) {
      if (!must_exist) return std::nullopt;
      return absl::NotFoundError(absl::StrCat("profile \"", name, "\" is in neither ",
                                              absl::StrReplaceAll(FilesText(), {{" or ", " nor "}}),
                                              "; check AWS_PROFILE"));
    }
    // The credentials file wins for keys set in both, as in the SDKs.
    ProfileKeys keys;
    if (f != config.end()) keys = f->second;
    if (c != creds.end()) {
      for (const auto& [k, v] : c->second) keys[k] = v;
    }
    auto get = [&](const char* key) {
      auto it = keys.find(key);
      return it == keys.end() ? std::string() : it->second;
    };
    const std::string where = absl::StrCat("profile \"", name, "\" (", FilesText(), ")");
    const std::string role_arn = get("role_arn");
    if (!role_arn.empty()) {
      const std::string session = get("role_session_name");
      if (std::string token_file = get("web_identity_token_file"); !token_file.empty()) {
        auto web = WebIdentity(sts_, token_file, role_arn, session);
        if (!web.ok()) return Annotate(web.status(), where);
        web->source = absl::StrCat(where, ": web identity for role ", role_arn);
        return std::optional<AwsCredentials>(*std::move(web));
      }
      if (std::string source = get("source_profile"); !source.empty()) {
        if (depth >= 4 || source == name) {
          return absl::InvalidArgumentError(
              absl::StrCat(where, ": source_profile chains are limited to static keys"));
        }
        auto base = Resolve(source, creds, config, true, depth + 1);
        if (!base.ok()) return Annotate(base.status(), where);
        if (!base->has_value()) {
          return absl::NotFoundError(
              absl::StrCat(where, ": source_profile \"", source, "\" has no credentials"));
        }
        auto assumed =
            AssumeRole(sts_, "AssumeRole",
                       {{"RoleArn", role_arn},
                        {"RoleSessionName", session.empty() ? DefaultSessionName() : session}},
                       &**base);
        if (!assumed.ok()) return Annotate(assumed.status(), where);
        assumed->source =
            absl::StrCat(where, ": role ", role_arn, " assumed with profile \"", source, "\"");
        return std::optional<AwsCredentials>(*std::move(assumed));
      }
      return absl::InvalidArgumentError(absl::StrCat(
          where,
          ": role_arn needs web_identity_token_file or source_profile (credential_source "
          "is not supported: use AWS_CONTAINER_CREDENTIALS_* or instance metadata directly)"));
    }
    AwsCredentials out;
    out.access_key_id = get("aws_access_key_id");
    out.secret_access_key = get("aws_secret_access_key");
    out.session_token = get("aws_session_token");
    if (out.access_key_id.empty() && out.secret_access_key.empty()) {
      for (const char* unsupported : {"credential_process", "sso_session", "sso_start_url"}) {
        if (!get(unsupported).empty()) {
          return absl::InvalidArgumentError(absl::StrCat(
              where, ": ", unsupported,
              " is not supported; export the credentials into the environment instead (for "
              "example `eval $(aws configure export-credentials --format env)`)"));
        }
      }
      if (!must_exist) return std::nullopt;
      return absl::NotFoundError(absl::StrCat(where, " has no credentials"));
    }
    if (out.access_key_id.empty() || out.secret_access_key.empty()) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": only one of aws_access_key_id and aws_secret_access_key is set; set both"));
    }
    out.source = where;
    return std::optional<AwsCredentials>(std::move(out));
  }

  std::string FilesText() const {
    std::vector<std::string> files;
    if (!credentials_file_.empty()) files.push_back(credentials_file_);
    if (!config_file_.empty()) files.push_back(config_file_);
    return absl::StrJoin(files, " or ");
  }

  const std::string credentials_file_;
  const std::string config_file_;
  const std::string profile_;
  const bool named_;
  const Sts sts_;
};

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

class ContainerSource final : public Source {
 public:
  ContainerSource(const AwsCredentialSettings& s, absl::Duration timeout)
      : full_uri_(s.container_full_uri),
        relative_uri_(s.container_relative_uri),
        token_file_(s.container_authorization_token_file),
        token_(s.container_authorization_token),
        host_(s.container_host.empty() ? "http://169.254.170.2" : s.container_host),
        timeout_(timeout) {}
  std::string Name() const override {
    return "container credentials (AWS_CONTAINER_CREDENTIALS_*_URI)";
  }
  absl::StatusOr<std::optional<AwsCredentials>> Fetch() override {
    std::string url;
    if (!relative_uri_.empty()) {
      url = absl::StrCat(host_, relative_uri_.front() == '/' ? "" : "/", relative_uri_);
    } else if (!full_uri_.empty()) {
      url = full_uri_;
      if (!AllowedContainerUrl(url)) {
        return absl::InvalidArgumentError(
            absl::StrCat("AWS_CONTAINER_CREDENTIALS_FULL_URI ", url,
                         " must be https, or http to a loopback address or the container agent "
                         "(169.254.170.2, 169.254.170.23, fd00:ec2::23)"));
      }
    } else {
      return std::nullopt;
    }
    HttpCall call;
    call.url = url;
    call.timeout = timeout_;
    call.direct = true;
    std::string token = token_;
    if (!token_file_.empty()) {
      auto text = ReadSmallFile(token_file_, "container authorization token file");
      if (!text.ok()) return Annotate(text.status(), "container credentials");
      token = Trimmed(*text);
    }
    if (!token.empty()) {
      if (absl::StrContains(token, '\r') || absl::StrContains(token, '\n')) {
        return absl::InvalidArgumentError(
            "container credentials: the authorization token holds a line break");
      }
      call.headers.push_back(absl::StrCat("Authorization: ", token));
    }
    auto answer = Exchange(call);
    if (!answer.ok()) return Annotate(answer.status(), "container credentials");
    if (answer->status != 200) {
      return absl::PermissionDeniedError(absl::StrCat("container credentials at ", url,
                                                      " answered HTTP ", answer->status, ": ",
                                                      absl::ClippedSubstr(answer->body, 0, 200)));
    }
    auto c = CredentialsFromJson(answer->body);
    if (!c.ok()) return Annotate(c.status(), absl::StrCat("container credentials at ", url));
    c->source = absl::StrCat("container credentials (", url, ")");
    return std::optional<AwsCredentials>(*std::move(c));
  }

 private:
  const std::string full_uri_;
  const std::string relative_uri_;
  const std::string token_file_;
  const std::string token_;
  const std::string host_;
  const absl::Duration timeout_;
};

// IMDSv2: a session token first; IMDSv1 when the service refuses tokens
// (403, 404, 405), as the SDKs do. nullopt when nothing answers.
absl::StatusOr<std::optional<std::vector<std::string>>> ImdsToken(const std::string& endpoint,
                                                                  absl::Duration timeout) {
  HttpCall call;
  call.method = "PUT";
  call.url = absl::StrCat(endpoint, "/latest/api/token");
  call.headers = {
      absl::StrCat("X-aws-ec2-metadata-token-ttl-seconds: ", AbslView(kImdsTokenTtlSeconds))};
  call.timeout = timeout;
  call.direct = true;
  auto answer = Exchange(call);
  if (!answer.ok()) return std::nullopt;
  if (answer->status == 200) {
    return std::optional<std::vector<std::string>>(std::vector<std::string>{
        absl::StrCat("X-aws-ec2-metadata-token: ", Trimmed(answer->body))});
  }
  if (answer->status == 403 || answer->status == 404 || answer->status == 405) {
    return std::optional<std::vector<std::string>>(std::vector<std::string>{});
  }
  return absl::UnavailableError(absl::StrCat("instance metadata at ", endpoint,
                                             " refused a session token: HTTP ", answer->status));
}

class InstanceMetadataSource final : public Source {
 public:
  InstanceMetadataSource(std::string endpoint, absl::Duration timeout)
      : endpoint_(std::move(endpoint)), timeout_(timeout) {
    while (!endpoint_.empty() && endpoint_.back() == '/') endpoint_.pop_back();
  }
  std::string Name() const override {
    return absl::StrCat("EC2 instance metadata (", endpoint_, ")");
  }
  absl::StatusOr<std::optional<AwsCredentials>> Fetch() override {
    if (endpoint_.empty()) return std::nullopt;
    auto headers = ImdsToken(endpoint_, timeout_);
    if (!headers.ok()) return headers.status();
    if (!headers->has_value()) return std::nullopt;
    HttpCall call;
    call.url = absl::StrCat(endpoint_, "/latest/meta-data/iam/security-credentials/");
    call.headers = **headers;
    call.timeout = timeout_;
    call.direct = true;
    auto roles = Exchange(call);
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
    const std::string role = Trimmed(names.front());
    call.url = absl::StrCat(endpoint_, "/latest/meta-data/iam/security-credentials/", role);
    auto answer = Exchange(call);
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

 private:
  std::string endpoint_;
  const absl::Duration timeout_;
};

// ---- The chain, with its cache ----

class DefaultChain final : public AwsCredentialsProvider {
 public:
  DefaultChain(std::vector<std::unique_ptr<Source>> sources, AwsCredentialsOptions options)
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
    return absl::StrJoin(sources_, ", ", [](std::string* out, const std::unique_ptr<Source>& s) {
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

  const std::vector<std::unique_ptr<Source>> sources_;
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

AwsCredentialSettings AwsCredentialSettings::FromProcess() {
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
  if (!absl::EqualsIgnoreCase(Trimmed(GetEnv("AWS_EC2_METADATA_DISABLED")), "true")) {
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
  const Sts sts = MakeSts(settings, options);
  std::vector<std::unique_ptr<Source>> sources;
  sources.push_back(std::make_unique<EnvironmentSource>(static_keys));
  sources.push_back(std::make_unique<WebIdentitySource>(settings, sts));
  sources.push_back(std::make_unique<ProfileSource>(settings, sts));
  sources.push_back(std::make_unique<ContainerSource>(settings, options.http_timeout));
  sources.push_back(std::make_unique<InstanceMetadataSource>(settings.ec2_metadata_endpoint,
                                                             options.metadata_timeout));
  return std::shared_ptr<AwsCredentialsProvider>(
      std::make_shared<DefaultChain>(std::move(sources), std::move(options)));
}

std::string InstanceMetadataRegion(std::string_view endpoint_text, absl::Duration timeout) {
  std::string endpoint(endpoint_text);
  while (!endpoint.empty() && endpoint.back() == '/') endpoint.pop_back();
  if (endpoint.empty()) return "";
  auto headers = ImdsToken(endpoint, timeout);
  if (!headers.ok() || !headers->has_value()) return "";
  HttpCall call;
  call.url = absl::StrCat(endpoint, "/latest/meta-data/placement/region");
  call.headers = **headers;
  call.timeout = timeout;
  call.direct = true;
  auto answer = Exchange(call);
  if (!answer.ok() || answer->status != 200) return "";
  return Trimmed(answer->body);
}

std::string ConfigFileValue(const std::string& path, std::string_view profile,
                            std::string_view key) {
  auto profiles = LoadProfileFile(path, ProfileFileKind::kConfig);
  auto p = profiles.find(std::string(profile));
  if (p == profiles.end()) return "";
  auto v = p->second.find(absl::AsciiStrToLower(AbslView(key)));
  return v == p->second.end() ? std::string() : v->second;
}

}  // namespace stitch

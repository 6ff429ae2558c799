// The shared credentials and config files, and the profile source
// (s3_credential_sources.h) that reads them.
#include <fstream>
#include <sstream>

#include "absl/strings/ascii.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "stitch/core/errors.h"
#include "stitch/store/s3/s3_credential_sources.h"

namespace stitch {
namespace {

using ProfileKeys = std::map<std::string, std::string>;

enum class ProfileFileKind { kCredentials, kConfig };

std::string Trimmed(absl::string_view s) { return std::string(absl::StripAsciiWhitespace(s)); }

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

std::string KeyOf(const ProfileKeys& keys, const char* key) {
  auto it = keys.find(key);
  return it == keys.end() ? std::string() : it->second;
}

}  // namespace

ProfileCredentialSource::ProfileCredentialSource(const AwsCredentialSettings& s, StsEndpoint sts)
    : credentials_file_(s.shared_credentials_file),
      config_file_(s.config_file),
      profile_(s.profile.empty() ? "default" : s.profile),
      named_(!s.profile.empty()),
      sts_(std::move(sts)) {}

std::string ProfileCredentialSource::Name() const {
  std::vector<std::string> files;
  if (!credentials_file_.empty()) files.push_back(credentials_file_);
  if (!config_file_.empty()) files.push_back(config_file_);
  return absl::StrCat("profile \"", profile_, "\"",
                      files.empty() ? "" : absl::StrCat(" in ", absl::StrJoin(files, " and ")));
}

absl::StatusOr<std::optional<AwsCredentials>> ProfileCredentialSource::Fetch() {
  if (credentials_file_.empty() && config_file_.empty()) return std::nullopt;
  auto creds = LoadProfileFile(credentials_file_, ProfileFileKind::kCredentials);
  auto config = LoadProfileFile(config_file_, ProfileFileKind::kConfig);
  return Resolve(profile_, creds, config, named_, 0);
}

absl::StatusOr<std::optional<AwsCredentials>> ProfileCredentialSource::Resolve(
    const std::string& name, const Profiles& creds, const Profiles& config, bool must_exist,
    int depth) {
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
  if (!KeyOf(keys, "role_arn").empty()) {
    return AssumeProfileRole(name, keys, creds, config, depth);
  }
  const std::string where = absl::StrCat("profile \"", name, "\" (", FilesText(), ")");
  AwsCredentials out;
  out.access_key_id = KeyOf(keys, "aws_access_key_id");
  out.secret_access_key = KeyOf(keys, "aws_secret_access_key");
  out.session_token = KeyOf(keys, "aws_session_token");
  if (out.access_key_id.empty() && out.secret_access_key.empty()) {
    for (const char* unsupported : {"credential_process", "sso_session", "sso_start_url"}) {
      if (!KeyOf(keys, unsupported).empty()) {
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

absl::StatusOr<std::optional<AwsCredentials>> ProfileCredentialSource::AssumeProfileRole(
    const std::string& name, const Keys& keys, const Profiles& creds, const Profiles& config,
    int depth) {
  const std::string where = absl::StrCat("profile \"", name, "\" (", FilesText(), ")");
  const std::string role_arn = KeyOf(keys, "role_arn");
  const std::string session = KeyOf(keys, "role_session_name");
  if (std::string token_file = KeyOf(keys, "web_identity_token_file"); !token_file.empty()) {
    auto web = StsAssumeRoleWithWebIdentity(sts_, token_file, role_arn, session);
    if (!web.ok()) return Annotate(web.status(), where);
    web->source = absl::StrCat(where, ": web identity for role ", role_arn);
    return std::optional<AwsCredentials>(*std::move(web));
  }
  const std::string source = KeyOf(keys, "source_profile");
  if (source.empty()) {
    return absl::InvalidArgumentError(absl::StrCat(
        where,
        ": role_arn needs web_identity_token_file or source_profile (credential_source "
        "is not supported: use AWS_CONTAINER_CREDENTIALS_* or instance metadata directly)"));
  }
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
      StsAssumeRole(sts_, "AssumeRole",
                    {{"RoleArn", role_arn},
                     {"RoleSessionName", session.empty() ? DefaultStsSessionName() : session}},
                    &**base);
  if (!assumed.ok()) return Annotate(assumed.status(), where);
  assumed->source =
      absl::StrCat(where, ": role ", role_arn, " assumed with profile \"", source, "\"");
  return std::optional<AwsCredentials>(*std::move(assumed));
}

std::string ProfileCredentialSource::FilesText() const {
  std::vector<std::string> files;
  if (!credentials_file_.empty()) files.push_back(credentials_file_);
  if (!config_file_.empty()) files.push_back(config_file_);
  return absl::StrJoin(files, " or ");
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

#include "stitch/store/s3/s3_uri.h"

#include <algorithm>
#include <boost/url/parse.hpp>
#include <boost/url/url_view.hpp>
#include <cstdlib>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "stitch/core/errors.h"
#include "stitch/store/s3/s3_credential_chain.h"
#include "stitch/store/s3/s3_credential_sources.h"
#include "stitch/store/s3/s3_sigv4.h"

namespace stitch {
namespace {

namespace urls = boost::urls;

constexpr std::string_view kForm =
    "use s3://BUCKET[/PREFIX][?endpoint=URL&region=REGION&anonymous=true]";

std::string GetEnv(const char* name) {
  const char* v = std::getenv(name);
  return v == nullptr ? std::string() : std::string(v);
}

// S3's bucket naming rules (the subset every S3-compatible service accepts).
bool ValidBucket(std::string_view b) {
  if (b.size() < 3 || b.size() > 63) return false;
  auto alnum = [](char c) { return absl::ascii_islower(c) || absl::ascii_isdigit(c); };
  if (!alnum(b.front()) || !alnum(b.back())) return false;
  for (char c : b) {
    if (!alnum(c) && c != '.' && c != '-') return false;
  }
  return !absl::StrContains(AbslView(b), "..");
}

bool ValidRegion(std::string_view r) {
  if (r.empty() || r.size() > 64) return false;
  return std::all_of(r.begin(), r.end(), [](char c) {
    return absl::ascii_islower(c) || absl::ascii_isdigit(c) || c == '-';
  });
}

// Normalizes an endpoint URL: absolute http(s), a host, no user info,
// query or fragment; the trailing '/' dropped.
absl::StatusOr<std::string> NormalizeEndpoint(std::string_view text) {
  auto parsed = urls::parse_absolute_uri(text);
  if (!parsed) return absl::InvalidArgumentError(parsed.error().message());
  const urls::url_view& u = *parsed;
  std::string scheme = absl::AsciiStrToLower(std::string(u.scheme()));
  if (scheme != "http" && scheme != "https") {
    return absl::InvalidArgumentError(absl::StrCat("scheme \"", scheme, "\" is not http or https"));
  }
  if (u.encoded_host().empty()) return absl::InvalidArgumentError("it has no host");
  if (u.has_userinfo() || u.has_query() || u.has_fragment()) {
    return absl::InvalidArgumentError("it has user info, a query or a fragment");
  }
  std::string path(u.encoded_path());
  while (!path.empty() && path.back() == '/') path.pop_back();
  return absl::StrCat(scheme, "://", std::string(u.encoded_host_and_port()), path);
}

// The key prefix a URI's (decoded) path names, without leading or trailing
// '/'; InvalidArgument saying what is wrong with it (completing "store URI
// ... ") otherwise.
absl::StatusOr<std::string> PrefixOfPath(const std::string& path) {
  std::vector<std::string> segments;
  if (path.empty()) return std::string();
  if (path.front() != '/') return absl::InvalidArgumentError("has a relative path");
  std::string_view rest = std::string_view(path).substr(1);
  if (!rest.empty() && rest.back() == '/') rest.remove_suffix(1);
  if (!rest.empty()) {
    for (absl::string_view seg : absl::StrSplit(AbslView(rest), '/')) {
      if (seg.empty() || seg == "." || seg == "..") {
        return absl::InvalidArgumentError("has an empty, \".\" or \"..\" prefix segment");
      }
      if (absl::StrContains(seg, '\0') || absl::StrContains(seg, '\\')) {
        return absl::InvalidArgumentError("has a NUL or backslash in its prefix");
      }
      segments.emplace_back(seg);
    }
  }
  return absl::StrJoin(segments, "/");
}

}  // namespace

S3Environment S3Environment::FromProcess() {
  S3Environment env;
  env.access_key_id = GetEnv("AWS_ACCESS_KEY_ID");
  env.secret_access_key = GetEnv("AWS_SECRET_ACCESS_KEY");
  env.session_token = GetEnv("AWS_SESSION_TOKEN");
  env.credentials = AwsCredentialSettingsFromProcess();
  env.region = env.credentials.region;
  env.endpoint_url = GetEnv("AWS_ENDPOINT_URL_S3");
  if (env.endpoint_url.empty()) env.endpoint_url = GetEnv("AWS_ENDPOINT_URL");
  return env;
}

std::string S3Location::Display() const {
  return prefix.empty() ? absl::StrCat("s3://", bucket)
                        : absl::StrCat("s3://", bucket, "/", prefix);
}

std::string S3Location::DisplayKey(std::string_view key) const {
  return absl::StrCat("s3://", bucket, "/", AbslView(key));
}

std::string S3Location::Key(std::string_view relative) const {
  return prefix.empty() ? std::string(relative) : absl::StrCat(prefix, "/", AbslView(relative));
}

std::string S3Location::RequestUrl(std::string_view key,
                                   std::vector<std::pair<std::string, std::string>> query) const {
  std::string url;
  std::string path = SigV4Encode(key, SlashEncoding::kKeep);
  if (!endpoint.empty()) {
    url = absl::StrCat(endpoint, "/", bucket, path.empty() ? "" : "/", path);
  } else if (absl::StrContains(bucket, ".")) {
    url = absl::StrCat("https://s3.", region, ".amazonaws.com/", bucket, path.empty() ? "" : "/",
                       path);
  } else {
    url = absl::StrCat("https://", bucket, ".s3.", region, ".amazonaws.com/", path);
  }
  if (query.empty()) return url;
  std::vector<std::pair<std::string, std::string>> encoded;
  encoded.reserve(query.size());
  for (auto& [k, v] : query) {
    encoded.emplace_back(SigV4Encode(k, SlashEncoding::kEncode),
                         SigV4Encode(v, SlashEncoding::kEncode));
  }
  std::sort(encoded.begin(), encoded.end());
  absl::StrAppend(&url, "?", absl::StrJoin(encoded, "&", [](std::string* out, const auto& kv) {
    absl::StrAppend(out, kv.first, "=", kv.second);
  }));
  return url;
}

absl::StatusOr<S3Location> ParseS3Uri(std::string_view uri, const S3Environment& env) {
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat("store URI \"", absl::CEscape(AbslView(uri)),
                                                   "\" ", why, "; ", AbslView(kForm)));
  };
  auto parsed = urls::parse_absolute_uri(uri);
  if (!parsed) return bad(absl::StrCat("is not a valid URI: ", parsed.error().message()));
  const urls::url_view& u = *parsed;
  if (absl::AsciiStrToLower(std::string(u.scheme())) != "s3") return bad("is not an s3:// URI");
  if (u.has_userinfo()) return bad("holds user info; pass credentials in AWS_* variables");
  if (u.has_port()) return bad("has a port; put the service in ?endpoint=URL");
  if (u.has_fragment()) return bad("has a fragment");

  S3Location loc;
  loc.bucket = u.host();
  if (loc.bucket.empty()) return bad("names no bucket");
  if (!ValidBucket(loc.bucket)) {
    return bad(absl::StrCat("names bucket \"", absl::CEscape(loc.bucket),
                            "\", which is not a valid S3 bucket name (3-63 characters of a-z, "
                            "0-9, '.' and '-')"));
  }
  auto prefix = PrefixOfPath(u.path());
  if (!prefix.ok()) return bad(prefix.status().message());
  loc.prefix = *std::move(prefix);

  std::string endpoint_param;
  std::string region_param;
  std::set<std::string> seen;
  for (auto param : u.params(urls::encoding_opts{})) {
    std::string key = param.key;
    if (!seen.insert(key).second) return bad(absl::StrCat("repeats ?", absl::CEscape(key), "="));
    if (key == "endpoint") {
      endpoint_param = param.value;
    } else if (key == "region") {
      region_param = param.value;
    } else if (key == "anonymous") {
      // Only the two words: a typo must not turn signing off in silence.
      if (param.value != "true" && param.value != "false") {
        return bad(absl::StrCat("has anonymous=\"", absl::CEscape(param.value),
                                "\" (give anonymous=true for unsigned requests, or leave it out)"));
      }
      loc.anonymous = param.value == "true";
    } else {
      return bad(absl::StrCat("has an unknown parameter \"", absl::CEscape(key),
                              "\" (known: endpoint, region, anonymous)"));
    }
  }

  std::string endpoint = !endpoint_param.empty() ? endpoint_param : env.endpoint_url;
  if (!endpoint.empty()) {
    auto normalized = NormalizeEndpoint(endpoint);
    if (!normalized.ok()) {
      return bad(absl::StrCat(
          "has endpoint \"", absl::CEscape(endpoint),
          "\", which is not an absolute http(s) URL: ", normalized.status().message()));
    }
    loc.endpoint = *std::move(normalized);
  }
  loc.region = !region_param.empty() ? region_param : env.region;
  // On AWS itself a region must be right; an instance knows its own. Other
  // services (an explicit endpoint) take any region.
  if (loc.region.empty() && loc.endpoint.empty()) {
    loc.region = InstanceMetadataRegion(env.credentials.ec2_metadata_endpoint);
  }
  if (loc.region.empty()) loc.region = "us-east-1";
  if (!ValidRegion(loc.region)) {
    return bad(absl::StrCat("has region \"", absl::CEscape(loc.region),
                            "\", which is not a region name (a-z, 0-9 and '-')"));
  }

  loc.uri = loc.Display();
  std::vector<std::string> query;
  if (!endpoint_param.empty()) {
    query.push_back(absl::StrCat("endpoint=", SigV4Encode(loc.endpoint, SlashEncoding::kKeep)));
  }
  if (!region_param.empty()) query.push_back(absl::StrCat("region=", loc.region));
  if (loc.anonymous) query.push_back("anonymous=true");
  if (!query.empty()) absl::StrAppend(&loc.uri, "?", absl::StrJoin(query, "&"));
  return loc;
}

}  // namespace stitch

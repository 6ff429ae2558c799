#include "stitch/net/http.h"

#include <algorithm>
#include <array>

#include <boost/json/serialize.hpp>
#include <boost/json/string.hpp>
#include <boost/url/parse.hpp>
#include <boost/url/url_view.hpp>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "stitch/core/errors.h"

namespace stitch {

std::optional<std::string_view> HttpHeaders::Get(std::string_view name) const {
  for (const Field& f : fields_) {
    if (absl::EqualsIgnoreCase(f.first, AbslView(name))) return std::string_view(f.second);
  }
  return std::nullopt;
}

void HttpHeaders::Set(std::string_view name, std::string_view value) {
  auto it = std::find_if(fields_.begin(), fields_.end(), [&](const Field& f) {
    return absl::EqualsIgnoreCase(f.first, AbslView(name));
  });
  if (it == fields_.end()) {
    fields_.emplace_back(name, value);
    return;
  }
  it->second.assign(value);
  fields_.erase(std::remove_if(std::next(it), fields_.end(),
                               [&](const Field& f) {
                                 return absl::EqualsIgnoreCase(f.first, AbslView(name));
                               }),
                fields_.end());
}

void HttpHeaders::Add(std::string_view name, std::string_view value) {
  fields_.emplace_back(name, value);
}

size_t HttpHeaders::Remove(std::string_view name) {
  size_t before = fields_.size();
  fields_.erase(std::remove_if(fields_.begin(), fields_.end(),
                               [&](const Field& f) {
                                 return absl::EqualsIgnoreCase(f.first, AbslView(name));
                               }),
                fields_.end());
  return before - fields_.size();
}

bool IsFramingHeader(std::string_view name) {
  static constexpr std::array<std::string_view, 8> kFraming = {
      "content-length", "transfer-encoding", "connection",      "keep-alive", "te",
      "trailer",        "upgrade",           "proxy-connection"};
  return std::any_of(kFraming.begin(), kFraming.end(), [&](std::string_view f) {
    return absl::EqualsIgnoreCase(AbslView(f), AbslView(name));
  });
}

HttpResponse JsonResponse(int status, std::string body) {
  HttpResponse r;
  r.status = status;
  r.headers.Add("Content-Type", "application/json");
  r.body = std::move(body);
  return r;
}

HttpHeaders CopyHeaders(const HttpHeaders& from, bool (*drop)(std::string_view name)) {
  HttpHeaders to;
  to.reserve(from.size());
  for (const auto& [name, value] : from) {
    if (!drop(name)) to.Add(name, value);
  }
  return to;
}

HttpHeaders CopyHeaders(HttpHeaders&& from, bool (*drop)(std::string_view name)) {
  HttpHeaders to;
  to.reserve(from.size());
  HttpHeaders::Fields fields = from.Release();
  for (HttpHeaders::Field& field : fields) {
    if (!drop(field.first)) to.Add(std::move(field));
  }
  return to;
}

std::string JsonErrorBody(std::string_view type, std::string_view message, bool retryable) {
  return absl::StrCat("{\"error\":{\"type\":", boost::json::serialize(boost::json::string(type)),
                      ",\"message\":", boost::json::serialize(boost::json::string(message)),
                      retryable ? ",\"retryable\":true}}" : "}}");
}

std::string_view TargetPath(std::string_view target) {
  // Without a query the path is the whole target, valid or not (see below).
  if (target.find('?') == std::string_view::npos) return target;
  auto parsed = boost::urls::parse_origin_form(target);
  if (!parsed) return target;
  boost::urls::pct_string_view path = parsed->encoded_path();
  return std::string_view(path.data(), path.size());
}

std::optional<std::string> TargetQueryParam(std::string_view target, std::string_view name) {
  auto parsed = boost::urls::parse_origin_form(target);
  if (!parsed) return std::nullopt;
  for (const auto& param : parsed->params()) {
    if (param.key == name) return param.has_value ? param.value : std::string();
  }
  return std::nullopt;
}

std::string_view StatusReason(int status) {
  switch (status) {
    case 100:
      return "Continue";
    case 200:
      return "OK";
    case 201:
      return "Created";
    case 202:
      return "Accepted";
    case 204:
      return "No Content";
    case 206:
      return "Partial Content";
    case 301:
      return "Moved Permanently";
    case 302:
      return "Found";
    case 304:
      return "Not Modified";
    case 307:
      return "Temporary Redirect";
    case 308:
      return "Permanent Redirect";
    case 400:
      return "Bad Request";
    case 401:
      return "Unauthorized";
    case 403:
      return "Forbidden";
    case 404:
      return "Not Found";
    case 405:
      return "Method Not Allowed";
    case 408:
      return "Request Timeout";
    case 409:
      return "Conflict";
    case 410:
      return "Gone";
    case 411:
      return "Length Required";
    case 412:
      return "Precondition Failed";
    case 413:
      return "Payload Too Large";
    case 415:
      return "Unsupported Media Type";
    case 422:
      return "Unprocessable Entity";
    case 429:
      return "Too Many Requests";
    case 431:
      return "Request Header Fields Too Large";
    case 499:
      return "Client Closed Request";
    case 500:
      return "Internal Server Error";
    case 501:
      return "Not Implemented";
    case 502:
      return "Bad Gateway";
    case 503:
      return "Service Unavailable";
    case 504:
      return "Gateway Timeout";
    default:
      return "";
  }
}

std::string HttpOrigin::ToString() const {
  if (absl::StrContains(host, ':')) return absl::StrCat("http://[", host, "]:", port);
  return absl::StrCat("http://", host, ":", port);
}

absl::StatusOr<HttpUrl> ParseHttpUrl(std::string_view url) {
  auto bad = [&](std::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat("URL \"", AbslView(url), "\" ", AbslView(why),
                                                   "; expected http://HOST[:PORT][/PATH]"));
  };
  auto parsed = boost::urls::parse_absolute_uri(url);
  if (!parsed) return bad("is not a valid absolute URL");
  const boost::urls::url_view& u = *parsed;
  if (!absl::EqualsIgnoreCase(absl::string_view(u.scheme().data(), u.scheme().size()), "http")) {
    return bad("does not use the http scheme");
  }
  if (!u.has_authority()) return bad("has no host");
  if (u.has_userinfo()) return bad("carries user info, which is not supported");
  if (u.has_fragment()) return bad("has a fragment");
  HttpUrl out;
  out.origin.host = u.host_address();
  if (out.origin.host.empty()) return bad("has no host");
  if (u.has_port() && !u.port().empty()) {
    uint32_t port = 0;
    if (!absl::SimpleAtoi(absl::string_view(u.port().data(), u.port().size()), &port) ||
        port == 0 || port > 65535) {
      return bad("has a port outside 1..65535");
    }
    out.origin.port = static_cast<uint16_t>(port);
  }
  boost::urls::pct_string_view target = u.encoded_target();
  if (target.empty() || target.front() == '?') {
    out.target.push_back('/');
  } else if (target.front() != '/') {
    return bad("is not a valid absolute URL");
  }
  out.target.append(target.data(), target.size());
  return out;
}

}  // namespace stitch

#include "stitch/net/wire.h"

#include <boost/beast/core/string.hpp>
#include <boost/beast/http/rfc7230.hpp>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "stitch/core/errors.h"

namespace stitch::net_internal {
namespace {

namespace http = boost::beast::http;

// Room for a typical head, so that it is written without reallocating.
constexpr size_t kHeadReserve = 256;

// RFC 9110 tchar.
bool IsTokenChar(char c) {
  if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9')) return true;
  return c != '\0' && std::string_view("!#$%&'*+-.^_`|~").find(c) != std::string_view::npos;
}

bool IsToken(std::string_view s) {
  if (s.empty()) return false;
  for (char c : s) {
    if (!IsTokenChar(c)) return false;
  }
  return true;
}

bool IsSafeValue(std::string_view s) {
  return s.find_first_of(std::string_view("\r\n\0", 3)) == std::string_view::npos;
}

}  // namespace

absl::Status AppendFields(const HttpHeaders& headers, bool skip_host, std::string& out,
                          bool* close) {
  for (const auto& [name, value] : headers) {
    if (!IsToken(name)) {
      return absl::InvalidArgumentError(
          absl::StrCat("header name \"", absl::CEscape(name), "\" is not an HTTP token"));
    }
    if (!IsSafeValue(value)) {
      return absl::InvalidArgumentError(absl::StrCat(
          "header ", name, " has a value with CR, LF or NUL: \"", absl::CEscape(value), "\""));
    }
  }
  for (const auto& [name, value] : headers) {
    if (IsFramingHeader(name)) {
      if (boost::beast::iequals(name, "connection") && http::token_list(value).exists("close")) {
        *close = true;
      }
      continue;
    }
    if (skip_host && boost::beast::iequals(name, "host")) continue;
    out.append(name).append(": ").append(value).append("\r\n");
  }
  return absl::OkStatus();
}

absl::Status FormatResponseHead(unsigned version, int status, const HttpHeaders& headers,
                                Framing framing, size_t body_size, bool keep_alive, bool* close,
                                std::string& out) {
  const size_t start = out.size();
  out.reserve(start + kHeadReserve);
  out.append(version == 10 ? "HTTP/1.0 " : "HTTP/1.1 ");
  absl::StrAppend(&out, status, " ");
  out.append(StatusReason(status)).append("\r\n");
  if (absl::Status s = AppendFields(headers, /*skip_host=*/false, out, close); !s.ok()) {
    out.resize(start);
    return s;
  }
  switch (framing) {
    case Framing::kLength:
      absl::StrAppend(&out, "Content-Length: ", body_size, "\r\n");
      break;
    case Framing::kNone:
      break;
    case Framing::kStreamed:
      if (version == 10) {
        *close = true;
      } else {
        out.append("Transfer-Encoding: chunked\r\n");
      }
      break;
  }
  const bool persist = keep_alive && !*close;
  if (version == 10 && persist) out.append("Connection: keep-alive\r\n");
  if (version != 10 && !persist) out.append("Connection: close\r\n");
  out.append("\r\n");
  return absl::OkStatus();
}

absl::Status FormatRequestHead(std::string_view method, std::string_view target,
                               const HttpHeaders& headers, std::string_view host, size_t body_size,
                               std::string& out) {
  if (!IsToken(method)) {
    return absl::InvalidArgumentError(method.empty() ? std::string("HTTP request without a method")
                                                     : absl::StrCat("HTTP method \"",
                                                                    absl::CEscape(AbslView(method)),
                                                                    "\" is not an HTTP token"));
  }
  if (target.empty() || target.front() != '/' ||
      target.find_first_of(std::string_view(" \r\n\0", 4)) != std::string_view::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("HTTP request target \"", absl::CEscape(AbslView(target)),
                     "\" must start with '/' (origin form) and hold no space, CR, LF or NUL"));
  }
  const size_t start = out.size();
  out.reserve(start + kHeadReserve + target.size());
  out.append(method).append(" ").append(target).append(" HTTP/1.1\r\n");
  bool close = false;  // a request's own Connection field is dropped like any framing field
  if (absl::Status s = AppendFields(headers, /*skip_host=*/true, out, &close); !s.ok()) {
    out.resize(start);
    return s;
  }
  out.append("Host: ").append(host).append("\r\n");
  if (body_size > 0 || method == "POST" || method == "PUT" || method == "OPTIONS") {
    absl::StrAppend(&out, "Content-Length: ", body_size, "\r\n");
  }
  out.append("\r\n");
  return absl::OkStatus();
}

}  // namespace stitch::net_internal

#include "stitch/api/headers.h"

#include <string_view>
#include <utility>

#include "absl/strings/match.h"
#include "stitch/core/errors.h"

namespace stitch {
namespace {

bool Is(std::string_view name, std::string_view field) {
  return absl::EqualsIgnoreCase(AbslView(name), AbslView(field));
}

bool NeverForwarded(std::string_view name) {
  return IsFramingHeader(name) || Is(name, "host") || Is(name, "expect");
}

bool DropRequestUnchanged(std::string_view name) { return NeverForwarded(name); }

bool DropRequestRewritten(std::string_view name) {
  return NeverForwarded(name) || Is(name, "accept-encoding") || Is(name, "content-type");
}

bool DropResponseUnchanged(std::string_view name) {
  return IsFramingHeader(name) || Is(name, "content-length");
}

bool DropResponseRewritten(std::string_view name) {
  return DropResponseUnchanged(name) || Is(name, "content-encoding");
}

}  // namespace

HttpHeaders RequestHeadersToForward(const HttpHeaders& from, BodyRelay relay) {
  return CopyHeaders(
      from, relay == BodyRelay::kUnchanged ? &DropRequestUnchanged : &DropRequestRewritten);
}

HttpHeaders ResponseHeadersToRelay(const HttpHeaders& from, BodyRelay relay) {
  return CopyHeaders(
      from, relay == BodyRelay::kUnchanged ? &DropResponseUnchanged : &DropResponseRewritten);
}

HttpHeaders ResponseHeadersToRelay(HttpHeaders&& from, BodyRelay relay) {
  return CopyHeaders(std::move(from), relay == BodyRelay::kUnchanged ? &DropResponseUnchanged
                                                                     : &DropResponseRewritten);
}

bool IsEventStream(const HttpHeaders& response_headers) {
  const std::optional<std::string_view> type = response_headers.Get("content-type");
  return type.has_value() && type->find("text/event-stream") != std::string_view::npos;
}

}  // namespace stitch

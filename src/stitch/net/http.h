// HTTP vocabulary shared by the server and the client: requests, responses,
// header lists, origins and URLs. No I/O and no Boost headers here; parsing of
// URLs and request targets is done by Boost.URL in http.cc.
//
// Framing headers (Content-Length, Transfer-Encoding, Connection, Keep-Alive,
// TE, Trailer, Upgrade, Proxy-Connection) are owned by the library: the server
// and the client set them from the message they send and ignore any found in
// HttpRequest::headers or HttpResponse::headers, so a handler can forward a
// received message without scrubbing it first. A field name that is not an
// HTTP token, or a value with CR, LF or NUL, would split the message: the
// server's answers (Respond(), BeginStream()) and the client's calls refuse
// it with InvalidArgument before anything is sent.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "absl/container/inlined_vector.h"
#include "absl/status/statusor.h"

namespace stitch {

// An ordered list of header fields. Names compare case-insensitively; values
// are kept as received. Repeated names are allowed (Add) and kept in order.
class HttpHeaders {
 public:
  using Field = std::pair<std::string, std::string>;
  // Most messages carry a handful of fields: those live inline, so building
  // or copying the headers of a typical request allocates nothing more.
  using Fields = absl::InlinedVector<Field, 6>;

  HttpHeaders() = default;
  HttpHeaders(std::initializer_list<Field> fields) : fields_(fields) {}

  // The value of the first field named `name`, or nullopt. The view is valid
  // until the headers are modified.
  std::optional<std::string_view> Get(std::string_view name) const;
  bool Has(std::string_view name) const { return Get(name).has_value(); }

  // Replaces every field named `name` by one field with `value`.
  void Set(std::string_view name, std::string_view value);
  // Appends a field, keeping existing ones of the same name.
  void Add(std::string_view name, std::string_view value);
  void Add(Field field) { fields_.push_back(std::move(field)); }
  // Removes every field named `name`; returns how many were removed.
  size_t Remove(std::string_view name);

  const Fields& fields() const { return fields_; }
  auto begin() const { return fields_.begin(); }
  auto end() const { return fields_.end(); }
  size_t size() const { return fields_.size(); }
  bool empty() const { return fields_.empty(); }
  void reserve(size_t n) { fields_.reserve(n); }
  // Leaves the headers empty and returns their fields.
  Fields Release() { return std::exchange(fields_, Fields()); }

 private:
  Fields fields_;
};

// True for the framing headers listed at the top of this file.
bool IsFramingHeader(std::string_view name);

// The fields of `from` for which `drop` is false, in order: the headers a
// proxy passes on.
HttpHeaders CopyHeaders(const HttpHeaders& from, bool (*drop)(std::string_view name));
// The same, moving the kept fields out of `from`.
HttpHeaders CopyHeaders(HttpHeaders&& from, bool (*drop)(std::string_view name));

namespace net_internal {
struct ClientConnection;
}

// Ends a client call early from outside, for a proxy whose own client left:
// Abort() closes the connection of the call it was given to
// (CallOptions::abort; a call not connected yet fails before connecting, a
// streamed call is covered until its body ends), and that call, or the
// stream's Read(), returns CancelledError. Much cheaper than Asio cancellation,
// which runs the call as its own coroutine and allocates per operation.
// One call at a time; loop thread only; must outlive the call.
class HttpCallAbort {
 public:
  HttpCallAbort() = default;
  ~HttpCallAbort();
  HttpCallAbort(const HttpCallAbort&) = delete;
  HttpCallAbort& operator=(const HttpCallAbort&) = delete;

  void Abort();
  bool aborted() const { return aborted_; }

 private:
  friend struct net_internal::ClientConnection;
  bool aborted_ = false;
  net_internal::ClientConnection* connection_ = nullptr;  // the call's, while it has one
};

struct HttpRequest {
  std::string method = "GET";
  // Origin form: "/path?query". The client sends it as is.
  std::string target = "/";
  HttpHeaders headers;
  std::string body;
};

struct HttpResponse {
  int status = 200;
  HttpHeaders headers;
  std::string body;
};

// A response with `body` and "Content-Type: application/json".
HttpResponse JsonResponse(int status, std::string body);

// The JSON error body used across Stitch, the original Python Stitch's
// shape: {"error": {"type": <type>, "message": <message>}} (properly
// escaped), with "retryable": true inside after them when `retryable`.
std::string JsonErrorBody(std::string_view type, std::string_view message, bool retryable = false);

// The path of an origin-form request target ("/a/b" for "/a/b?x=1"), still
// percent-encoded. An unparseable target is returned whole.
std::string_view TargetPath(std::string_view target);

// The decoded value of query parameter `name` in an origin-form request
// target ("" for "?name" without a value); nullopt when the target has no
// such parameter or does not parse.
std::optional<std::string> TargetQueryParam(std::string_view target, std::string_view name);

// The standard reason phrase of `status` ("Not Found"), or "" when unknown.
std::string_view StatusReason(int status);

// Where a client sends requests: scheme http, a host (name or IP address
// literal) and a port.
struct HttpOrigin {
  std::string host;
  uint16_t port = 80;

  // "http://host:port" (IPv6 literals in brackets).
  std::string ToString() const;
  friend bool operator==(const HttpOrigin&, const HttpOrigin&) = default;
};

struct HttpUrl {
  HttpOrigin origin;
  std::string target;  // "/path?query"; "/" when the URL has no path

  std::string ToString() const { return origin.ToString() + target; }
};

// Parses an absolute http URL ("http://host[:port][/path][?query]"). Errors
// (InvalidArgument) name the URL: other schemes, user info, fragments, a
// missing host or a bad port are refused.
[[nodiscard]] absl::StatusOr<HttpUrl> ParseHttpUrl(std::string_view url);

}  // namespace stitch

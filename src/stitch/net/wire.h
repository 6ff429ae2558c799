// Internal to src/stitch/net: the heads of the messages the server and the
// client send, written straight into one string. A message then goes out as
// one gathered write of its head and its body, without Beast's serializer
// and its per-field allocations. Beast still parses what comes in.
#pragma once

#include <string>
#include <string_view>

#include "absl/status/status.h"
#include "stitch/net/http.h"

namespace stitch::net_internal {

// Appends "Name: value\r\n" for each field of `headers` that is not a
// framing header (nor Host, with `skip_host`). Sets `*close` when a
// Connection field lists "close". InvalidArgument, with nothing appended,
// when a name is not an HTTP token or a value holds CR, LF or NUL: such a
// field would end the head early or smuggle in another one.
[[nodiscard]] absl::Status AppendFields(const HttpHeaders& headers, bool skip_host,
                                        std::string& out, bool* close);

// How a response's body is delimited.
enum class Framing {
  kLength,    // Content-Length: the body's size
  kNone,      // no body and no length (204 and 304)
  kStreamed,  // chunked in HTTP/1.1; in HTTP/1.0 the body ends with the connection
};

// The head of a response: status line, the fields of `headers` (see
// AppendFields), the framing field, and the Connection field that
// `keep_alive` asks for under `version` (10 or 11). Appended to `out`; on
// error `out` is left as it was. `*close` comes in as whether the connection
// closes after this response, and is set when `headers` ask for that too, or
// when an HTTP/1.0 body is streamed.
[[nodiscard]] absl::Status FormatResponseHead(unsigned version, int status,
                                              const HttpHeaders& headers, Framing framing,
                                              size_t body_size, bool keep_alive, bool* close,
                                              std::string& out);

// The head of an HTTP/1.1 keep-alive request: request line, the fields of
// `headers` (see AppendFields), Host, and Content-Length when there is a
// body or the method expects one (POST, PUT, OPTIONS). InvalidArgument when
// the method is not a token or the target is not in origin form.
[[nodiscard]] absl::Status FormatRequestHead(std::string_view method, std::string_view target,
                                             const HttpHeaders& headers, std::string_view host,
                                             size_t body_size, std::string& out);

}  // namespace stitch::net_internal

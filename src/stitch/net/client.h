// HTTP/1.1 client on Boost.Asio C++20 coroutines, with a keep-alive
// connection pool per origin.
//
// An HttpClient is bound to one executor (normally an EventLoop's) and is
// used only from coroutines running there: it takes no locks. Each call takes
// an idle pooled connection to the origin when one is alive, or connects, and
// puts the connection back when the response was read to its end and both
// sides allow keep-alive. At most ClientOptions::max_idle_per_origin idle
// connections are kept per origin; broken, expired and surplus ones are
// closed.
//
// Retry rule: a request is retried once, on a fresh connection, only when it
// went out on a reused idle connection that turned out dead before any byte
// of the response arrived, and either writing the request failed (it never
// reached the server) or the method is idempotent (GET, HEAD, PUT, DELETE,
// OPTIONS, TRACE). A POST is never sent twice.
//
// Errors (the message names the method and the URL):
//   Unavailable        connect refused or timed out, connection reset or
//                      closed early, name resolution failed, malformed response
//   DeadlineExceeded   no complete response within the call's timeout (for a
//                      streamed call: no response header in time, or no body
//                      bytes within stream_idle_timeout)
//   ResourceExhausted  a response body over max_response_body_bytes
//   Cancelled          the awaiting coroutine was cancelled (Asio cancellation
//                      slots: `||` from awaitable_operators,
//                      HttpExchange::CancelOnDisconnect, bind_cancellation_slot),
//                      or the call's CallOptions::abort fired
//   InvalidArgument    a bad URL, method or target
// A cancelled or failed call closes its connection, so the server sees the
// client go away.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>

#include "absl/status/statusor.h"
#include "stitch/net/http.h"

namespace stitch {

struct ClientOptions {
  // For establishing a connection (bounded by the call's timeout too).
  std::chrono::milliseconds connect_timeout = std::chrono::seconds(5);
  // Default per-call timeout; see CallOptions::timeout.
  std::chrono::milliseconds request_timeout = std::chrono::seconds(60);
  // Default for CallOptions::stream_idle_timeout; zero means none.
  std::chrono::milliseconds stream_idle_timeout = std::chrono::milliseconds(0);
  // Idle keep-alive connections kept per origin.
  size_t max_idle_per_origin = 256;
  // An idle connection older than this is closed rather than reused. Below
  // the 5 s keep-alive of common Python servers (uvicorn), so the client
  // usually drops a connection before the server does.
  std::chrono::milliseconds idle_timeout = std::chrono::seconds(4);
  size_t max_response_body_bytes = size_t{256} << 20;
  size_t max_response_header_bytes = size_t{64} << 10;
};

// Per-call overrides of ClientOptions.
struct CallOptions {
  // Send(): the whole call (connect, request, complete response).
  // SendStreamed(): until the response header has arrived.
  std::optional<std::chrono::milliseconds> timeout;
  // SendStreamed(): the longest wait for body bytes in one Read(); zero
  // means no limit.
  std::optional<std::chrono::milliseconds> stream_idle_timeout;
  // Ends the call with CancelledError when aborted (see HttpCallAbort in
  // http.h). For SendStreamed(), until the body has ended or the stream was
  // closed: an abort in between closes the connection, and the stream's
  // Read() returns CancelledError.
  HttpCallAbort* abort = nullptr;
};

namespace net_internal {
struct ClientPool;
}

// A response whose body is read as it arrives. Move-only. Destroying or
// Close()-ing it before the end of the body closes the connection; reading to
// the end returns the connection to its client's pool. Use it on the
// client's executor only; it may outlive the client (its connection is then
// simply closed at the end).
class HttpResponseStream {
 public:
  HttpResponseStream(HttpResponseStream&&) noexcept;
  HttpResponseStream& operator=(HttpResponseStream&&) noexcept;
  ~HttpResponseStream();

  int status() const;
  const HttpHeaders& headers() const;

  // The next body bytes, as soon as any arrive (server-sent events come
  // through when the server sends them; one Read() may return part of an
  // event or several). An empty string means the body has ended. Errors as
  // in the file comment; after an error the stream is closed.
  [[nodiscard]] boost::asio::awaitable<absl::StatusOr<std::string>> Read();

  // The rest of the body (at most max_response_body_bytes).
  [[nodiscard]] boost::asio::awaitable<absl::StatusOr<std::string>> ReadAll();

  // True once the body ended or the stream was closed.
  bool finished() const;
  // Closes the connection unless the body already ended.
  void Close();

  struct Impl;

 private:
  friend class HttpClient;
  explicit HttpResponseStream(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

class HttpClient {
 public:
  // `executor` must outlive the client.
  explicit HttpClient(boost::asio::any_io_executor executor, ClientOptions options = {});
  // Closes the idle connections (on the executor). Calls and streams still in
  // flight keep the pool alive until they finish. May run on any thread.
  ~HttpClient();
  HttpClient(const HttpClient&) = delete;
  HttpClient& operator=(const HttpClient&) = delete;

  // Sends `request` (its target is sent as is) to `origin` and reads the
  // whole response. Any status code is a successful call.
  [[nodiscard]] boost::asio::awaitable<absl::StatusOr<HttpResponse>> Send(HttpOrigin origin,
                                                                          HttpRequest request,
                                                                          CallOptions options = {});

  // Sends `request` and returns once the response header has arrived; the
  // body is read through the returned stream.
  [[nodiscard]] boost::asio::awaitable<absl::StatusOr<HttpResponseStream>> SendStreamed(
      HttpOrigin origin, HttpRequest request, CallOptions options = {});

  // Send() to an absolute http URL with an optional body (sent with
  // "Content-Type: application/json" when non-empty).
  [[nodiscard]] boost::asio::awaitable<absl::StatusOr<HttpResponse>> Fetch(
      std::string method, std::string url, std::string body = {}, CallOptions options = {});

  // Pool statistics, for tests and metrics; readable from any thread.
  size_t idle_connections() const;
  uint64_t connections_opened() const;

 private:
  std::shared_ptr<net_internal::ClientPool> pool_;
};

struct FetchOptions {
  HttpHeaders headers;
  // Bounds the whole call, connecting included.
  std::chrono::milliseconds timeout = std::chrono::seconds(30);
};

// Blocking convenience for command-line tools and tests: runs one request on
// a private io_context in the calling thread. Never call it on an event-loop
// thread. A non-empty body is sent as JSON unless options.headers sets
// Content-Type.
[[nodiscard]] absl::StatusOr<HttpResponse> HttpFetch(std::string_view method, std::string_view url,
                                                     std::string body = {},
                                                     const FetchOptions& options = {});

struct StreamedFetchOptions {
  HttpHeaders headers;
  std::chrono::milliseconds connect_timeout = std::chrono::seconds(5);
  // Bounds the whole call: connecting, the header and the whole body.
  std::chrono::milliseconds timeout = std::chrono::seconds(30);
  // The longest wait for body bytes once the header arrived; zero: none.
  std::chrono::milliseconds stall_timeout = std::chrono::milliseconds(0);
};

// Blocking streamed GET for worker threads (never an event-loop thread):
// the response's status and header go to `on_header` before any of its
// body is read, then each piece of the body to `on_body` as it arrives. An
// error from either ends the call with that error and closes the
// connection, so a sender can be cut off mid-body. DeadlineExceeded when
// the whole call outlives options.timeout or the body stalls longer than
// options.stall_timeout; the client's errors otherwise (client.h).
[[nodiscard]] absl::Status HttpFetchStreamed(
    std::string_view url, const StreamedFetchOptions& options,
    const std::function<absl::Status(int status, const HttpHeaders& headers)>& on_header,
    const std::function<absl::Status(std::string_view bytes)>& on_body);

}  // namespace stitch

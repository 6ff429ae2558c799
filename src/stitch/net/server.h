// HTTP/1.1 server on Boost.Asio C++20 coroutines.
//
// One server runs on one executor, normally an io_context run by a single
// thread (see EventLoop): every connection, handler and timer of the server
// lives on that thread, so the hot path takes no locks. Thousands of
// concurrent connections cost one coroutine each, never a thread.
//
// Per connection the server reads a request (header and body, each under its
// own timeout and size limit), hands an HttpExchange to the handler coroutine,
// writes what the handler sends, and keeps the connection alive for the next
// request when both sides allow it. The server answers by itself, with a JSON
// error body ({"error": {"type", "message"}}, net/http.h JsonErrorBody) and then closes the
// connection:
//   400 BadRequest          a request Beast cannot parse, CONNECT, a target
//                           that is not origin-form ("/path?query"): handlers
//                           never see `*`, an authority or an absolute URL;
//                           or more than one Authorization header (which one
//                           counts would depend on who reads it)
//   413 PayloadTooLarge     a body over ServerOptions::max_body_bytes
//   431 HeadersTooLarge     a header over ServerOptions::max_header_bytes
//   503 Overloaded          a body that would pass
//                           ServerOptions::max_total_body_bytes, the part
//                           open to requests without a credential, or its
//                           client's share (with Retry-After: 1 and
//                           "retryable": true); the rest of it is not read
//   500 HandlerError        a handler that returned without responding or threw
//   whatever ServerOptions::head_check answers, at the header (a 401)
// Timeouts close the connection without an answer, and so does a body that
// arrives slower than ServerOptions::min_body_bytes_per_second.
//
// Memory: a request's body counts against max_total_body_bytes as its bytes
// arrive, until its handler returns, whatever the handler did with the
// bytes; so the bodies a server holds at once, and what handlers derive from
// them, stay bounded. A declared Content-Length is only compared with what
// is free at the header (a body that cannot fit now is refused unread); it
// reserves nothing, so a client that declares a large body and sends nothing
// holds nothing. Four rules keep strangers from holding that budget:
//   - the head check runs before any body is held (a server whose routes all
//     need a token refuses strangers there);
//   - requests that presented a credential (ServerOptions::holds_credential,
//     the fleet's bearer token) may use the whole budget, while the others
//     together stop at 1 - reserved_body_share of it;
//   - among those others, one client address holds at most its share: the
//     smaller of max_client_body_share and an equal split between the
//     addresses holding bodies now, so that more addresses get smaller shares;
//   - a body that trickles in is cut.
//
// Client disconnects: from the handler's first interest (a call to
// disconnected(), WaitDisconnected(), AbortOnDisconnect() or
// CancelOnDisconnect(), or BeginStream()) until it returns, the server keeps
// a read pending on the socket. End of stream or an error on it marks the
// exchange disconnected: disconnected() turns true, WaitDisconnected()
// returns, AbortOnDisconnect() fires, and operations run through
// CancelOnDisconnect() receive Asio terminal cancellation. A failed
// write and the server stopping do the same. A client that half-closes its
// side after sending the request counts as disconnected (the usual proxy
// convention). Quick handlers that never ask pay nothing for this.
#pragma once

#include <chrono>
#include <concepts>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>

#include "absl/container/flat_hash_map.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "stitch/net/http.h"

namespace stitch {

namespace net_internal {
class ServerConnection;
}

inline constexpr size_t kDefaultMaxBodyBytes = size_t{32} << 20;
inline constexpr size_t kDefaultMaxTotalBodyBytes = size_t{512} << 20;

// Looks at a request's method, target and headers (its body is empty: not
// read yet) when its header has arrived. An answer it returns is sent at
// once and the connection closed, the body unread and never held against
// the body budget; nullopt lets the request go on.
using HeadCheck = std::function<std::optional<HttpResponse>(const HttpRequest& head)>;

// A yes/no question about a request's head (method, target and headers).
using HeadPredicate = std::function<bool(const HttpRequest& head)>;

// Where engine, sidecar and gateway listen unless told otherwise: this
// machine only. A sidecar or gateway that other hosts reach is started with
// --host 0.0.0.0 (or one interface's address).
inline constexpr char kDefaultListenHost[] = "127.0.0.1";

struct ServerOptions {
  // Address to listen on: an IP literal or a name resolved once at start.
  std::string host = kDefaultListenHost;
  // 0 picks a free port; HttpServer::port() tells which.
  uint16_t port = 0;
  // Largest request body accepted (413 beyond). Long agentic contexts make
  // prompts of several MB normal (a million tokens sent as `input_ids` is
  // about 7 MB of JSON); 32 MiB leaves room for images and batches.
  size_t max_body_bytes = kDefaultMaxBodyBytes;
  // Request bodies held at once by all requests together (503 beyond; see
  // "Memory" above). A proxy holds about twice its bodies (the body and the
  // copy it sends on), so 512 MiB keeps that near 1 GiB while admitting 16
  // maximal requests, or hundreds of 1 MB prompts, at once. Raise it on a
  // gateway in front of a large fleet. REQUIRES: >= max_body_bytes.
  size_t max_total_body_bytes = kDefaultMaxTotalBodyBytes;
  // The share of the budget open to requests without a credential that the
  // requests of one client address may hold at once (503 beyond), so that
  // one client cannot take it all; it shrinks to an equal split when more
  // addresses hold bodies. A server behind a proxy sees the proxy as one
  // client: raise it there (1.0: no bound of its own). In (0, 1].
  double max_client_body_share = 0.5;
  // Whether a request presented a credential (a server closed with a token
  // asks whether it presented that token). Such requests are not bound by a
  // client's share and may use the whole budget; the others together stop
  // at 1 - reserved_body_share of it. When empty, no request has one and no
  // share is reserved. HoldsBearerToken (auth.h) makes the usual one.
  HeadPredicate holds_credential;
  double reserved_body_share = 0.25;  // in [0, 1)
  // Slow bodies: from `min_body_rate_grace` after a request's header, its
  // body must have arrived at this average rate or better, or the
  // connection is closed (the body is not waited for until body_timeout).
  // 0: no minimum.
  size_t min_body_bytes_per_second = size_t{64} << 10;
  std::chrono::milliseconds min_body_rate_grace = std::chrono::seconds(2);
  // See HeadCheck; none when empty. HttpRouter::TokenCheck() makes the one
  // that refuses requests without the bearer tokens the routes need.
  HeadCheck head_check;
  // Largest request header accepted (431 beyond).
  size_t max_header_bytes = size_t{64} << 10;
  // From the first byte of a request (or the accept) to its complete header.
  std::chrono::milliseconds header_timeout = std::chrono::seconds(30);
  // For reading a request body once its header arrived.
  std::chrono::milliseconds body_timeout = std::chrono::seconds(60);
  // How long a keep-alive connection may sit idle between requests.
  std::chrono::milliseconds idle_timeout = std::chrono::seconds(60);
  // For each write to the client (a response, a stream's header or chunk).
  // A client that stops reading for this long is treated as disconnected.
  std::chrono::milliseconds write_timeout = std::chrono::seconds(60);
  // Listen backlog.
  int backlog = 4096;
};

// One request and its response, handed to the handler. Owned by the server;
// valid until the handler coroutine returns. All methods must be called on the
// server's executor; at most one write (Respond, BeginStream, WriteChunk,
// EndStream) may be in progress at a time.
class HttpExchange {
 public:
  HttpExchange(const HttpExchange&) = delete;
  HttpExchange& operator=(const HttpExchange&) = delete;

  const HttpRequest& request() const { return request_; }
  // Mutable so a handler can move the body out instead of copying it.
  HttpRequest& request() { return request_; }
  // The client's address, "ip:port".
  const std::string& peer() const { return peer_; }

  // Sends a complete response. Framing headers in `response.headers` are
  // ignored except "Connection: close", which ends the connection after this
  // response. Errors: FailedPrecondition when a response was already started,
  // InvalidArgument (nothing sent) for a status outside 200..999 or a header
  // that would split the head (a name that is not a token, a value with CR,
  // LF or NUL), Unavailable when the write failed (the client is then
  // disconnected()).
  [[nodiscard]] boost::asio::awaitable<absl::Status> Respond(HttpResponse response);

  // Streaming: sends the status and headers at once (chunked transfer
  // encoding; plain body then close for HTTP/1.0 clients), then each
  // WriteChunk() goes out immediately, then EndStream() ends the body and
  // the connection may be reused. A handler that returns without EndStream()
  // gets its connection closed, so the client sees a truncated body. Same
  // errors as Respond(); an empty chunk is a no-op.
  [[nodiscard]] boost::asio::awaitable<absl::Status> BeginStream(int status, HttpHeaders headers);
  [[nodiscard]] boost::asio::awaitable<absl::Status> WriteChunk(std::string bytes);
  [[nodiscard]] boost::asio::awaitable<absl::Status> EndStream();

  // True once a response or a stream's header was sent.
  bool response_started() const { return state_ != State::kNone; }

  // True once the client is gone (end of stream or an error on its socket,
  // a failed write, or the server stopping). The first call starts watching
  // the socket, so it usually returns false; poll it or use the awaitables.
  bool disconnected() const;

  // Returns once disconnected() is true, or when the awaiting coroutine is
  // cancelled (so it composes with `||` from awaitable_operators).
  boost::asio::awaitable<void> WaitDisconnected();

  // An HttpCallAbort (http.h) that fires when the client disconnects, for
  // one HttpClient call at a time (CallOptions::abort): the lighter way for
  // a proxy to end its upstream call. Fired already when the client is gone.
  HttpCallAbort& AbortOnDisconnect();

  // Runs `op` and cancels it (Asio terminal cancellation, delivered to
  // whatever `op` is awaiting) when the client disconnects. Returns op's
  // result, or CancelledError when the client was already gone, or when the
  // cancellation made `op` throw instead of returning. Calls may be nested or
  // concurrent. Typical use in a proxy:
  //   auto upstream = co_await ex.CancelOnDisconnect(client.Send(origin, req));
  template <typename T>
  requires std::constructible_from<T, absl::Status> boost::asio::awaitable<T> CancelOnDisconnect(
      boost::asio::awaitable<T> op) {
    std::optional<T> result;
    co_await RunUntilDisconnected(StoreResult(std::move(op), &result));
    if (!result.has_value()) co_return T(absl::CancelledError("the client disconnected"));
    co_return std::move(*result);
  }

 private:
  friend class net_internal::ServerConnection;
  enum class State { kNone, kResponded, kStreaming, kStreamEnded };

  HttpExchange(net_internal::ServerConnection* connection, HttpRequest request, std::string peer,
               unsigned version, bool keep_alive);

  template <typename T>
  static boost::asio::awaitable<void> StoreResult(boost::asio::awaitable<T> op,
                                                  std::optional<T>* out) {
    out->emplace(co_await std::move(op));
  }
  boost::asio::awaitable<void> RunUntilDisconnected(boost::asio::awaitable<void> op);
  absl::Status CheckWritable(std::string_view what) const;

  net_internal::ServerConnection* connection_;
  HttpRequest request_;
  std::string peer_;
  unsigned version_;  // 10 or 11
  bool keep_alive_;   // the request allows reusing the connection
  bool close_after_ = false;
  bool writing_ = false;
  State state_ = State::kNone;
  HttpCallAbort disconnect_abort_;
};

// A request handler. It runs on the server's executor and must not block it:
// use RunBlocking (worker_pool.h) for blocking work. Exceptions it throws are
// caught: 500 when nothing was sent yet, otherwise the connection is closed.
using HttpHandler = std::function<boost::asio::awaitable<void>(HttpExchange&)>;

struct ServerStats {
  uint64_t connections_accepted = 0;
  uint64_t connections_active = 0;
  uint64_t requests = 0;
  uint64_t body_bytes_held = 0;                     // counted against max_total_body_bytes now
  uint64_t body_bytes_held_without_credential = 0;  // the part of it held by such requests
  uint64_t refused_over_budget = 0;  // 503s for passing max_total_body_bytes or a client's share
  uint64_t refused_at_head = 0;      // answers of the head check
  uint64_t slow_bodies_cut = 0;      // bodies under min_body_bytes_per_second
};

class PrometheusText;

// The stats that say how the body budget holds, on a /metrics page:
// request_body_bytes and request_body_bytes_without_token (gauges),
// overloaded_total and slow_bodies_cut_total (counters).
void WriteBodyBudgetMetrics(const ServerStats& stats, PrometheusText& text);

class HttpServer {
 public:
  // Binds and listens on options.host:options.port, then accepts on
  // `executor`, which must outlive the server. Errors: InvalidArgument for a host that does not
  // resolve or a body budget below the per-request limit, Unavailable when the address cannot be
  // bound (in use, not local). Thread-safe (may be called off the loop thread).
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<HttpServer>> Start(
      boost::asio::any_io_executor executor, ServerOptions options, HttpHandler handler);

  // Stop()s. Connections already accepted finish on the executor: they close
  // promptly, but a handler coroutine runs until it returns (it sees
  // disconnected()), so whatever handlers reference must outlive the
  // executor's last run, or the handlers must be drained first (Shutdown()).
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // The bound port.
  uint16_t port() const { return port_; }
  // "http://host:port" of the bound address.
  std::string url() const;

  // Closes the listener and every connection: pending reads and writes are
  // cancelled and every running exchange is marked disconnected. Returns at
  // once. Idempotent; thread-safe.
  void Stop();

  // Stop()s, then returns once every connection has ended and every handler
  // returned. Must be awaited on the server's executor.
  boost::asio::awaitable<void> Shutdown();

  // Counters, readable from any thread.
  ServerStats stats() const;

  struct State;

 private:
  HttpServer(std::shared_ptr<State> state, uint16_t port, std::string host)
      : state_(std::move(state)), port_(port), host_(std::move(host)) {}

  std::shared_ptr<State> state_;
  uint16_t port_;
  std::string host_;
};

// Raises this process's open-file limit (RLIMIT_NOFILE) to its hard limit,
// best effort: a server that relays requests holds two sockets for each, and
// thousands of them need more than the usual soft limit of 1024.
void RaiseOpenFileLimit();

// A tiny router: exact path (request target without its query) plus method.
// Unknown paths get 404 and known paths with another method 405 (with an
// Allow header), both with JSON error bodies, unless a fallback is set.
// A route (or the fallback) added with a bearer token answers a request that
// does not present it with 401 (auth.h); TokenCheck() gives the same answer
// at the header, before the body is read.
class HttpRouter {
 public:
  // `token`: what the route needs as "Authorization: Bearer <token>"; none
  // when empty.
  void Add(std::string method, std::string path, HttpHandler handler, std::string token = {});
  // Handles every request no route matches (instead of the 404 and 405).
  void SetFallback(HttpHandler handler, std::string token = {}) {
    fallback_ = std::move(handler);
    fallback_token_ = std::move(token);
  }

  boost::asio::awaitable<void> Dispatch(HttpExchange& exchange) const;

  // A handler for HttpServer::Start holding a copy of this router.
  HttpHandler AsHandler() const;
  // A ServerOptions::head_check holding a copy of this router's tokens: the
  // 401 for a request that lacks the token of the route it would reach.
  HeadCheck TokenCheck() const;

 private:
  struct Route {
    std::string method;
    HttpHandler handler;
    std::string token;
  };
  // The token the request needs ("" for none).
  const std::string& TokenFor(const HttpRequest& request) const;

  absl::flat_hash_map<std::string, std::vector<Route>> routes_;
  HttpHandler fallback_;
  std::string fallback_token_;
};

}  // namespace stitch

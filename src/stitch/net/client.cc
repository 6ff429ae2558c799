// Over ~600 lines on purpose: the connection pool and the ways to call
// through it (whole, streamed, fetched) share its connection handling.

#include "stitch/net/client.h"

#include <sys/socket.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <exception>
#include <vector>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/http/buffer_body.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/string_body.hpp>
#include <boost/beast/http/write.hpp>

#include "absl/container/flat_hash_map.h"
#include "absl/strings/str_cat.h"
#include "stitch/core/errors.h"
#include "stitch/net/asio_internal.h"
#include "stitch/net/wire.h"

namespace stitch {

namespace http = boost::beast::http;
using net_internal::Clock;
using net_internal::kAwait;
using net_internal::Tcp;

namespace net_internal {
namespace {

// Largest read of one HttpResponseStream::Read().
constexpr size_t kStreamReadSize = 16384;

bool IsIdempotent(std::string_view method) {
  return method == "GET" || method == "HEAD" || method == "PUT" || method == "DELETE" ||
         method == "OPTIONS" || method == "TRACE";
}

std::string HostHeader(const HttpOrigin& origin) {
  if (origin.host.find(':') != std::string::npos) {
    return absl::StrCat("[", origin.host, "]:", origin.port);
  }
  return absl::StrCat(origin.host, ":", origin.port);
}

// What a call is about, for error messages (built only on error).
struct CallInfo {
  const std::string& method;
  const HttpOrigin& origin;
  const std::string& target;

  std::string Describe() const { return absl::StrCat(method, " ", origin.ToString(), target); }
};

}  // namespace

struct ClientConnection {
  explicit ClientConnection(const boost::asio::any_io_executor& executor)
      : socket(executor), deadline(socket) {}
  ~ClientConnection() { DetachAbort(); }
  ClientConnection(const ClientConnection&) = delete;
  ClientConnection& operator=(const ClientConnection&) = delete;

  // Lets `a` close this connection while a call uses it; closes it now when
  // `a` already fired.
  void AttachAbort(HttpCallAbort* a) {
    if (a == nullptr) return;
    DetachAbort();
    abort = a;
    a->connection_ = this;
    if (a->aborted_) Close();
  }
  void DetachAbort() {
    if (abort != nullptr) abort->connection_ = nullptr;
    abort = nullptr;
  }
  void Close() {
    boost::system::error_code ec;
    socket.close(ec);
  }

  Tcp::socket socket;
  boost::beast::flat_buffer buffer;
  SocketDeadline deadline;  // after `socket`: it refers to it
  Clock::time_point idle_since;
  HttpCallAbort* abort = nullptr;  // of the call using the connection, if it has one
};

}  // namespace net_internal

HttpCallAbort::~HttpCallAbort() {
  if (connection_ != nullptr) connection_->abort = nullptr;
}

void HttpCallAbort::Abort() {
  aborted_ = true;
  if (connection_ != nullptr) connection_->Close();
}

namespace net_internal {

struct ClientPool {
  ClientPool(boost::asio::any_io_executor ex, ClientOptions opts)
      : executor(std::move(ex)), options(opts) {}

  std::unique_ptr<ClientConnection> TakeIdle(const std::string& key);
  void Release(const std::string& key, std::unique_ptr<ClientConnection> connection);

  boost::asio::any_io_executor executor;
  const ClientOptions options;
  absl::flat_hash_map<std::string, std::vector<std::unique_ptr<ClientConnection>>> idle;
  // Written on the loop thread; read anywhere.
  std::atomic<size_t> idle_count{0};
  std::atomic<uint64_t> opened{0};
};

namespace {

// True when an idle connection can still carry a request: the server has
// neither closed it nor sent anything unsolicited.
bool StillUsable(ClientConnection& connection) {
  if (!connection.socket.is_open() || connection.buffer.size() != 0) return false;
  char byte;
  ssize_t n = ::recv(connection.socket.native_handle(), &byte, 1, MSG_PEEK | MSG_DONTWAIT);
  return n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK);
}

}  // namespace

std::unique_ptr<ClientConnection> ClientPool::TakeIdle(const std::string& key) {
  auto it = idle.find(key);
  if (it == idle.end()) return nullptr;
  std::vector<std::unique_ptr<ClientConnection>>& stack = it->second;
  Clock::time_point now = Clock::now();
  while (!stack.empty()) {
    std::unique_ptr<ClientConnection> connection = std::move(stack.back());
    stack.pop_back();
    --idle_count;
    if (now - connection->idle_since <= options.idle_timeout && StillUsable(*connection)) {
      return connection;
    }
  }
  return nullptr;
}

void ClientPool::Release(const std::string& key, std::unique_ptr<ClientConnection> connection) {
  connection->DetachAbort();
  if (!connection->socket.is_open() || connection->buffer.size() != 0) return;
  std::vector<std::unique_ptr<ClientConnection>>& stack = idle[key];
  if (stack.size() >= options.max_idle_per_origin) return;
  connection->deadline.Cancel();
  connection->idle_since = Clock::now();
  stack.push_back(std::move(connection));
  ++idle_count;
}

namespace {

absl::Status TransportError(const CallInfo& call, std::string_view phase,
                            const boost::system::error_code& ec) {
  if (ec == http::error::body_limit) {
    return absl::ResourceExhaustedError(
        absl::StrCat(call.Describe(), ": the response body exceeds the client's limit"));
  }
  if (ec.category() == http::make_error_code(http::error::bad_method).category() &&
      ec != http::error::end_of_stream && ec != http::error::partial_message) {
    return absl::UnavailableError(
        absl::StrCat(call.Describe(), ": malformed response (", ec.message(), ")"));
  }
  return absl::UnavailableError(absl::StrCat(call.Describe(), ": ", AbslView(phase), " failed: ",
                                             ec.message(), "; is the server up and reachable?"));
}

// True when `abort` fired.
bool Aborted(const HttpCallAbort* abort) { return abort != nullptr && abort->aborted(); }

absl::Status AbortedError(const CallInfo& call) {
  return absl::CancelledError(absl::StrCat(call.Describe(), ": aborted"));
}

// The status for a failed operation: an abort or a cancellation first, then
// the deadline.
boost::asio::awaitable<absl::Status> FailedCall(const CallInfo& call, std::string_view phase,
                                                const boost::system::error_code& ec,
                                                const SocketDeadline& deadline,
                                                std::chrono::milliseconds timeout,
                                                const HttpCallAbort* abort) {
  if (Aborted(abort)) co_return AbortedError(call);
  auto cancellation = co_await boost::asio::this_coro::cancellation_state;
  if (cancellation.cancelled() != boost::asio::cancellation_type::none) {
    co_return absl::CancelledError(absl::StrCat(call.Describe(), ": cancelled"));
  }
  if (deadline.expired()) {
    co_return absl::DeadlineExceededError(absl::StrCat(
        call.Describe(), ": no response within ", timeout.count(), " ms (", AbslView(phase), ")"));
  }
  co_return TransportError(call, phase, ec);
}

boost::asio::awaitable<absl::StatusOr<std::unique_ptr<ClientConnection>>> Connect(
    ClientPool& pool, const CallInfo& call, Clock::time_point call_deadline,
    std::chrono::milliseconds call_timeout, HttpCallAbort* abort) {
  auto connection = std::make_unique<ClientConnection>(pool.executor);
  connection->AttachAbort(abort);
  Clock::time_point connect_deadline =
      std::min(call_deadline, Clock::now() + pool.options.connect_timeout);
  std::vector<Tcp::endpoint> endpoints;
  boost::system::error_code ec;
  boost::asio::ip::address address = boost::asio::ip::make_address(call.origin.host, ec);
  if (!ec) {
    endpoints.emplace_back(address, call.origin.port);
  } else {
    Tcp::resolver resolver(pool.executor);
    auto [resolve_ec, results] =
        co_await resolver.async_resolve(call.origin.host, std::to_string(call.origin.port), kAwait);
    if (resolve_ec || results.empty()) {
      co_return absl::UnavailableError(absl::StrCat(call.Describe(), ": cannot resolve host \"",
                                                    call.origin.host,
                                                    "\": ", resolve_ec.message()));
    }
    for (const auto& entry : results) endpoints.push_back(entry.endpoint());
  }
  for (const Tcp::endpoint& endpoint : endpoints) {
    if (Aborted(abort)) co_return AbortedError(call);
    connection->socket.close(ec);
    connection->socket.open(endpoint.protocol(), ec);
    if (ec) continue;
    connection->deadline.ArmAt(connect_deadline);
    auto [connect_ec] = co_await connection->socket.async_connect(endpoint, kAwait);
    connection->deadline.Disarm();
    ec = connect_ec;
    if (!ec || connection->deadline.expired()) break;
    auto cancellation = co_await boost::asio::this_coro::cancellation_state;
    if (cancellation.cancelled() != boost::asio::cancellation_type::none) break;
  }
  if (ec) {
    if (Aborted(abort)) co_return AbortedError(call);
    auto cancellation = co_await boost::asio::this_coro::cancellation_state;
    if (cancellation.cancelled() != boost::asio::cancellation_type::none) {
      co_return absl::CancelledError(absl::StrCat(call.Describe(), ": cancelled"));
    }
    if (connection->deadline.expired()) {
      if (connect_deadline == call_deadline) {
        co_return absl::DeadlineExceededError(absl::StrCat(call.Describe(), ": no response within ",
                                                           call_timeout.count(), " ms (connect)"));
      }
      co_return absl::UnavailableError(absl::StrCat(call.Describe(), ": connect timed out after ",
                                                    pool.options.connect_timeout.count(),
                                                    " ms; is the server reachable?"));
    }
    co_return TransportError(call, "connect", ec);
  }
  connection->socket.set_option(Tcp::no_delay(true), ec);
  ++pool.opened;
  co_return std::move(connection);
}

// A request ready to send (and to send again on a fresh connection).
struct WireRequest {
  std::string head;
  std::string body;
  bool head_method = false;  // HEAD: the response carries no body
};

template <typename Body>
struct StartedCall {
  std::unique_ptr<ClientConnection> connection;
  std::unique_ptr<http::response_parser<Body>> parser;
};

// Connects (or reuses), writes the request and reads the response header,
// retrying once under the rule in client.h.
template <typename Body>
boost::asio::awaitable<absl::StatusOr<StartedCall<Body>>> StartCall(
    ClientPool& pool, const CallInfo& call, const std::string& key, const WireRequest& request,
    Clock::time_point deadline, std::chrono::milliseconds timeout,
    std::optional<uint64_t> body_limit, HttpCallAbort* abort) {
  for (int attempt = 0;; ++attempt) {
    if (Aborted(abort)) co_return AbortedError(call);
    std::unique_ptr<ClientConnection> connection = attempt == 0 ? pool.TakeIdle(key) : nullptr;
    const bool reused = connection != nullptr;
    if (!reused) {
      auto connected = co_await Connect(pool, call, deadline, timeout, abort);
      if (!connected.ok()) co_return connected.status();
      connection = std::move(*connected);
    } else {
      connection->AttachAbort(abort);
    }
    connection->deadline.ArmAt(deadline);
    const std::array<boost::asio::const_buffer, 2> message{boost::asio::buffer(request.head),
                                                           boost::asio::buffer(request.body)};
    auto [write_ec, written] =
        co_await boost::asio::async_write(connection->socket, message, kAwait);
    if (write_ec) {
      // A dead idle connection: the request never reached a server.
      if (reused && !connection->deadline.expired()) {
        auto cancellation = co_await boost::asio::this_coro::cancellation_state;
        if (cancellation.cancelled() == boost::asio::cancellation_type::none) continue;
      }
      co_return co_await FailedCall(call, "sending the request", write_ec, connection->deadline,
                                    timeout, abort);
    }
    auto parser = std::make_unique<http::response_parser<Body>>();
    parser->header_limit(static_cast<uint32_t>(std::min<size_t>(
        pool.options.max_response_header_bytes, std::numeric_limits<uint32_t>::max())));
    parser->body_limit(body_limit ? boost::optional<uint64_t>(*body_limit) : boost::none);
    if (request.head_method) parser->skip(true);
    auto [read_ec, read] =
        co_await http::async_read_header(connection->socket, connection->buffer, *parser, kAwait);
    if (read_ec) {
      const bool nothing_received = !parser->got_some() && connection->buffer.size() == 0;
      if (reused && nothing_received && IsIdempotent(call.method) &&
          !connection->deadline.expired()) {
        auto cancellation = co_await boost::asio::this_coro::cancellation_state;
        if (cancellation.cancelled() == boost::asio::cancellation_type::none) continue;
      }
      co_return co_await FailedCall(call, "reading the response", read_ec, connection->deadline,
                                    timeout, abort);
    }
    co_return StartedCall<Body>{std::move(connection), std::move(parser)};
  }
}

// The request as it goes on the wire (moves the body out of `request`).
absl::StatusOr<WireRequest> BuildRequest(std::string_view host, HttpRequest& request) {
  WireRequest wire;
  if (absl::Status s = FormatRequestHead(request.method, request.target, request.headers, host,
                                         request.body.size(), wire.head);
      !s.ok()) {
    return s;
  }
  wire.body = std::move(request.body);
  wire.head_method = request.method == "HEAD";
  return wire;
}

HttpHeaders ToHeaders(const http::fields& fields) {
  HttpHeaders headers;
  for (const auto& field : fields) headers.Add(field.name_string(), field.value());
  return headers;
}

std::string PoolKey(const HttpOrigin& origin) { return HostHeader(origin); }

}  // namespace

// The coroutine bodies behind HttpClient. They may throw when the awaiting
// coroutine was cancelled (Asio's throw_if_cancelled); the public wrappers
// turn that into a status.
boost::asio::awaitable<absl::StatusOr<HttpResponse>> DoSend(std::shared_ptr<ClientPool> pool,
                                                            HttpOrigin origin, HttpRequest request,
                                                            CallOptions options) {
  const CallInfo call{request.method, origin, request.target};
  std::string key = PoolKey(origin);
  auto built = BuildRequest(key, request);
  if (!built.ok()) co_return built.status();
  std::chrono::milliseconds timeout = options.timeout.value_or(pool->options.request_timeout);
  Clock::time_point deadline = Clock::now() + timeout;
  auto started =
      co_await StartCall<http::string_body>(*pool, call, key, *built, deadline, timeout,
                                            pool->options.max_response_body_bytes, options.abort);
  if (!started.ok()) co_return started.status();
  ClientConnection& connection = *started->connection;
  http::response_parser<http::string_body>& parser = *started->parser;
  if (!parser.is_done()) {
    connection.deadline.ArmAt(deadline);
    auto [ec, n] = co_await http::async_read(connection.socket, connection.buffer, parser, kAwait);
    if (ec) {
      co_return co_await FailedCall(call, "reading the response body", ec, connection.deadline,
                                    timeout, options.abort);
    }
  }
  connection.deadline.Disarm();
  http::response<http::string_body> message = parser.release();
  HttpResponse response;
  response.status = static_cast<int>(message.result_int());
  response.headers = ToHeaders(message.base());
  response.body = std::move(message.body());
  if (message.keep_alive()) pool->Release(key, std::move(started->connection));
  co_return response;
}

}  // namespace net_internal

using net_internal::ClientConnection;
using net_internal::ClientPool;

namespace {

absl::Status StatusFromException(const std::exception_ptr& error, std::string_view what) {
  try {
    std::rethrow_exception(error);
  } catch (const boost::system::system_error& e) {
    if (e.code() == boost::asio::error::operation_aborted) {
      return absl::CancelledError(absl::StrCat(AbslView(what), ": cancelled"));
    }
    return absl::UnavailableError(absl::StrCat(AbslView(what), ": ", e.what()));
  } catch (const std::exception& e) {
    return absl::InternalError(absl::StrCat(AbslView(what), ": ", e.what()));
  }
}

}  // namespace

// ---------------------------------------------------------------------------
// HttpResponseStream

struct HttpResponseStream::Impl {
  std::weak_ptr<ClientPool> pool;
  std::string key;
  std::string description;  // "METHOD URL", for errors
  std::unique_ptr<ClientConnection> connection;
  std::unique_ptr<http::response_parser<http::buffer_body>> parser;
  int status = 0;
  HttpHeaders headers;
  std::chrono::milliseconds idle_timeout{0};
  size_t body_limit = 0;
  std::vector<char> scratch;
  bool finished = false;

  // The body ended: give the connection back when it can carry another call.
  void Finish() {
    finished = true;
    if (!connection) return;
    std::shared_ptr<ClientPool> p = pool.lock();
    if (p && parser->get().keep_alive()) p->Release(key, std::move(connection));
    connection.reset();
  }
  void Close() {
    finished = true;
    connection.reset();
  }
};

HttpResponseStream::HttpResponseStream(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
HttpResponseStream::HttpResponseStream(HttpResponseStream&&) noexcept = default;
HttpResponseStream& HttpResponseStream::operator=(HttpResponseStream&&) noexcept = default;
HttpResponseStream::~HttpResponseStream() = default;

int HttpResponseStream::status() const { return impl_->status; }
const HttpHeaders& HttpResponseStream::headers() const { return impl_->headers; }
bool HttpResponseStream::finished() const { return impl_->finished; }
void HttpResponseStream::Close() { impl_->Close(); }

boost::asio::awaitable<absl::StatusOr<std::string>> HttpResponseStream::Read() {
  Impl& s = *impl_;
  if (s.finished) co_return std::string();
  ClientConnection& connection = *s.connection;
  http::response_parser<http::buffer_body>& parser = *s.parser;
  std::exception_ptr error;
  try {
    for (;;) {
      parser.get().body().data = s.scratch.data();
      parser.get().body().size = s.scratch.size();
      if (s.idle_timeout.count() > 0) connection.deadline.ArmAfter(s.idle_timeout);
      auto [ec, n] =
          co_await http::async_read_some(connection.socket, connection.buffer, parser, kAwait);
      connection.deadline.Disarm();
      if (ec == http::error::need_buffer) ec = {};
      if (ec) {
        auto cancellation = co_await boost::asio::this_coro::cancellation_state;
        absl::Status status;
        if (net_internal::Aborted(connection.abort)) {
          status = absl::CancelledError(absl::StrCat(s.description, ": aborted"));
        } else if (cancellation.cancelled() != boost::asio::cancellation_type::none) {
          status = absl::CancelledError(absl::StrCat(s.description, ": cancelled"));
        } else if (connection.deadline.expired()) {
          status = absl::DeadlineExceededError(absl::StrCat(
              s.description, ": no body bytes within ", s.idle_timeout.count(), " ms"));
        } else {
          status = absl::UnavailableError(
              absl::StrCat(s.description, ": reading the response body failed: ", ec.message()));
        }
        s.Close();
        co_return status;
      }
      size_t got = s.scratch.size() - parser.get().body().size;
      if (parser.is_done()) s.Finish();
      if (got > 0) co_return std::string(s.scratch.data(), got);
      if (s.finished) co_return std::string();
    }
  } catch (...) {
    error = std::current_exception();
  }
  s.Close();
  co_return StatusFromException(error, s.description);
}

boost::asio::awaitable<absl::StatusOr<std::string>> HttpResponseStream::ReadAll() {
  std::string body;
  for (;;) {
    absl::StatusOr<std::string> chunk = co_await Read();
    if (!chunk.ok()) co_return chunk.status();
    if (chunk->empty()) co_return body;
    if (body.size() + chunk->size() > impl_->body_limit) {
      impl_->Close();
      co_return absl::ResourceExhaustedError(
          absl::StrCat(impl_->description, ": the response body exceeds the client's limit of ",
                       impl_->body_limit, " bytes"));
    }
    body.append(*chunk);
  }
}

// ---------------------------------------------------------------------------
// HttpClient

HttpClient::HttpClient(boost::asio::any_io_executor executor, ClientOptions options)
    : pool_(std::make_shared<ClientPool>(std::move(executor), options)) {}

HttpClient::~HttpClient() {
  // The pool belongs to the loop thread: close the idle connections there.
  boost::asio::dispatch(pool_->executor, [pool = pool_] {
    pool->idle.clear();
    pool->idle_count = 0;
  });
}

size_t HttpClient::idle_connections() const { return pool_->idle_count.load(); }
uint64_t HttpClient::connections_opened() const { return pool_->opened.load(); }

boost::asio::awaitable<absl::StatusOr<HttpResponse>> HttpClient::Send(HttpOrigin origin,
                                                                      HttpRequest request,
                                                                      CallOptions options) {
  // For the message of a cancellation; built only then.
  const HttpOrigin where = origin;
  const std::string method = request.method;
  const std::string target = request.target;
  std::exception_ptr error;
  try {
    co_return co_await net_internal::DoSend(pool_, std::move(origin), std::move(request), options);
  } catch (...) {
    error = std::current_exception();
  }
  co_return StatusFromException(error, absl::StrCat(method, " ", where.ToString(), target));
}

namespace net_internal {

boost::asio::awaitable<absl::StatusOr<std::unique_ptr<HttpResponseStream::Impl>>> DoSendStreamed(
    std::shared_ptr<ClientPool> pool, HttpOrigin origin, HttpRequest request, CallOptions options) {
  const CallInfo call{request.method, origin, request.target};
  std::string key = PoolKey(origin);
  auto built = BuildRequest(key, request);
  if (!built.ok()) co_return built.status();
  std::chrono::milliseconds timeout = options.timeout.value_or(pool->options.request_timeout);
  Clock::time_point deadline = Clock::now() + timeout;
  // The connection stays attached to options.abort until the stream ends.
  auto started = co_await StartCall<http::buffer_body>(*pool, call, key, *built, deadline, timeout,
                                                       std::nullopt, options.abort);
  if (!started.ok()) co_return started.status();
  started->connection->deadline.Disarm();
  auto stream = std::make_unique<HttpResponseStream::Impl>();
  stream->pool = pool;
  stream->key = std::move(key);
  stream->description = call.Describe();
  stream->status = static_cast<int>(started->parser->get().result_int());
  stream->headers = ToHeaders(started->parser->get().base());
  stream->idle_timeout = options.stream_idle_timeout.value_or(pool->options.stream_idle_timeout);
  stream->body_limit = pool->options.max_response_body_bytes;
  stream->scratch.resize(kStreamReadSize);
  stream->connection = std::move(started->connection);
  stream->parser = std::move(started->parser);
  if (stream->parser->is_done()) stream->Finish();
  co_return std::move(stream);
}

}  // namespace net_internal

boost::asio::awaitable<absl::StatusOr<HttpResponseStream>> HttpClient::SendStreamed(
    HttpOrigin origin, HttpRequest request, CallOptions options) {
  std::string description = absl::StrCat(request.method, " ", origin.ToString(), request.target);
  std::exception_ptr error;
  try {
    auto impl = co_await net_internal::DoSendStreamed(pool_, std::move(origin), std::move(request),
                                                      options);
    if (!impl.ok()) co_return impl.status();
    co_return HttpResponseStream(std::move(*impl));
  } catch (...) {
    error = std::current_exception();
  }
  co_return StatusFromException(error, description);
}

boost::asio::awaitable<absl::StatusOr<HttpResponse>> HttpClient::Fetch(std::string method,
                                                                       std::string url,
                                                                       std::string body,
                                                                       CallOptions options) {
  absl::StatusOr<HttpUrl> parsed = ParseHttpUrl(url);
  if (!parsed.ok()) co_return parsed.status();
  HttpRequest request;
  request.method = std::move(method);
  request.target = std::move(parsed->target);
  if (!body.empty()) request.headers.Add("Content-Type", "application/json");
  request.body = std::move(body);
  co_return co_await Send(std::move(parsed->origin), std::move(request), options);
}

absl::StatusOr<HttpResponse> HttpFetch(std::string_view method, std::string_view url,
                                       std::string body, const FetchOptions& options) {
  absl::StatusOr<HttpUrl> parsed = ParseHttpUrl(url);
  if (!parsed.ok()) return parsed.status();
  HttpRequest request;
  request.method = std::string(method);
  request.target = std::move(parsed->target);
  request.headers = options.headers;
  if (!body.empty() && !request.headers.Has("Content-Type")) {
    request.headers.Add("Content-Type", "application/json");
  }
  request.body = std::move(body);

  boost::asio::io_context io(1);
  ClientOptions client_options;
  client_options.connect_timeout = options.timeout;
  client_options.request_timeout = options.timeout;
  absl::StatusOr<HttpResponse> result = absl::InternalError("HttpFetch did not run");
  {
    HttpClient client(io.get_executor(), client_options);
    boost::asio::co_spawn(
        io,
        [&]() -> boost::asio::awaitable<void> {
          result = co_await client.Send(parsed->origin, std::move(request));
        },
        boost::asio::detached);
    io.run();
  }
  return result;
}

absl::Status HttpFetchStreamed(
    std::string_view url, const StreamedFetchOptions& options,
    const std::function<absl::Status(int status, const HttpHeaders& headers)>& on_header,
    const std::function<absl::Status(std::string_view bytes)>& on_body) {
  absl::StatusOr<HttpUrl> parsed = ParseHttpUrl(url);
  if (!parsed.ok()) return parsed.status();
  HttpRequest request;
  request.target = std::move(parsed->target);
  request.headers = options.headers;

  boost::asio::io_context io(1);
  ClientOptions client_options;
  client_options.connect_timeout = options.connect_timeout;
  client_options.request_timeout = options.timeout;
  client_options.stream_idle_timeout = options.stall_timeout;
  absl::Status result = absl::InternalError("HttpFetchStreamed did not run");
  HttpCallAbort abort;
  // The whole call's deadline: the client's own timeouts bound the header
  // and each wait for bytes, not a body that trickles.
  bool expired = false;
  boost::asio::steady_timer deadline(io, options.timeout);
  deadline.async_wait([&](boost::system::error_code ec) {
    if (ec) return;
    expired = true;
    abort.Abort();
  });
  {
    HttpClient client(io.get_executor(), client_options);
    boost::asio::co_spawn(
        io,
        [&]() -> boost::asio::awaitable<void> {
          CallOptions call;
          call.abort = &abort;
          absl::StatusOr<HttpResponseStream> stream =
              co_await client.SendStreamed(parsed->origin, std::move(request), call);
          if (!stream.ok()) {
            result = stream.status();
          } else if (absl::Status s = on_header(stream->status(), stream->headers()); !s.ok()) {
            stream->Close();
            result = s;
          } else {
            result = absl::OkStatus();
            while (true) {
              absl::StatusOr<std::string> bytes = co_await stream->Read();
              if (!bytes.ok()) {
                result = bytes.status();
                break;
              }
              if (bytes->empty()) break;
              if (absl::Status s = on_body(*bytes); !s.ok()) {
                stream->Close();
                result = s;
                break;
              }
            }
          }
          deadline.cancel();
        },
        boost::asio::detached);
    io.run();
  }
  if (expired && !result.ok()) {
    return absl::DeadlineExceededError(absl::StrCat(
        "GET ", AbslView(url), ": no complete answer within ", options.timeout.count(), " ms"));
  }
  return result;
}

}  // namespace stitch

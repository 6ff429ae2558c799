// Over ~600 lines on purpose: one connection's life (ServerConnection:
// read a head, judge it, hold a body within the budgets, dispatch, write,
// keep alive or close) is one state machine whose parts share its state.

#include "stitch/net/server.h"

#include <sys/resource.h>

#include <algorithm>
#include <array>
#include <exception>

#include <boost/asio/bind_cancellation_slot.hpp>
#include <boost/asio/cancellation_signal.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core/flat_buffer.hpp>
#include <boost/beast/core/string.hpp>
#include <boost/beast/http/chunk_encode.hpp>
#include <boost/beast/http/error.hpp>
#include <boost/beast/http/parser.hpp>
#include <boost/beast/http/read.hpp>
#include <boost/beast/http/string_body.hpp>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "stitch/core/errors.h"
#include "stitch/net/asio_internal.h"
#include "stitch/net/auth.h"
#include "stitch/net/prometheus.h"
#include "stitch/net/wire.h"

namespace stitch {

namespace http = boost::beast::http;
using net_internal::Clock;
using net_internal::kAwait;
using net_internal::LoopEvent;
using net_internal::Tcp;

struct HttpServer::State {
  State(boost::asio::any_io_executor ex, ServerOptions opts, HttpHandler h)
      : executor(std::move(ex)),
        options(std::move(opts)),
        handler(std::move(h)),
        acceptor(executor),
        drained(executor) {}

  void StopOnLoop();

  boost::asio::any_io_executor executor;
  const ServerOptions options;
  const HttpHandler handler;
  Tcp::acceptor acceptor;
  // Loop thread only.
  bool stopped = false;
  absl::flat_hash_set<net_internal::ServerConnection*> connections;
  LoopEvent drained;  // set once stopped and every connection has ended
  // Any thread.
  std::atomic<uint64_t> accepted{0};
  std::atomic<uint64_t> active{0};
  std::atomic<uint64_t> requests{0};
  // Written on the loop thread only; atomic so that stats() may read them.
  std::atomic<uint64_t> body_bytes_held{0};
  std::atomic<uint64_t> held_without_credential{0};
  std::atomic<uint64_t> over_budget{0};
  std::atomic<uint64_t> refused_at_head{0};
  std::atomic<uint64_t> slow_bodies_cut{0};
  // Body bytes held per client address by requests without a credential
  // (loop thread only; no zero entries).
  absl::flat_hash_map<std::string, uint64_t> held_by_client;
};

namespace net_internal {
namespace {

// While a handler runs, the disconnect monitor reads at most this much
// pipelined data ahead; beyond it the connection is no longer watched.
constexpr size_t kMonitorReadSize = 4096;
// The first read of a request.
constexpr size_t kFirstReadSize = 8192;
// After an error answer, unread request bytes are drained for at most this
// long and this much, so that closing does not reset the connection before
// the client has read the answer.
constexpr auto kLingerTime = std::chrono::seconds(2);
constexpr size_t kLingerBytes = size_t{1} << 20;

bool IsParseError(const boost::system::error_code& ec) {
  return ec.category() == http::make_error_code(http::error::bad_method).category() &&
         ec != http::error::end_of_stream && ec != http::error::partial_message;
}

}  // namespace

// One accepted connection. Lives on the frame of its serving coroutine.
class ServerConnection {
 public:
  ServerConnection(std::shared_ptr<HttpServer::State> server, Tcp::socket socket)
      : server_(std::move(server)),
        options_(server_->options),
        socket_(std::move(socket)),
        deadline_(socket_),
        monitor_done_(socket_.get_executor()),
        disconnect_event_(socket_.get_executor()) {
    server_->connections.insert(this);
    boost::system::error_code ec;
    socket_.set_option(Tcp::no_delay(true), ec);
    Tcp::endpoint remote = socket_.remote_endpoint(ec);
    if (!ec) {
      client_ = remote.address().to_string();
      peer_ = absl::StrCat(client_, ":", remote.port());
    }
  }
  ~ServerConnection() {
    ReleaseBody();
    server_->connections.erase(this);
    boost::system::error_code ec;
    socket_.close(ec);
  }
  ServerConnection(const ServerConnection&) = delete;
  ServerConnection& operator=(const ServerConnection&) = delete;

  boost::asio::awaitable<void> Run() {
    try {
      co_await Serve();
    } catch (const std::exception&) {
      // Only an impossible state gets here (every I/O error is a value):
      // dropping the connection is the safe answer.
    }
    boost::system::error_code ec;
    socket_.shutdown(Tcp::socket::shutdown_both, ec);
    socket_.close(ec);
  }

  // The server is stopping: cancel everything and close.
  void Stop() {
    stopping_ = true;
    MarkDisconnected();
    boost::system::error_code ec;
    socket_.shutdown(Tcp::socket::shutdown_both, ec);
    socket_.close(ec);
  }

 private:
  friend class stitch::HttpExchange;

  boost::asio::awaitable<void> Serve() {
    bool first = true;
    while (!stopping_) {
      if (buffer_.size() == 0 && monitor_active_) {
        // The last handler's disconnect monitor is still reading: its read
        // is the wait for the next request.
        deadline_.ArmAfter(options_.idle_timeout);
        co_await monitor_done_.Wait();
        if (buffer_.size() == 0 || stopping_) co_return;
      } else if (buffer_.size() == 0) {
        // Waiting for the next request is a plain read (not a readiness
        // wait), so a request that is already there costs one recv.
        deadline_.ArmAfter(first ? options_.header_timeout : options_.idle_timeout);
        auto [ec, n] = co_await socket_.async_read_some(buffer_.prepare(kFirstReadSize), kAwait);
        buffer_.commit(n);
        if (ec || stopping_) co_return;
      }
      first = false;
      parser_.emplace();
      parser_->header_limit(static_cast<uint32_t>(
          std::min<size_t>(options_.max_header_bytes, std::numeric_limits<uint32_t>::max())));
      parser_->body_limit(options_.max_body_bytes);
      deadline_.ArmAfter(options_.header_timeout);
      auto [ec, n] = co_await http::async_read_header(socket_, buffer_, *parser_, kAwait);
      if (ec) {
        co_await Reject(ec);
        co_return;
      }
      if (std::optional<std::string> refusal = RefuseHead(parser_->get()); refusal.has_value()) {
        HttpResponse answer = JsonResponse(400, JsonErrorBody("BadRequest", *refusal));
        co_await AnswerAndClose(std::move(answer));
        co_return;
      }
      head_ = ReadHead(parser_->get());
      if (options_.head_check) {
        if (std::optional<HttpResponse> answer = options_.head_check(head_); answer.has_value()) {
          server_->refused_at_head.fetch_add(1, std::memory_order_relaxed);
          co_await AnswerAndClose(*std::move(answer));
          co_return;
        }
      }
      credential_ = options_.holds_credential && options_.holds_credential(head_);
      if (!parser_->is_done()) {
        // A body is held as it arrives (below); a declared length that
        // cannot fit now is refused before any of it is read.
        std::optional<uint64_t> length;
        if (const auto declared = parser_->content_length(); declared) length = *declared;
        if (length.has_value() && !FitsNow(*length)) {
          co_await RefuseOverBudget(length);
          co_return;
        }
        if (boost::beast::iequals(parser_->get()[http::field::expect], "100-continue")) {
          static constexpr std::string_view kContinue = "HTTP/1.1 100 Continue\r\n\r\n";
          auto status = co_await TimedWrite(
              [&] {
                return boost::asio::async_write(socket_, boost::asio::buffer(kContinue), kAwait);
              },
              "100 Continue");
          if (!status.ok()) co_return;
        }
        const Clock::time_point body_start = Clock::now();
        const Clock::time_point body_end = body_start + options_.body_timeout;
        while (!parser_->is_done()) {
          const size_t before = parser_->get().body().size();
          deadline_.ArmAt(std::min(body_end, NextBodyByteDue(body_start, before)));
          auto [body_ec, body_n] =
              co_await http::async_read_some(socket_, buffer_, *parser_, kAwait);
          if (body_ec) {
            if (deadline_.expired() && Clock::now() < body_end) {
              server_->slow_bodies_cut.fetch_add(1, std::memory_order_relaxed);
            }
            co_await Reject(body_ec);
            co_return;
          }
          const size_t size = parser_->get().body().size();
          if (size > held_body_ && !HoldBody(size - held_body_)) {
            co_await RefuseOverBudget(length);
            co_return;
          }
        }
      }
      deadline_.Disarm();
      const bool keep_alive = co_await Handle();
      ReleaseBody();
      if (!keep_alive) co_return;
    }
  }

  // Why the request whose header is `head` is refused (400), if it is: only
  // origin-form targets ("/path?query") are served, so that a handler never
  // passes a proxy's target (CONNECT's authority, OPTIONS *, an absolute
  // URL) to a server behind it; and one Authorization header at most, since
  // with two the first would decide here and another hop might read the
  // other.
  static std::optional<std::string> RefuseHead(const http::request<http::string_body>& head) {
    const std::string_view target(head.target().data(), head.target().size());
    if (head.method() == http::verb::connect) {
      return "CONNECT is not served: this server is not a tunnelling proxy";
    }
    if (head.count(http::field::authorization) > 1) {
      return "the request has more than one Authorization header; send one";
    }
    if (target.empty() || target.front() != '/') {
      constexpr size_t kMaxShown = 200;
      return absl::StrCat("request target \"", AbslView(target.substr(0, kMaxShown)),
                          target.size() > kMaxShown ? "..." : "",
                          "\" is not a path; send origin-form targets such as /generate (no "
                          "OPTIONS *, no absolute URLs)");
    }
    return std::nullopt;
  }

  // The request's method, target and headers, as handlers and the head
  // check see them; the body follows in Handle().
  static HttpRequest ReadHead(const http::request<http::string_body>& msg) {
    HttpRequest request;
    request.method = std::string(msg.method_string());
    request.target = std::string(msg.target());
    for (const auto& field : msg) request.headers.Add(field.name_string(), field.value());
    return request;
  }

  // When the body's next byte is due: once the grace is over, the body read
  // so far (`received` bytes) must keep up with the minimum rate.
  Clock::time_point NextBodyByteDue(Clock::time_point body_start, size_t received) const {
    if (options_.min_body_bytes_per_second == 0) return Clock::time_point::max();
    const double seconds =
        static_cast<double>(received) / static_cast<double>(options_.min_body_bytes_per_second);
    return body_start + options_.min_body_rate_grace +
           std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(seconds));
  }

  // What this request may hold in all, as the budgets stand now: within the
  // server's budget; without a credential, also within the part open to
  // such requests and the client's share of it.
  uint64_t Limit() const {
    const uint64_t total = options_.max_total_body_bytes;
    const uint64_t held = server_->body_bytes_held.load(std::memory_order_relaxed);
    uint64_t limit = total - std::min(total, held - std::min(held, held_body_));
    if (credential_) return limit;
    const double reserved =
        options_.holds_credential ? std::clamp(options_.reserved_body_share, 0.0, 1.0) : 0.0;
    const auto open = static_cast<uint64_t>((1.0 - reserved) * static_cast<double>(total));
    const uint64_t others_open = server_->held_without_credential.load(std::memory_order_relaxed);
    limit = std::min(limit, open - std::min(open, others_open - std::min(others_open, held_body_)));
    const double share = std::clamp(options_.max_client_body_share, 0.0, 1.0);
    if (share >= 1.0) return limit;
    // Every address holding a body now, this one included, gets an equal
    // split of the open part at most.
    const uint64_t here = ClientHeld();
    const size_t clients = server_->held_by_client.size() + (here == 0 ? 1 : 0);
    auto client_limit = static_cast<uint64_t>(std::min(share, 1.0 / static_cast<double>(clients)) *
                                              static_cast<double>(open));
    // A lone client may always send one body of the largest size accepted.
    if (clients == 1) client_limit = std::max<uint64_t>(client_limit, options_.max_body_bytes);
    const uint64_t by_others_here = here - std::min(here, held_body_);
    return std::min(limit, client_limit - std::min(client_limit, by_others_here));
  }

  // Whether a body of `bytes` in all would fit now (counts nothing).
  bool FitsNow(uint64_t bytes) const { return bytes <= Limit(); }

  // Counts `bytes` more of this request's body against the budgets (see
  // Limit); false (nothing counted) when they would pass one.
  bool HoldBody(uint64_t bytes) {
    if (held_body_ + bytes > Limit()) return false;
    server_->body_bytes_held.fetch_add(bytes, std::memory_order_relaxed);
    if (!credential_) {
      server_->held_without_credential.fetch_add(bytes, std::memory_order_relaxed);
      server_->held_by_client[client_] += bytes;
    }
    held_body_ += bytes;
    return true;
  }

  uint64_t ClientHeld() const {
    auto it = server_->held_by_client.find(client_);
    return it == server_->held_by_client.end() ? 0 : it->second;
  }

  void ReleaseBody() {
    if (held_body_ == 0) return;
    server_->body_bytes_held.fetch_sub(held_body_, std::memory_order_relaxed);
    if (!credential_) {
      server_->held_without_credential.fetch_sub(held_body_, std::memory_order_relaxed);
      auto it = server_->held_by_client.find(client_);
      if (it != server_->held_by_client.end()) {
        it->second -= std::min(it->second, held_body_);
        if (it->second == 0) server_->held_by_client.erase(it);
      }
    }
    held_body_ = 0;
  }

  // The 503 for a body that would pass the budget (`length` when declared).
  boost::asio::awaitable<void> RefuseOverBudget(std::optional<uint64_t> length) {
    server_->over_budget.fetch_add(1, std::memory_order_relaxed);
    const std::string size =
        length.has_value() ? absl::StrCat("its ", *length, "-byte body") : "its chunked body";
    HttpResponse response = JsonResponse(
        503,
        JsonErrorBody("Overloaded",
                      absl::StrCat("the server holds ",
                                   server_->body_bytes_held.load(std::memory_order_relaxed),
                                   " bytes of request bodies (this client ", ClientHeld(), ") and ",
                                   size, " would pass its limit of ", options_.max_total_body_bytes,
                                   credential_ ? " bytes"
                                               : " bytes, the part of it open to requests "
                                                 "without a credential, or this client's share",
                                   "; retry shortly"),
                      /*retryable=*/true));
    response.headers.Set("Retry-After", "1");
    co_await AnswerAndClose(std::move(response));
  }

  // Answers a request that could not be read, when there is someone to answer.
  boost::asio::awaitable<void> Reject(const boost::system::error_code& ec) {
    if (stopping_ || deadline_.expired() || !socket_.is_open()) co_return;
    HttpResponse answer;
    if (ec == http::error::body_limit) {
      answer = JsonResponse(
          413, JsonErrorBody("PayloadTooLarge",
                             absl::StrCat("the request body exceeds the server's limit of ",
                                          options_.max_body_bytes, " bytes; send a smaller body")));
    } else if (ec == http::error::header_limit) {
      answer = JsonResponse(
          431, JsonErrorBody("HeadersTooLarge",
                             absl::StrCat("the request header exceeds the server's limit of ",
                                          options_.max_header_bytes, " bytes")));
    } else if (IsParseError(ec)) {
      answer = JsonResponse(
          400, JsonErrorBody("BadRequest", absl::StrCat("malformed HTTP request (", ec.message(),
                                                        "); send a valid HTTP/1.1 request")));
    } else {
      co_return;
    }
    co_await AnswerAndClose(std::move(answer));
  }

  // Sends `res` (an answer of the server's own) and closes the connection.
  boost::asio::awaitable<void> AnswerAndClose(HttpResponse res) {
    // The refused request's bytes go now, not after the linger below.
    parser_.reset();
    ReleaseBody();
    std::string head;
    bool close = true;
    // Our own fields and a known status: nothing to refuse.
    (void)net_internal::FormatResponseHead(11, res.status, res.headers,
                                           net_internal::Framing::kLength, res.body.size(),
                                           /*keep_alive=*/false, &close, head);
    const std::array<boost::asio::const_buffer, 2> answer{boost::asio::buffer(head),
                                                          boost::asio::buffer(res.body)};
    auto written = co_await TimedWrite(
        [&] { return boost::asio::async_write(socket_, answer, kAwait); }, "error answer");
    if (!written.ok()) co_return;
    boost::system::error_code ec;
    socket_.shutdown(Tcp::socket::shutdown_send, ec);
    deadline_.ArmAfter(std::min<Clock::duration>(options_.body_timeout, kLingerTime));
    size_t drained = 0;
    while (drained < kLingerBytes && socket_.is_open()) {
      buffer_.clear();
      auto [read_ec, n] = co_await socket_.async_read_some(buffer_.prepare(16384), kAwait);
      if (read_ec) break;
      drained += n;
    }
    deadline_.Disarm();
  }

  // Runs the handler on the request just read. Returns whether the
  // connection may serve another request.
  boost::asio::awaitable<bool> Handle() {
    http::request<http::string_body> msg = parser_->release();
    parser_.reset();
    server_->requests.fetch_add(1, std::memory_order_relaxed);
    HttpRequest request = std::exchange(head_, HttpRequest());
    request.body = std::move(msg.body());
    HttpExchange exchange(this, std::move(request), peer_, msg.version(), msg.keep_alive());

    exchange_ = &exchange;
    handler_running_ = true;
    monitor_requested_ = false;
    std::string handler_error;
    try {
      co_await server_->handler(exchange);
    } catch (const std::exception& e) {
      handler_error = e.what();
      if (handler_error.empty()) handler_error = "unknown exception";
    } catch (...) {
      handler_error = "non-standard exception";
    }
    handler_running_ = false;
    exchange_ = nullptr;

    if (!exchange.response_started() && !disconnected_ && socket_.is_open()) {
      std::string message = handler_error.empty()
                                ? absl::StrCat("the handler for ", exchange.request().method, " ",
                                               AbslView(TargetPath(exchange.request().target)),
                                               " returned without responding")
                                : absl::StrCat("the handler for ", exchange.request().method, " ",
                                               AbslView(TargetPath(exchange.request().target)),
                                               " failed: ", handler_error);
      exchange.close_after_ = !handler_error.empty();
      (void)co_await exchange.Respond(JsonResponse(500, JsonErrorBody("HandlerError", message)));
    }
    const bool keep_alive = handler_error.empty() &&
                            exchange.state_ != HttpExchange::State::kStreaming &&
                            exchange.keep_alive_ && !exchange.close_after_ && !broken_ &&
                            !disconnected_ && !stopping_ && socket_.is_open();
    // A monitor read still waiting for the first byte is kept: it becomes the
    // read of the next request (see Serve), which saves a recv and a
    // cancellation per request. Otherwise it is stopped here.
    if (!keep_alive || buffer_.size() > 0) co_await StopMonitor();
    co_return keep_alive;
  }

  // Keeps a read pending while the handler runs: end of stream or an error
  // means the client is gone. Bytes that arrive instead are the next
  // pipelined request; they are kept in buffer_ for the next round. Started
  // on the handler's first interest (see server.h): a quick handler that
  // never asks pays no extra read, cancellation and wake-up.
  void EnsureMonitor() {
    if (!handler_running_ || monitor_requested_ || disconnected_) return;
    monitor_requested_ = true;
    monitor_done_.Reset();
    monitor_active_ = true;
    ReadForMonitor();
  }

  void ReadForMonitor() {
    if (!socket_.is_open() || buffer_.size() >= options_.max_header_bytes) {
      monitor_active_ = false;
      monitor_done_.Set();
      return;
    }
    socket_.async_read_some(
        buffer_.prepare(kMonitorReadSize),
        boost::asio::bind_cancellation_slot(monitor_cancel_.slot(),
                                            [this](const boost::system::error_code& ec, size_t n) {
                                              buffer_.commit(n);
                                              // After the handler, the first
                                              // bytes are the next request.
                                              if (!ec && !monitor_stopping_ && handler_running_) {
                                                ReadForMonitor();
                                                return;
                                              }
                                              if (ec && ec != boost::asio::error::operation_aborted)
                                                MarkDisconnected();
                                              monitor_active_ = false;
                                              monitor_done_.Set();
                                            }));
  }

  boost::asio::awaitable<void> StopMonitor() {
    if (!monitor_active_) co_return;
    monitor_stopping_ = true;
    monitor_cancel_.emit(boost::asio::cancellation_type::terminal);
    co_await monitor_done_.Wait();
    monitor_stopping_ = false;
  }

  void MarkDisconnected() {
    if (disconnected_) return;
    disconnected_ = true;
    disconnect_event_.Set();
    if (exchange_ != nullptr) exchange_->disconnect_abort_.Abort();
    // Emitting may run cancellation handlers that register or unregister
    // signals; iterate over a copy.
    std::vector<boost::asio::cancellation_signal*> signals = cancel_on_disconnect_;
    for (boost::asio::cancellation_signal* signal : signals) {
      signal->emit(boost::asio::cancellation_type::terminal);
    }
  }

  template <typename StartWrite>
  boost::asio::awaitable<absl::Status> TimedWrite(StartWrite start, std::string_view what) {
    deadline_.ArmAfter(options_.write_timeout);
    auto [ec, n] = co_await start();
    deadline_.Disarm();
    if (!ec) co_return absl::OkStatus();
    broken_ = true;
    MarkDisconnected();
    if (deadline_.expired()) {
      co_return absl::UnavailableError(
          absl::StrCat("writing the ", AbslView(what), " to client ", peer_, " timed out after ",
                       options_.write_timeout.count(), " ms; the client stopped reading"));
    }
    co_return absl::UnavailableError(absl::StrCat("writing the ", AbslView(what), " to client ",
                                                  peer_, " failed: ", ec.message(),
                                                  "; the client disconnected"));
  }

  std::shared_ptr<HttpServer::State> server_;
  const ServerOptions& options_;
  Tcp::socket socket_;
  boost::beast::flat_buffer buffer_;
  SocketDeadline deadline_;
  std::optional<http::request_parser<http::string_body>> parser_;
  std::string peer_ = "unknown peer";
  std::string client_;  // the peer's address, whose share of the body budget held_body_ counts in
  HttpRequest head_;    // the current request's, once its header arrived
  uint64_t held_body_ = 0;   // of the server's body budget, for the current request
  bool credential_ = false;  // whether the current request presented one

  boost::asio::cancellation_signal monitor_cancel_;
  LoopEvent monitor_done_;
  bool monitor_active_ = false;
  bool monitor_requested_ = false;  // for the current request
  bool monitor_stopping_ = false;

  bool handler_running_ = false;
  bool disconnected_ = false;
  bool broken_ = false;  // a write failed: the socket is unusable
  bool stopping_ = false;
  LoopEvent disconnect_event_;
  std::vector<boost::asio::cancellation_signal*> cancel_on_disconnect_;
  HttpExchange* exchange_ = nullptr;  // while its handler runs
};

}  // namespace net_internal

using net_internal::ServerConnection;

// ---------------------------------------------------------------------------
// HttpExchange

HttpExchange::HttpExchange(ServerConnection* connection, HttpRequest request, std::string peer,
                           unsigned version, bool keep_alive)
    : connection_(connection),
      request_(std::move(request)),
      peer_(std::move(peer)),
      version_(version == 10 ? 10 : 11),
      keep_alive_(keep_alive) {}

bool HttpExchange::disconnected() const {
  connection_->EnsureMonitor();
  return connection_->disconnected_;
}

HttpCallAbort& HttpExchange::AbortOnDisconnect() {
  connection_->EnsureMonitor();
  if (connection_->disconnected_) disconnect_abort_.Abort();
  return disconnect_abort_;
}

boost::asio::awaitable<void> HttpExchange::WaitDisconnected() {
  connection_->EnsureMonitor();
  co_await connection_->disconnect_event_.Wait();
}

boost::asio::awaitable<void> HttpExchange::RunUntilDisconnected(boost::asio::awaitable<void> op) {
  connection_->EnsureMonitor();
  if (connection_->disconnected_) co_return;
  boost::asio::cancellation_signal signal;
  connection_->cancel_on_disconnect_.push_back(&signal);
  std::exception_ptr error;
  try {
    co_await boost::asio::co_spawn(
        co_await boost::asio::this_coro::executor, std::move(op),
        boost::asio::bind_cancellation_slot(signal.slot(), boost::asio::use_awaitable));
  } catch (const boost::system::system_error& e) {
    if (e.code() != boost::asio::error::operation_aborted) error = std::current_exception();
  } catch (...) {
    error = std::current_exception();
  }
  auto& signals = connection_->cancel_on_disconnect_;
  signals.erase(std::find(signals.begin(), signals.end(), &signal));
  if (error) std::rethrow_exception(error);
}

absl::Status HttpExchange::CheckWritable(std::string_view what) const {
  if (writing_) {
    return absl::FailedPreconditionError(absl::StrCat(
        AbslView(what),
        " while another write to the same exchange is in progress; await each write first"));
  }
  if (connection_->broken_ || !connection_->socket_.is_open()) {
    return absl::UnavailableError(
        absl::StrCat(AbslView(what), " failed: client ", peer_, " disconnected"));
  }
  return absl::OkStatus();
}

namespace {

absl::Status CheckStatusCode(int status) {
  if (status < 200 || status > 999) {
    return absl::InvalidArgumentError(
        absl::StrCat("response status ", status, " is not a final HTTP status (200..999)"));
  }
  return absl::OkStatus();
}

// The head of an exchange's response into `head`, for `what` ("Respond()"):
// `*close_after` says and learns whether the connection closes after it.
absl::Status FormatHead(std::string_view what, unsigned version, bool keep_alive, bool* close_after,
                        int status, const HttpHeaders& headers, net_internal::Framing framing,
                        size_t body_size, std::string& head) {
  if (absl::Status s = CheckStatusCode(status); !s.ok()) return s;
  bool close = *close_after;
  if (absl::Status s = net_internal::FormatResponseHead(version, status, headers, framing,
                                                        body_size, keep_alive, &close, head);
      !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(AbslView(what), ": ", s.message()));
  }
  *close_after = close;
  return absl::OkStatus();
}

}  // namespace

boost::asio::awaitable<absl::Status> HttpExchange::Respond(HttpResponse response) {
  if (state_ != State::kNone) {
    co_return absl::FailedPreconditionError(
        "Respond() called after a response was already started; send one response per request");
  }
  if (absl::Status s = CheckWritable("Respond()"); !s.ok()) co_return s;
  // 204 and 304 have no body and no length; an answer to HEAD has the length
  // of the body it does not carry.
  const bool bodiless = response.status == 204 || response.status == 304;
  if (bodiless) response.body.clear();
  std::string head;
  if (absl::Status s = FormatHead(
          "Respond()", version_, keep_alive_, &close_after_, response.status, response.headers,
          bodiless ? net_internal::Framing::kNone : net_internal::Framing::kLength,
          response.body.size(), head);
      !s.ok()) {
    co_return s;
  }
  state_ = State::kResponded;
  if (request_.method == "HEAD") response.body.clear();
  const std::array<boost::asio::const_buffer, 2> message{boost::asio::buffer(head),
                                                         boost::asio::buffer(response.body)};
  writing_ = true;
  ServerConnection& c = *connection_;
  absl::Status status = co_await c.TimedWrite(
      [&] { return boost::asio::async_write(c.socket_, message, kAwait); }, "response");
  writing_ = false;
  co_return status;
}

boost::asio::awaitable<absl::Status> HttpExchange::BeginStream(int status_code,
                                                               HttpHeaders headers) {
  if (state_ != State::kNone) {
    co_return absl::FailedPreconditionError(
        "BeginStream() called after a response was already started");
  }
  if (absl::Status s = CheckWritable("BeginStream()"); !s.ok()) co_return s;
  // HTTP/1.0 has no chunked encoding: the body ends when the connection does.
  std::string head;
  if (absl::Status s = FormatHead("BeginStream()", version_, keep_alive_, &close_after_,
                                  status_code, headers, net_internal::Framing::kStreamed, 0, head);
      !s.ok()) {
    co_return s;
  }
  state_ = State::kStreaming;
  writing_ = true;
  ServerConnection& c = *connection_;
  c.EnsureMonitor();
  absl::Status status = co_await c.TimedWrite(
      [&] { return boost::asio::async_write(c.socket_, boost::asio::buffer(head), kAwait); },
      "stream header");
  writing_ = false;
  co_return status;
}

boost::asio::awaitable<absl::Status> HttpExchange::WriteChunk(std::string bytes) {
  if (state_ != State::kStreaming) {
    co_return absl::FailedPreconditionError(
        "WriteChunk() called outside a stream; call BeginStream() first");
  }
  if (bytes.empty()) co_return absl::OkStatus();
  if (absl::Status s = CheckWritable("WriteChunk()"); !s.ok()) co_return s;
  writing_ = true;
  ServerConnection& c = *connection_;
  absl::Status status;
  if (version_ == 11) {
    status = co_await c.TimedWrite(
        [&] {
          return boost::asio::async_write(c.socket_, http::make_chunk(boost::asio::buffer(bytes)),
                                          kAwait);
        },
        "stream chunk");
  } else {
    status = co_await c.TimedWrite(
        [&] { return boost::asio::async_write(c.socket_, boost::asio::buffer(bytes), kAwait); },
        "stream chunk");
  }
  writing_ = false;
  co_return status;
}

boost::asio::awaitable<absl::Status> HttpExchange::EndStream() {
  if (state_ != State::kStreaming) {
    co_return absl::FailedPreconditionError(
        "EndStream() called outside a stream; call BeginStream() first");
  }
  if (absl::Status s = CheckWritable("EndStream()"); !s.ok()) co_return s;
  state_ = State::kStreamEnded;
  if (version_ == 10) co_return absl::OkStatus();
  writing_ = true;
  ServerConnection& c = *connection_;
  absl::Status status = co_await c.TimedWrite(
      [&] { return boost::asio::async_write(c.socket_, http::make_chunk_last(), kAwait); },
      "end of stream");
  writing_ = false;
  co_return status;
}

// ---------------------------------------------------------------------------
// HttpServer

void HttpServer::State::StopOnLoop() {
  if (stopped) return;
  stopped = true;
  boost::system::error_code ec;
  acceptor.close(ec);
  std::vector<ServerConnection*> open(connections.begin(), connections.end());
  for (ServerConnection* connection : open) connection->Stop();
  if (connections.empty()) drained.Set();
}

namespace {

boost::asio::awaitable<void> ServeConnection(std::shared_ptr<HttpServer::State> state,
                                             Tcp::socket socket) {
  state->active.fetch_add(1, std::memory_order_relaxed);
  {
    ServerConnection connection(state, std::move(socket));
    co_await connection.Run();
  }
  state->active.fetch_sub(1, std::memory_order_relaxed);
  if (state->stopped && state->connections.empty()) state->drained.Set();
}

boost::asio::awaitable<void> AcceptLoop(std::shared_ptr<HttpServer::State> state) {
  for (;;) {
    auto [ec, socket] = co_await state->acceptor.async_accept(kAwait);
    if (state->stopped || ec == boost::asio::error::operation_aborted) co_return;
    if (ec) {
      // Out of descriptors or buffers: back off briefly instead of spinning.
      boost::asio::steady_timer pause(state->executor, std::chrono::milliseconds(50));
      co_await pause.async_wait(kAwait);
      continue;
    }
    state->accepted.fetch_add(1, std::memory_order_relaxed);
    boost::asio::co_spawn(state->executor, ServeConnection(state, std::move(socket)),
                          boost::asio::detached);
  }
}

}  // namespace

absl::StatusOr<std::unique_ptr<HttpServer>> HttpServer::Start(boost::asio::any_io_executor executor,
                                                              ServerOptions options,
                                                              HttpHandler handler) {
  if (options.max_total_body_bytes < options.max_body_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat("the budget for request bodies held at once (", options.max_total_body_bytes,
                     " bytes) is below the largest body accepted (", options.max_body_bytes,
                     " bytes); raise the budget or lower the per-request limit"));
  }
  auto state = std::make_shared<State>(std::move(executor), std::move(options), std::move(handler));
  const ServerOptions& opts = state->options;
  boost::system::error_code ec;
  boost::asio::ip::address address = boost::asio::ip::make_address(opts.host, ec);
  if (ec) {
    Tcp::resolver resolver(state->executor);
    auto results = resolver.resolve(opts.host, "", ec);
    if (ec || results.empty()) {
      return absl::InvalidArgumentError(
          absl::StrCat("listen host \"", opts.host, "\" does not resolve",
                       ec ? absl::StrCat(" (", ec.message(), ")") : std::string(),
                       "; pass an IP address such as 127.0.0.1 or 0.0.0.0"));
    }
    address = results.begin()->endpoint().address();
  }
  Tcp::endpoint endpoint(address, opts.port);
  auto fail = [&](const char* step) {
    return absl::UnavailableError(absl::StrCat("cannot listen on ", opts.host, ":", opts.port, ": ",
                                               step, ": ", ec.message(),
                                               "; pick another port or free the address"));
  };
  Tcp::acceptor& acceptor = state->acceptor;
  acceptor.open(endpoint.protocol(), ec);
  if (ec) return fail("open");
  acceptor.set_option(Tcp::acceptor::reuse_address(true), ec);
  if (ec) return fail("SO_REUSEADDR");
  acceptor.bind(endpoint, ec);
  if (ec) return fail("bind");
  acceptor.listen(opts.backlog, ec);
  if (ec) return fail("listen");
  uint16_t port = acceptor.local_endpoint(ec).port();
  if (ec) return fail("local address");
  std::string host = address.to_string();
  boost::asio::co_spawn(state->executor, AcceptLoop(state), boost::asio::detached);
  return std::unique_ptr<HttpServer>(new HttpServer(std::move(state), port, std::move(host)));
}

HttpServer::~HttpServer() { Stop(); }

std::string HttpServer::url() const { return HttpOrigin{host_, port_}.ToString(); }

void HttpServer::Stop() {
  boost::asio::dispatch(state_->executor, [state = state_] { state->StopOnLoop(); });
}

boost::asio::awaitable<void> HttpServer::Shutdown() {
  std::shared_ptr<State> state = state_;
  state->StopOnLoop();
  while (!state->connections.empty()) co_await state->drained.Wait();
}

void WriteBodyBudgetMetrics(const ServerStats& stats, PrometheusText& text) {
  text.One("request_body_bytes", "gauge", "Request bodies held now, against the server's budget.",
           stats.body_bytes_held);
  text.One("request_body_bytes_without_token", "gauge",
           "The part of them held by requests that presented no token.",
           stats.body_bytes_held_without_credential);
  text.One("overloaded_total", "counter",
           "Requests refused (503) because their body would pass the server's budget, the part "
           "open to requests without the token, or their address's share.",
           stats.refused_over_budget);
  text.One("slow_bodies_cut_total", "counter",
           "Connections closed because a request body arrived slower than the minimum rate.",
           stats.slow_bodies_cut);
}

ServerStats HttpServer::stats() const {
  ServerStats s;
  s.connections_accepted = state_->accepted.load(std::memory_order_relaxed);
  s.connections_active = state_->active.load(std::memory_order_relaxed);
  s.requests = state_->requests.load(std::memory_order_relaxed);
  s.body_bytes_held = state_->body_bytes_held.load(std::memory_order_relaxed);
  s.body_bytes_held_without_credential =
      state_->held_without_credential.load(std::memory_order_relaxed);
  s.refused_over_budget = state_->over_budget.load(std::memory_order_relaxed);
  s.refused_at_head = state_->refused_at_head.load(std::memory_order_relaxed);
  s.slow_bodies_cut = state_->slow_bodies_cut.load(std::memory_order_relaxed);
  return s;
}

// ---------------------------------------------------------------------------
// HttpRouter

void HttpRouter::Add(std::string method, std::string path, HttpHandler handler, std::string token) {
  routes_.try_emplace(std::move(path))
      .first->second.push_back(Route{std::move(method), std::move(handler), std::move(token)});
}

const std::string& HttpRouter::TokenFor(const HttpRequest& request) const {
  auto it = routes_.find(AbslView(TargetPath(request.target)));
  if (it != routes_.end()) {
    for (const Route& route : it->second) {
      if (route.method == request.method) return route.token;
    }
  }
  static const std::string kNone;
  return fallback_ ? fallback_token_ : kNone;
}

HeadCheck HttpRouter::TokenCheck() const {
  auto router = std::make_shared<const HttpRouter>(*this);
  return [router](const HttpRequest& head) -> std::optional<HttpResponse> {
    const std::string& token = router->TokenFor(head);
    if (token.empty() || PresentsBearerToken(head.headers, token)) return std::nullopt;
    return UnauthorizedResponse(absl::StrCat(head.method, " ", AbslView(TargetPath(head.target))));
  };
}

boost::asio::awaitable<void> HttpRouter::Dispatch(HttpExchange& exchange) const {
  const HttpRequest& request = exchange.request();
  std::string_view path = TargetPath(request.target);
  if (const std::string& token = TokenFor(request);
      !token.empty() && !PresentsBearerToken(request.headers, token)) {
    HttpResponse refused = UnauthorizedResponse(absl::StrCat(request.method, " ", AbslView(path)));
    (void)co_await exchange.Respond(std::move(refused));
    co_return;
  }
  auto it = routes_.find(AbslView(path));
  if (it != routes_.end()) {
    for (const Route& route : it->second) {
      if (route.method == request.method) {
        co_await route.handler(exchange);
        co_return;
      }
    }
  }
  if (fallback_) {
    co_await fallback_(exchange);
    co_return;
  }
  if (it == routes_.end()) {
    (void)co_await exchange.Respond(JsonResponse(
        404, JsonErrorBody("NotFound",
                           absl::StrCat("no route for ", request.method, " ", AbslView(path)))));
    co_return;
  }
  std::vector<std::string> allowed;
  for (const Route& route : it->second) allowed.push_back(route.method);
  HttpResponse response = JsonResponse(
      405, JsonErrorBody("MethodNotAllowed",
                         absl::StrCat(request.method, " is not allowed on ", AbslView(path),
                                      "; use ", absl::StrJoin(allowed, " or "))));
  response.headers.Add("Allow", absl::StrJoin(allowed, ", "));
  (void)co_await exchange.Respond(std::move(response));
}

HttpHandler HttpRouter::AsHandler() const {
  auto router = std::make_shared<const HttpRouter>(*this);
  return [router](HttpExchange& exchange) { return router->Dispatch(exchange); };
}

void RaiseOpenFileLimit() {
  rlimit files{};
  if (::getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur < files.rlim_max) {
    files.rlim_cur = files.rlim_max;
    ::setrlimit(RLIMIT_NOFILE, &files);
  }
}

}  // namespace stitch

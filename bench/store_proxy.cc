#include "store_proxy.h"

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <memory>
#include <string_view>

#include <boost/asio/as_tuple.hpp>
#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/use_awaitable.hpp>
#include <boost/asio/write.hpp>

#include "absl/strings/str_cat.h"

namespace stitch {

namespace asio = boost::asio;
using asio::awaitable;
using asio::use_awaitable;
using asio::ip::tcp;

struct StoreProxy::Impl {
  asio::io_context io;
  tcp::acceptor acceptor{io};
  uint16_t upstream_port = 0;
  double bytes_per_second = 0;
  // Pacing shared by every connection (one thread runs them all): the
  // moment the link is free again.
  std::chrono::steady_clock::time_point free_at = std::chrono::steady_clock::now();
  std::atomic<uint64_t> requests{0};
  std::atomic<uint64_t> bytes{0};
};

namespace {

constexpr std::string_view kRequestLineEnd = " HTTP/1.1\r\n";

// Waits for the shared link to carry `n` bytes at `rate` bytes per second.
awaitable<void> Pace(StoreProxy::Impl& impl, size_t n) {
  if (impl.bytes_per_second <= 0) co_return;
  const auto now = std::chrono::steady_clock::now();
  const auto start = std::max(now, impl.free_at);
  impl.free_at = start + std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                             std::chrono::duration<double>(n / impl.bytes_per_second));
  if (start > now) {
    asio::steady_timer timer(impl.io, start);
    co_await timer.async_wait(use_awaitable);
  }
}

// Client to store: relayed as is, request lines counted (a line split
// across two reads is missed: requests are small and arrive whole).
awaitable<void> Upstream(StoreProxy::Impl& impl, std::shared_ptr<tcp::socket> from,
                         std::shared_ptr<tcp::socket> to) {
  std::array<char, 64 * 1024> buffer;
  for (;;) {
    auto [ec, n] =
        co_await from->async_read_some(asio::buffer(buffer), asio::as_tuple(use_awaitable));
    if (ec) break;
    std::string_view chunk(buffer.data(), n);
    for (size_t at = chunk.find(kRequestLineEnd); at != std::string_view::npos;
         at = chunk.find(kRequestLineEnd, at + 1)) {
      impl.requests.fetch_add(1);
    }
    auto [wec, wn] = co_await asio::async_write(*to, asio::buffer(buffer.data(), n),
                                                asio::as_tuple(use_awaitable));
    if (wec) break;
  }
  boost::system::error_code ignored;
  to->shutdown(tcp::socket::shutdown_send, ignored);
}

// Store to client: paced by the shared cap, bytes counted.
awaitable<void> Downstream(StoreProxy::Impl& impl, std::shared_ptr<tcp::socket> from,
                           std::shared_ptr<tcp::socket> to) {
  std::array<char, 16 * 1024> buffer;
  for (;;) {
    auto [ec, n] =
        co_await from->async_read_some(asio::buffer(buffer), asio::as_tuple(use_awaitable));
    if (ec) break;
    co_await Pace(impl, n);
    auto [wec, wn] = co_await asio::async_write(*to, asio::buffer(buffer.data(), n),
                                                asio::as_tuple(use_awaitable));
    if (wec) break;
    impl.bytes.fetch_add(n);
  }
  boost::system::error_code ignored;
  to->shutdown(tcp::socket::shutdown_send, ignored);
}

awaitable<void> Accept(StoreProxy::Impl& impl) {
  for (;;) {
    auto [ec, socket] = co_await impl.acceptor.async_accept(asio::as_tuple(use_awaitable));
    if (ec) co_return;
    auto client = std::make_shared<tcp::socket>(std::move(socket));
    auto server = std::make_shared<tcp::socket>(impl.io);
    auto [cec] = co_await server->async_connect(
        tcp::endpoint(asio::ip::make_address("127.0.0.1"), impl.upstream_port),
        asio::as_tuple(use_awaitable));
    if (cec) continue;
    asio::co_spawn(impl.io, Upstream(impl, client, server), asio::detached);
    asio::co_spawn(impl.io, Downstream(impl, server, client), asio::detached);
  }
}

}  // namespace

uint64_t StoreProxy::requests() const { return impl_->requests.load(); }
uint64_t StoreProxy::bytes_served() const { return impl_->bytes.load(); }

StoreProxy::~StoreProxy() {
  if (impl_ != nullptr) impl_->io.stop();
  if (thread_.joinable()) thread_.join();
}

absl::StatusOr<std::unique_ptr<StoreProxy>> StoreProxy::Start(uint16_t upstream_port,
                                                              double bytes_per_second) {
  std::unique_ptr<StoreProxy> proxy(new StoreProxy());
  proxy->impl_ = std::make_unique<Impl>();
  Impl& impl = *proxy->impl_;
  impl.upstream_port = upstream_port;
  impl.bytes_per_second = bytes_per_second;
  boost::system::error_code ec;
  const tcp::endpoint here(asio::ip::make_address("127.0.0.1"), 0);
  impl.acceptor.open(here.protocol(), ec);
  if (!ec) impl.acceptor.set_option(tcp::acceptor::reuse_address(true), ec);
  if (!ec) impl.acceptor.bind(here, ec);
  if (!ec) impl.acceptor.listen(asio::socket_base::max_listen_connections, ec);
  if (ec) return absl::InternalError(absl::StrCat("store proxy: cannot listen: ", ec.message()));
  proxy->port_ = impl.acceptor.local_endpoint().port();

  asio::co_spawn(impl.io, Accept(impl), asio::detached);
  proxy->thread_ = std::thread([&impl] { impl.io.run(); });
  return proxy;
}

}  // namespace stitch

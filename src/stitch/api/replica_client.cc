#include "stitch/api/replica_client.h"

#include <algorithm>
#include <functional>
#include <optional>
#include <utility>

#include <boost/asio/co_spawn.hpp>
#include <boost/asio/detached.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/json/parse.hpp>
#include <boost/json/value.hpp>

#include "absl/strings/str_cat.h"
#include "stitch/api/routes.h"
#include "stitch/api/server_info.h"
#include "stitch/core/errors.h"
#include "stitch/net/auth.h"

namespace stitch {

using boost::asio::awaitable;
namespace json = boost::json;

absl::StatusOr<ReplicaEndpoint> ReplicaEndpoint::Parse(std::string_view url) {
  absl::StatusOr<HttpUrl> parsed = ParseHttpUrl(url);
  if (!parsed.ok()) return parsed.status();
  ReplicaEndpoint endpoint;
  endpoint.url = std::string(url);
  endpoint.origin = std::move(parsed->origin);
  endpoint.prefix = parsed->target == "/" ? "" : std::move(parsed->target);
  return endpoint;
}

awaitable<absl::StatusOr<ReplicaState>> FetchServerInfo(HttpClient& client,
                                                        const ReplicaEndpoint& replica,
                                                        CallOptions options,
                                                        std::string bearer_token) {
  HttpRequest request;
  request.method = "GET";
  request.target = replica.prefix + "/server_info";
  if (!bearer_token.empty()) request.headers.Set("Authorization", BearerValue(bearer_token));
  absl::StatusOr<HttpResponse> response =
      co_await client.Send(replica.origin, std::move(request), options);
  if (!response.ok()) co_return response.status();
  if (response->status != 200) {
    co_return absl::UnavailableError(absl::StrCat("/server_info answered HTTP ", response->status));
  }
  absl::StatusOr<ReplicaState> state = ParseServerInfo(response->body);
  if (!state.ok()) {
    co_return absl::InvalidArgumentError(absl::StrCat("/server_info: ", state.status().message()));
  }
  co_return state;
}

awaitable<absl::Status> SendWake(HttpClient& client, const ReplicaEndpoint& replica,
                                 CallOptions options, std::string bearer_token) {
  HttpRequest request;
  request.method = "POST";
  request.target = replica.prefix + "/wake";
  if (!bearer_token.empty()) request.headers.Set("Authorization", BearerValue(bearer_token));
  request.headers.Add("Content-Type", "application/json");
  request.body = "{}";
  absl::StatusOr<HttpResponse> response =
      co_await client.Send(replica.origin, std::move(request), options);
  if (!response.ok()) co_return response.status();
  if (response->status < 200 || response->status >= 300) {
    co_return absl::UnavailableError(absl::StrCat("HTTP ", response->status));
  }
  co_return absl::OkStatus();
}

namespace {

// Runs `call` for each of `urls` on a private loop, at most
// `options.concurrency` at once, and returns the results in order.
template <typename Result>
std::vector<Result> ForEachReplica(
    const std::vector<std::string>& urls, const ReplicaCallOptions& options,
    const std::function<awaitable<Result>(HttpClient&, const ReplicaEndpoint&, CallOptions,
                                          std::string)>& call) {
  std::vector<std::optional<Result>> out(urls.size());
  boost::asio::io_context io(1);
  ClientOptions client_options;
  client_options.connect_timeout = options.timeout;
  client_options.request_timeout = options.timeout;
  {
    HttpClient client(io.get_executor(), client_options);
    size_t next = 0;  // the loop's thread only
    const size_t slots = std::min(std::max<size_t>(options.concurrency, 1), urls.size());
    for (size_t slot = 0; slot < slots; ++slot) {
      boost::asio::co_spawn(
          io,
          [&]() -> awaitable<void> {
            while (next < urls.size()) {
              const size_t i = next++;
              absl::StatusOr<ReplicaEndpoint> endpoint = ReplicaEndpoint::Parse(urls[i]);
              if (!endpoint.ok()) {
                out[i].emplace(endpoint.status());
                continue;
              }
              CallOptions call_options;
              Result result = co_await call(client, *endpoint, call_options, options.bearer_token);
              out[i].emplace(std::move(result));
            }
          },
          boost::asio::detached);
    }
    io.run();
  }
  std::vector<Result> results;
  results.reserve(out.size());
  for (std::optional<Result>& r : out) {
    results.push_back(r.has_value() ? *std::move(r) : Result(absl::InternalError("not called")));
  }
  return results;
}

}  // namespace

std::vector<absl::StatusOr<ReplicaState>> ReadServerInfos(const std::vector<std::string>& urls,
                                                          const ReplicaCallOptions& options) {
  return ForEachReplica<absl::StatusOr<ReplicaState>>(urls, options, &FetchServerInfo);
}

namespace {

// POST `route` (with its query) on the replica; its /server_info on 200.
awaitable<absl::StatusOr<ReplicaState>> PostAdmin(HttpClient& client,
                                                  const ReplicaEndpoint& replica, std::string route,
                                                  CallOptions options, std::string bearer_token) {
  HttpRequest request;
  request.method = "POST";
  request.target = replica.prefix + route;
  if (!bearer_token.empty()) request.headers.Set("Authorization", BearerValue(bearer_token));
  absl::StatusOr<HttpResponse> response =
      co_await client.Send(replica.origin, std::move(request), options);
  if (!response.ok()) co_return response.status();
  if (response->status != 200) {
    // The sidecar's own words: {"error": {"message": ...}}.
    std::string why = absl::StrCat("HTTP ", response->status);
    boost::system::error_code ec;
    json::value body = json::parse(response->body, ec);
    if (!ec && body.is_object()) {
      if (const json::value* e = body.as_object().if_contains("error"); e && e->is_object()) {
        if (const json::value* m = e->as_object().if_contains("message"); m && m->is_string()) {
          why = std::string(m->get_string());
        }
      }
    }
    switch (response->status) {
      case 400:
        co_return absl::InvalidArgumentError(why);
      case 404:
        co_return absl::NotFoundError(why);
      case 409:
        co_return absl::FailedPreconditionError(why);
      default:
        co_return absl::UnavailableError(why);
    }
  }
  absl::StatusOr<ReplicaState> state = ParseServerInfo(response->body);
  if (!state.ok()) {
    co_return absl::InvalidArgumentError(absl::StrCat(route, ": ", state.status().message()));
  }
  co_return state;
}

std::vector<absl::StatusOr<ReplicaState>> PostAdminEach(const std::vector<std::string>& urls,
                                                        std::string route,
                                                        const ReplicaCallOptions& options) {
  return ForEachReplica<absl::StatusOr<ReplicaState>>(
      urls, options,
      [route](HttpClient& client, const ReplicaEndpoint& replica, CallOptions call,
              std::string token) { return PostAdmin(client, replica, route, call, token); });
}

}  // namespace

std::vector<absl::StatusOr<ReplicaState>> HoldEach(const std::vector<std::string>& urls,
                                                   int64_t version, std::string_view holder,
                                                   const ReplicaCallOptions& options) {
  return PostAdminEach(
      urls, absl::StrCat(AbslView(kHoldRoute), "?version=", version, "&holder=", AbslView(holder)),
      options);
}

std::vector<absl::StatusOr<ReplicaState>> ReleaseEach(const std::vector<std::string>& urls,
                                                      std::string_view holder,
                                                      const ReplicaCallOptions& options) {
  return PostAdminEach(urls, absl::StrCat(AbslView(kReleaseRoute), "?holder=", AbslView(holder)),
                       options);
}

std::vector<absl::Status> WakeEach(const std::vector<std::string>& urls,
                                   const ReplicaCallOptions& options) {
  return ForEachReplica<absl::Status>(urls, options, &SendWake);
}

}  // namespace stitch

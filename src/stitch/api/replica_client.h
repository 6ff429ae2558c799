// The calls the control plane makes to a replica's sidecar, in one place:
// GET /server_info (what it serves and whether it is ready) and POST /wake
// (reconcile now). The gateway probes its replicas with them; `stitch
// status`, `stitch wait-ready` and the demo read /server_info; every Pool
// wakes its replicas with them.
//
// A replica is named by its base URL ("http://10.0.0.5:8000", or with a
// path prefix "http://host/replica-3"), as a Pool discovers it: the
// sidecar's routes are below it.
#pragma once

#include <chrono>
#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

#include <boost/asio/awaitable.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "stitch/core/state.h"
#include "stitch/net/client.h"
#include "stitch/net/http.h"

namespace stitch {

// Where a replica's sidecar answers.
struct ReplicaEndpoint {
  std::string url;  // as given, for messages
  HttpOrigin origin;
  std::string prefix;  // the URL's path ("" for none), put before each route

  // InvalidArgument (ParseHttpUrl's) for a URL that is not http.
  [[nodiscard]] static absl::StatusOr<ReplicaEndpoint> Parse(std::string_view url);
};

// What the replica says about itself. Errors: the client's for a call that
// failed (Unavailable, DeadlineExceeded, ...); Unavailable
// "/server_info answered HTTP <status>" for any status but 200;
// InvalidArgument "/server_info: <why>" for a body that is not its wire form
// (server_info.h).
// A non-empty `bearer_token` (net/auth.h) is presented with the call, here
// and in SendWake.
[[nodiscard]] boost::asio::awaitable<absl::StatusOr<ReplicaState>> FetchServerInfo(
    HttpClient& client, const ReplicaEndpoint& replica, CallOptions options = {},
    std::string bearer_token = {});

// Asks the replica to reconcile now (an empty JSON body). OK when it
// answered 2xx; otherwise the client's error, or Unavailable "HTTP <status>".
[[nodiscard]] boost::asio::awaitable<absl::Status> SendWake(HttpClient& client,
                                                            const ReplicaEndpoint& replica,
                                                            CallOptions options = {},
                                                            std::string bearer_token = {});

// For threads that are not event loops (command-line tools, a Pool's
// Wake): each call below runs on a private event loop in the calling thread
// and blocks until every replica answered or timed out.
struct ReplicaCallOptions {
  // Per replica, the whole exchange (connecting included).
  std::chrono::milliseconds timeout = std::chrono::seconds(2);
  // At most this many replicas at once; a replica that does not answer
  // holds up only its own slot.
  size_t concurrency = 32;
  // Presented to every replica when not empty (net/auth.h).
  std::string bearer_token;
};

// FetchServerInfo for each of `urls`, in their order.
std::vector<absl::StatusOr<ReplicaState>> ReadServerInfos(const std::vector<std::string>& urls,
                                                          const ReplicaCallOptions& options);

// SendWake to each of `urls`, in their order.
std::vector<absl::Status> WakeEach(const std::vector<std::string>& urls,
                                   const ReplicaCallOptions& options);

// Evaluation holds (api/routes.h kHoldRoute, kReleaseRoute) on each of
// `urls`, in their order: what each replica says about itself after the
// call. A refusal is the replica's own message: InvalidArgument (400),
// NotFound (404: a release by a holder that holds nothing there) or
// FailedPrecondition (409); another status is Unavailable "HTTP <status>".
// `holder` must be a record word (store.h ValidateRecordWord's alphabet):
// it goes into the query as it is.
std::vector<absl::StatusOr<ReplicaState>> HoldEach(const std::vector<std::string>& urls,
                                                   int64_t version, std::string_view holder,
                                                   const ReplicaCallOptions& options);
std::vector<absl::StatusOr<ReplicaState>> ReleaseEach(const std::vector<std::string>& urls,
                                                      std::string_view holder,
                                                      const ReplicaCallOptions& options);

}  // namespace stitch

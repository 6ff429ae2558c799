// The HTTP calls an engine adapter makes to its engine's control surface,
// with the errors every adapter reports the same way.
//
// A POST succeeds when the engine answers 2xx and, for a JSON answer that
// carries `success`, `success` is true. Errors name the engine URL and the
// route: Unavailable when the engine did not answer (refused, reset, timed
// out), Aborted when it refused with `"undone": true` (it undid the change
// and holds what it held before), Internal with the engine's own message
// when it refused otherwise.
//
// Threading: bound to one event loop (the executor it was built with) and
// used only from coroutines running there.
#pragma once

#include <chrono>
#include <string>
#include <string_view>

#include <boost/asio/any_io_executor.hpp>
#include <boost/asio/awaitable.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "stitch/engine/engine.h"
#include "stitch/net/client.h"
#include "stitch/net/http.h"

namespace stitch {

// The engine's own explanation in a refusal: `message` (or `error`, or
// `detail`; inside an `error` object too) of a JSON answer, else the body
// itself, shortened.
std::string EngineMessage(const HttpResponse& response);

// The report an engine's answer to its report route carries (`where` names
// the call, for messages): Unavailable naming the engine's message unless
// it answered 200, else ParseEngineReport's.
[[nodiscard]] absl::StatusOr<EngineReport> ReportFromAnswer(const HttpResponse& answer,
                                                            std::string_view where);

class EngineHttp {
 public:
  // `api_key`, when not empty, goes as "Authorization: Bearer <api_key>"
  // with every call (an engine started with an API key).
  EngineHttp(boost::asio::any_io_executor executor, HttpUrl url, std::string api_key = "");

  // POSTs `body` (JSON) to `target` (a path, with a query when the route
  // takes its parameters there) and checks the answer as described above.
  boost::asio::awaitable<absl::Status> Post(std::string_view target, std::string body,
                                            std::chrono::milliseconds timeout);

  // POSTs like Post() and hands back the answer when it succeeded.
  boost::asio::awaitable<absl::StatusOr<HttpResponse>> PostForAnswer(
      std::string_view target, std::string body, std::chrono::milliseconds timeout);

  // GET `target`: the answer whatever its status, or Unavailable (naming
  // the engine and route) when the engine did not answer within `timeout`.
  boost::asio::awaitable<absl::StatusOr<HttpResponse>> Get(std::string_view target,
                                                           std::chrono::milliseconds timeout);

  // GET /health (or `target`): OK on 200, Unavailable otherwise.
  boost::asio::awaitable<absl::Status> Health(std::string_view target,
                                              std::chrono::milliseconds timeout);

  const HttpUrl& url() const { return url_; }
  // "engine http://host:port: <method> <target>", for messages.
  std::string Where(std::string_view method, std::string_view target) const;

 private:
  HttpRequest Request(std::string method, std::string_view target) const;

  const HttpUrl url_;
  const std::string api_key_;
  HttpClient client_;
};

}  // namespace stitch

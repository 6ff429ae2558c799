#include "stitch/engine/engine_http.h"

#include <utility>

#include <boost/json/object.hpp>
#include <boost/json/parse.hpp>
#include <boost/json/serialize.hpp>

#include "absl/strings/str_cat.h"
#include "stitch/core/errors.h"
#include "stitch/net/auth.h"

namespace stitch {

namespace json = boost::json;
using boost::asio::awaitable;

namespace {

// False when the answer carries `"success": false`.
bool AnswerSucceeded(const HttpResponse& r) {
  boost::system::error_code ec;
  json::value v = json::parse(r.body, ec);
  if (ec || !v.is_object()) return true;
  const json::value* success = v.get_object().if_contains("success");
  return success == nullptr || !success->is_bool() || success->get_bool();
}

// Whether a refusal says the engine undid what it was asked to do (and so
// still holds what it held): `"undone": true`.
bool AnswerSaysUndone(const HttpResponse& r) {
  boost::system::error_code ec;
  json::value v = json::parse(r.body, ec);
  if (ec || !v.is_object()) return false;
  const json::value* undone = v.get_object().if_contains("undone");
  return undone != nullptr && undone->is_bool() && undone->get_bool();
}

}  // namespace

std::string EngineMessage(const HttpResponse& r) {
  boost::system::error_code ec;
  json::value v = json::parse(r.body, ec);
  if (!ec && v.is_object()) {
    for (std::string_view key : {"message", "error", "detail"}) {
      if (const json::value* m = v.get_object().if_contains(key); m != nullptr) {
        if (m->is_string()) return std::string(m->get_string().data(), m->get_string().size());
        if (m->is_object()) {
          if (const json::value* inner = m->get_object().if_contains("message");
              inner != nullptr && inner->is_string()) {
            return std::string(inner->get_string().data(), inner->get_string().size());
          }
        }
        return json::serialize(*m);
      }
    }
  }
  constexpr size_t kMax = 300;
  return r.body.size() <= kMax ? r.body : absl::StrCat(r.body.substr(0, kMax), "...");
}

absl::StatusOr<EngineReport> ReportFromAnswer(const HttpResponse& answer, std::string_view where) {
  if (answer.status != 200) {
    return absl::UnavailableError(
        absl::StrCat(AbslView(where), ": HTTP ", answer.status, ": ", EngineMessage(answer)));
  }
  absl::StatusOr<EngineReport> report = ParseEngineReport(answer.body);
  if (!report.ok()) return Annotate(report.status(), where);
  return report;
}

EngineHttp::EngineHttp(boost::asio::any_io_executor executor, HttpUrl url, std::string api_key)
    : url_(std::move(url)), api_key_(std::move(api_key)), client_(std::move(executor)) {}

HttpRequest EngineHttp::Request(std::string method, std::string_view target) const {
  HttpRequest request;
  request.method = std::move(method);
  request.target = std::string(target);
  if (!api_key_.empty()) request.headers.Set("Authorization", BearerValue(api_key_));
  return request;
}

std::string EngineHttp::Where(std::string_view method, std::string_view target) const {
  return absl::StrCat("engine ", url_.origin.ToString(), ": ", AbslView(method), " ",
                      AbslView(target));
}

awaitable<absl::StatusOr<HttpResponse>> EngineHttp::PostForAnswer(
    std::string_view target, std::string body, std::chrono::milliseconds timeout) {
  HttpRequest request = Request("POST", target);
  request.headers.Set("Content-Type", "application/json");
  request.body = std::move(body);
  CallOptions call;
  call.timeout = timeout;
  auto response = co_await client_.Send(url_.origin, std::move(request), call);
  const std::string where = Where("POST", target);
  if (!response.ok()) {
    absl::Status s = response.status();
    if (absl::IsDeadlineExceeded(s) || absl::IsUnavailable(s)) {
      co_return absl::UnavailableError(absl::StrCat(where, ": ", s.message()));
    }
    co_return Annotate(s, where);
  }
  if (response->status < 200 || response->status >= 300 || !AnswerSucceeded(*response)) {
    if (AnswerSaysUndone(*response)) {
      co_return absl::AbortedError(absl::StrCat(where, " failed and was undone (HTTP ",
                                                response->status, "): ", EngineMessage(*response)));
    }
    co_return absl::InternalError(
        absl::StrCat(where, " refused (HTTP ", response->status, "): ", EngineMessage(*response)));
  }
  co_return response;
}

awaitable<absl::Status> EngineHttp::Post(std::string_view target, std::string body,
                                         std::chrono::milliseconds timeout) {
  absl::StatusOr<HttpResponse> answer = co_await PostForAnswer(target, std::move(body), timeout);
  co_return answer.status();
}

awaitable<absl::StatusOr<HttpResponse>> EngineHttp::Get(std::string_view target,
                                                        std::chrono::milliseconds timeout) {
  HttpRequest request = Request("GET", target);
  CallOptions call;
  call.timeout = timeout;
  auto response = co_await client_.Send(url_.origin, std::move(request), call);
  if (!response.ok()) {
    co_return absl::UnavailableError(
        absl::StrCat(Where("GET", target), ": ", response.status().message()));
  }
  co_return response;
}

awaitable<absl::Status> EngineHttp::Health(std::string_view target,
                                           std::chrono::milliseconds timeout) {
  auto response = co_await Get(target, timeout);
  if (!response.ok()) co_return response.status();
  if (response->status != 200) {
    co_return absl::UnavailableError(absl::StrCat(Where("GET", target), ": HTTP ", response->status,
                                                  ": ", EngineMessage(*response)));
  }
  co_return absl::OkStatus();
}

}  // namespace stitch

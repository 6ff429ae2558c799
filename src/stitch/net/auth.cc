#include "stitch/net/auth.h"

#include <cstdlib>
#include <fstream>
#include <sstream>
#include <utility>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "stitch/core/errors.h"

namespace stitch {

absl::StatusOr<std::string> LoadBearerToken(std::string_view file, std::string_view env,
                                            std::string_view flag) {
  std::string token;
  if (!file.empty()) {
    std::ifstream in{std::string(file)};
    std::ostringstream text;
    text << in.rdbuf();
    if (!in) {
      return absl::InvalidArgumentError(absl::StrCat(AbslView(flag), ": cannot read ",
                                                     AbslView(file),
                                                     "; give a readable file holding the token"));
    }
    token = std::string(absl::StripAsciiWhitespace(text.str()));
  } else if (const char* value = std::getenv(std::string(env).c_str()); value != nullptr) {
    token = std::string(absl::StripAsciiWhitespace(value));
    if (token.empty()) return std::string();
  } else {
    return std::string();
  }
  if (token.empty() || absl::StrContains(token, "\n") || absl::StrContains(token, "\r")) {
    return absl::InvalidArgumentError(absl::StrCat(
        AbslView(flag), ": ", file.empty() ? absl::StrCat("$", AbslView(env)) : std::string(file),
        " must hold one non-empty line, the token"));
  }
  return token;
}

bool PresentsBearerToken(const HttpHeaders& headers, std::string_view token) {
  std::string_view presented;
  if (std::optional<std::string_view> value = headers.Get("authorization")) {
    constexpr std::string_view kScheme = "bearer ";
    if (value->size() >= kScheme.size() &&
        absl::EqualsIgnoreCase(AbslView(value->substr(0, kScheme.size())), AbslView(kScheme))) {
      presented = value->substr(kScheme.size());
    }
  }
  // Every byte of the token is compared whatever the presented value, and
  // a length difference is folded in the same way.
  unsigned char diff = presented.size() == token.size() ? 0 : 1;
  for (size_t i = 0; i < token.size(); ++i) {
    const unsigned char p = i < presented.size() ? static_cast<unsigned char>(presented[i]) : 0;
    diff |= static_cast<unsigned char>(p ^ static_cast<unsigned char>(token[i]));
  }
  return diff == 0;
}

HeadPredicate HoldsBearerToken(std::string token) {
  if (token.empty()) return {};
  return [token = std::move(token)](const HttpRequest& head) {
    return PresentsBearerToken(head.headers, token);
  };
}

std::string BearerValue(std::string_view token) { return absl::StrCat("Bearer ", AbslView(token)); }

HttpResponse UnauthorizedResponse(std::string_view what) {
  HttpResponse response = JsonResponse(
      401, JsonErrorBody("Unauthorized",
                         absl::StrCat(AbslView(what),
                                      " needs the bearer token: send \"Authorization: Bearer "
                                      "<token>\" with the token this server was started with")));
  response.headers.Set("WWW-Authenticate", "Bearer");
  return response;
}

}  // namespace stitch

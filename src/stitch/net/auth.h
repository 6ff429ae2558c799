// Bearer tokens: what closes a sidecar's or a gateway's routes to strangers
// (docs/sidecar.md, "Bearer tokens").
//
// A token is read once at start from a file (its first line, without
// surrounding whitespace) or from an environment variable. A request
// presents it as "Authorization: Bearer <token>"; the comparison takes the
// same time whatever the presented value, so that timing tells nothing
// about the token. A request without it gets 401 {"error": {"type": "Unauthorized"}}
// with "WWW-Authenticate: Bearer".
#pragma once

#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "stitch/net/http.h"
#include "stitch/net/server.h"

namespace stitch {

// The environment variable read when no token file is given.
inline constexpr std::string_view kAuthTokenEnv = "STITCH_AUTH_TOKEN";

// The token in `file` when it is not empty, else the value of the
// environment variable `env` when set and not empty, else "" (no token).
// Errors (InvalidArgument, naming `flag`): a file that cannot be read, or an
// empty or multi-line token.
[[nodiscard]] absl::StatusOr<std::string> LoadBearerToken(std::string_view file,
                                                          std::string_view env,
                                                          std::string_view flag);

// Whether `headers` carry "Authorization: Bearer <token>" (the scheme's case
// ignored). Constant time in the token's length. REQUIRES: token not empty.
bool PresentsBearerToken(const HttpHeaders& headers, std::string_view token);

// ServerOptions::holds_credential for a server closed with `token`: whether
// a request presents it. Empty (no request holds one) when `token` is.
HeadPredicate HoldsBearerToken(std::string token);

// "Bearer <token>", the Authorization header's value.
std::string BearerValue(std::string_view token);

// The 401 answer to a request without the token: `what` names the route.
HttpResponse UnauthorizedResponse(std::string_view what);

// Routes behind a token: HttpRouter::Add's `token` (server.h), whose
// TokenCheck() refuses strangers at the header.

}  // namespace stitch

// A versioned request on its way to an engine: what its body asks for, the
// request ids the engine sees, and the tags that keep versions apart in the
// engine's prefix cache (docs/sidecar.md, "HTTP API").
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "stitch/api/routes.h"
#include "stitch/core/constraint.h"
#include "stitch/core/version.h"

namespace boost::json {
class object;
class value;
}  // namespace boost::json

namespace stitch {

// What the JSON body of a versioned route asks for besides the generation.
struct VersionedAsk {
  VersionConstraint constraint;  // empty without `weight_version`
  bool stream = false;           // `stream: true`
};

// Parses the body of a versioned route into `doc` (an object; its
// `weight_version` is left in it: StripConstraint removes it).
// InvalidArgument, with the message of the 400 BadRequest to answer, when
// the body is not a JSON object, its constraint is malformed or gives both
// versions, or `weight_version` or one of its fields is given twice
// (ParseVersionedBodyJson in core/json.h).
[[nodiscard]] absl::StatusOr<VersionedAsk> ParseVersionedBody(std::string_view body,
                                                              boost::json::value& doc);

// The same, for a hop that passes the body on unchanged: the parsed
// document is freed before it returns.
[[nodiscard]] absl::StatusOr<VersionedAsk> ReadVersionedAsk(std::string_view body);

// `body` (a JSON object) with its `weight_version` set to `constraint`'s
// JSON form, replacing any previous value (an empty constraint removes the
// field); other fields are kept. How a gateway passes on a default
// constraint it applied, and how a trainer constrains its requests.
// InvalidArgument when `body` is not valid JSON or not a JSON object.
[[nodiscard]] absl::StatusOr<std::string> WithConstraint(std::string_view body,
                                                         const VersionConstraint& constraint);

// The first `n` bytes of a request's prompt as its JSON text: of the first
// of `text`, `input_ids`, `prompt`, `messages` that `body` has (a chat's
// earlier turns come first, so a session's requests share this prefix);
// "" when it has none or is not a JSON object.
std::string PromptPrefix(std::string_view body, size_t n);

// Removes `weight_version`: it is the sidecar's to consume, never the
// engine's.
void StripConstraint(boost::json::object& body);

// The request ids of one versioned request: what the engine sees, one per
// prompt (several for a batched /generate), and the client's own for each
// ("" where it gave none).
struct EngineRids {
  std::vector<std::string> engine;
  std::vector<std::string> client;
};

// Gives the request ids of its own to `body` (its `rid`), built on `base`,
// an id of fixed width never given before ("stitch-<8 hex>-<16 hex>"): for
// one prompt "<base>" followed by "-<the client's rid>" when it gave one;
// for each prompt of a batched /generate "<base>-<index>" (zero-padded to
// one width) and then "-<the client's rid>" for that prompt. All ids are of
// one width up to the client's part, so that none is a prefix of another:
// engines abort every request whose id starts with the one given.
// InvalidArgument, with the message of the 400 to answer, when `rid` is not
// a string (a list of one string per prompt for a batch). With `field`
// kRequestId the same holds of `request_id`, and there is no batch.
// Which body field carries an engine's request id: SGLang's `rid`, or
// vLLM's `request_id` (one string: vLLM serves no batched /generate).
enum class EngineRidField { kRid, kRequestId };
[[nodiscard]] absl::StatusOr<EngineRids> AssignEngineRids(
    ApiRoute route, boost::json::object& body, std::string_view base,
    EngineRidField field = EngineRidField::kRid);

// The prefix that isolates one serving version in an engine's prefix cache:
// "wv<version>.<32 hex digits hashing the run id>:" (at most 48 bytes, none
// of vLLM's forbidden characters '@', '/', '\\' and NUL).
std::string CacheIsolationPrefix(const VersionRef& serving);

// The longest salt vLLM accepts.
inline constexpr size_t kMaxIsolationKeyBytes = 128;

// The key for a caller's own value `own` (may be empty): the prefix, then
// `own` when both fit in kMaxIsolationKeyBytes, else "h" and 32 hex digits
// hashing `own`. Distinct (serving, own) pairs give distinct keys (up to
// 128-bit hash collisions); `own` is never dropped.
std::string IsolationKey(const VersionRef& serving, std::string_view own);

// Tags a versioned request so that the engine's prefix cache never mixes
// versions: /generate gets SGLang's `extra_key`, the OpenAI routes
// `cache_salt` (vLLM's), each IsolationKey(serving, the caller's own
// value). A list of values (one per prompt of a batched /generate) has each
// item tagged; a caller's value that is not a string is replaced.
void TagRequest(ApiRoute route, boost::json::object& body, const VersionRef& serving);

}  // namespace stitch

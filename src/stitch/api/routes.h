// The routes of the versioned rollout API (docs/design.md, "The rollout API"),
// as every party that serves them classifies a request path: the sidecar,
// the gateway and the reference engine.
//
//   versioned  POST /generate (SGLang), /v1/completions and
//              /v1/chat/completions (OpenAI), /inference/v1/generate (vLLM's
//              tokens in, tokens out): a body may carry `weight_version`,
//              and the response reports the versions that produced it
//   blocked    the engine's control routes, SGLang's and vLLM's (weight
//              updates, pause, flush, abort, memory, sleep, RPC, profiling,
//              LoRA): only a replica's sidecar
//              drives its engine, so nothing in front of it forwards them
//   read-only  the engine's read-only routes (health, readiness, model
//              listing, metrics, tokenization), per engine dialect:
//              forwarded as they are
//   refused    everything else: the engines' generation routes that carry
//              no version (/invocations, /v1/responses, ...) and any route
//              not named here; nothing unnamed reaches an engine
//
// Paths are classified as the engines behind a sidecar read them, not as
// they were sent: an engine served by uvicorn decodes `/%70ause_generation`
// into `/pause_generation`, so a path is percent-decoded and normalized
// first (CanonicalizeTarget), and what is forwarded is that canonical form,
// so the engine reads the very path that was classified.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace stitch {

// The versioned routes; they decide how requests are tagged and responses
// stamped (request.h, response.h).
enum class ApiRoute {
  kGenerate,         // POST /generate (SGLang)
  kCompletions,      // POST /v1/completions (OpenAI)
  kChatCompletions,  // POST /v1/chat/completions (OpenAI)
  kTokens,           // POST /inference/v1/generate (vLLM, with --enable-scale-out)
};
// The routes both of the reference engine's dialects serve.
inline constexpr ApiRoute kApiRoutes[] = {ApiRoute::kGenerate, ApiRoute::kCompletions,
                                          ApiRoute::kChatCompletions};
// Every versioned route.
inline constexpr ApiRoute kVersionedRoutes[] = {ApiRoute::kGenerate, ApiRoute::kCompletions,
                                                ApiRoute::kChatCompletions, ApiRoute::kTokens};

// "/generate", "/v1/completions", "/v1/chat/completions",
// "/inference/v1/generate".
std::string_view RoutePath(ApiRoute route);

enum class RouteClass { kVersioned, kBlocked, kOther };

struct ClassifiedRoute {
  RouteClass kind = RouteClass::kOther;
  std::optional<ApiRoute> api;  // set for kVersioned only
};

// What a request path is. `path` is a canonical path (CanonicalTarget::path:
// decoded and normalized). Versioned paths match exactly; an engine control
// route also with trailing slashes and in any letter case.
ClassifiedRoute ClassifyRoute(std::string_view path);

// The API dialect of the engine behind a sidecar (the reference engine
// speaks either): which of its unversioned routes are forwarded.
enum class EngineDialect { kSglang, kVllm };
inline constexpr EngineDialect kEngineDialects[] = {EngineDialect::kSglang, EngineDialect::kVllm};

// "sglang", "vllm".
std::string_view DialectName(EngineDialect dialect);

// The read-only routes of `dialect` forwarded as they are, sorted: health
// and readiness, model listing, server info and load, metrics,
// tokenization. "/v1/models/" is a prefix (one model's card).
std::span<const std::string_view> ReadOnlyRoutes(EngineDialect dialect);

// Why the canonical `path`, neither versioned nor a control route, is not
// forwarded to an engine of any of `dialects` (for a 403's message); nullopt
// when it is one of their read-only routes.
std::optional<std::string> NotForwardedWhy(std::string_view path,
                                           std::span<const EngineDialect> dialects);

// A request target in the one form every hop agrees on.
struct CanonicalTarget {
  // The path percent-decoded, with "." and ".." segments resolved and runs
  // of slashes collapsed (a trailing slash is kept): what is classified.
  std::string path;
  // `path` percent-encoded again where needed, followed by the target's
  // query as it was sent: what is forwarded.
  std::string target;
};

// The canonical form of an origin-form `target` ("/path?query"). The
// InvalidArgument message (one line, for a 400) names what is refused: a
// fragment ('#'), a '%' not followed by two hex digits anywhere in the
// target, any other character a target may not hold, a decoded path with a
// control character (NUL included), or ".." above the root.
[[nodiscard]] absl::StatusOr<CanonicalTarget> CanonicalizeTarget(std::string_view target);

// Between replicas: the route on which a sidecar serves the version files
// its store verified, GET kPeerFileRoute?version=N&name=FILE[&wait_ms=T]
// (docs/deploy.md, "Peers before the store"). With wait_ms (at most
// kPeerMaxWaitMs), a peer that does not hold the file yet waits up to that
// long for it before answering 404. A request whose kPeerIdHeader is the
// peer's own id is answered 409 at once: the replica asked itself. The
// fetch room (fetch/peer_client.h) asks it; the sidecar answers it.
inline constexpr std::string_view kPeerFileRoute = "/peer/v1/file";

// A sidecar's evaluation holds (docs/deploy.md, "Long runs"), behind the
// fleet's token: POST kHoldRoute?version=N&holder=NAME keeps the replica on
// version N of the run it follows instead of the pointer; POST
// kReleaseRoute?holder=NAME lets it follow the pointer again. Both answer
// the replica's /server_info, with "held" set while it is held.
inline constexpr std::string_view kHoldRoute = "/admin/hold";
inline constexpr std::string_view kReleaseRoute = "/admin/release";
inline constexpr std::string_view kPeerIdHeader = "X-Stitch-Peer";
inline constexpr int64_t kPeerMaxWaitMs = 30000;

}  // namespace stitch

// The routes of the versioned rollout API (docs/design.md, "HTTP contracts"),
// as every party that serves them classifies a request path: the sidecar,
// the gateway and the reference engine.
//
//   versioned  POST /generate (SGLang), /v1/completions and
//              /v1/chat/completions (OpenAI): a body may carry
//              `weight_version`, and the response reports the versions that
//              produced it
//   blocked    the engine's control routes, SGLang's and vLLM's (weight
//              updates, pause, flush, abort, memory, sleep, RPC, profiling,
//              LoRA): only a replica's sidecar
//              drives its engine, so nothing in front of it forwards them
//   other      everything else (/model_info, /v1/models, ...), forwarded as is
#pragma once

#include <string_view>

namespace stitch {

// The versioned routes; they decide how requests are tagged and responses
// stamped (request.h, response.h).
enum class ApiRoute {
  kGenerate,         // POST /generate (SGLang)
  kCompletions,      // POST /v1/completions (OpenAI)
  kChatCompletions,  // POST /v1/chat/completions (OpenAI)
};
inline constexpr ApiRoute kApiRoutes[] = {ApiRoute::kGenerate, ApiRoute::kCompletions,
                                          ApiRoute::kChatCompletions};

// "/generate", "/v1/completions", "/v1/chat/completions".
std::string_view RoutePath(ApiRoute route);

enum class RouteClass { kVersioned, kBlocked, kOther };

struct ClassifiedRoute {
  RouteClass kind = RouteClass::kOther;
  ApiRoute api = ApiRoute::kGenerate;  // meaningful for kVersioned only
};

// What a request path is. `path` is a target's path (TargetPath()), still
// percent-encoded. Versioned paths match exactly; an engine control route
// also with trailing slashes.
ClassifiedRoute ClassifyRoute(std::string_view path);

}  // namespace stitch

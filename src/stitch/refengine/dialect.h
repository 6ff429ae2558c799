// The dialects of the reference engine's HTTP API, on their own so that
// callers that only choose one (the demo, the CLI) need not include the
// protocol.
#pragma once

#include <string_view>

#include "absl/status/statusor.h"

namespace stitch {

// Whose HTTP API the engine speaks (docs/engine.md): SGLang's (its routes,
// Stitch's staging routes, SGLang's bodies) or vLLM's (its OpenAI server and
// its development and RL routes, vLLM's bodies and error shape).
enum class EngineApi { kSglang, kVllm };
// "sglang", "vllm".
std::string_view EngineApiName(EngineApi api);
[[nodiscard]] absl::StatusOr<EngineApi> ParseEngineApi(std::string_view name);

}  // namespace stitch

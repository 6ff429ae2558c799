#include "stitch/refengine/dialect.h"

#include "absl/strings/str_cat.h"
#include "stitch/core/errors.h"

namespace stitch {

std::string_view EngineApiName(EngineApi api) {
  return api == EngineApi::kVllm ? "vllm" : "sglang";
}

absl::StatusOr<EngineApi> ParseEngineApi(std::string_view name) {
  if (name == "sglang") return EngineApi::kSglang;
  if (name == "vllm") return EngineApi::kVllm;
  return absl::InvalidArgumentError(
      absl::StrCat("unknown engine API \"", AbslView(name), "\" (expected sglang|vllm)"));
}

}  // namespace stitch

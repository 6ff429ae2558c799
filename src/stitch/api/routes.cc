#include "stitch/api/routes.h"

namespace stitch {
namespace {

// SGLang's control surface, and Stitch's own staging routes.
constexpr std::string_view kBlockedRoutes[] = {
    "/abort_request",
    "/continue_generation",
    "/flush_cache",
    "/init_weights_update_group",
    "/load_lora_adapter",
    "/pause_generation",
    "/release_memory_occupation",
    "/resume_memory_occupation",
    "/set_internal_state",
    "/stage_weight_update",
    "/start_profile",
    "/stop_profile",
    "/unload_lora_adapter",
    "/update_weight_version",
    "/update_weights_from_cpu",
    "/update_weights_from_disk",
    "/update_weights_from_distributed",
    "/update_weights_from_ipc",
    "/update_weights_from_tensor",
};

}  // namespace

std::string_view RoutePath(ApiRoute route) {
  switch (route) {
    case ApiRoute::kGenerate:
      return "/generate";
    case ApiRoute::kCompletions:
      return "/v1/completions";
    case ApiRoute::kChatCompletions:
      return "/v1/chat/completions";
  }
  return "";
}

ClassifiedRoute ClassifyRoute(std::string_view path) {
  for (ApiRoute route : kApiRoutes) {
    if (path == RoutePath(route)) return {RouteClass::kVersioned, route};
  }
  while (path.size() > 1 && path.back() == '/') path.remove_suffix(1);
  for (std::string_view blocked : kBlockedRoutes) {
    if (path == blocked) return {RouteClass::kBlocked};
  }
  return {RouteClass::kOther};
}

}  // namespace stitch

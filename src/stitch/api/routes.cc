#include "stitch/api/routes.h"

namespace stitch {
namespace {

// SGLang's control surface, vLLM's (its development and RL routes), and
// Stitch's own staging routes. Sorted.
constexpr std::string_view kBlockedRoutes[] = {
    "/abort_request",
    "/abort_requests",
    "/collective_rpc",
    "/continue_generation",
    "/finish_weight_update",
    "/flush_cache",
    "/init_weight_transfer_engine",
    "/init_weights_update_group",
    "/load_lora_adapter",
    "/pause",
    "/pause_generation",
    "/reconfigure",
    "/release_memory_occupation",
    "/reset_mm_cache",
    "/reset_prefix_cache",
    "/resume",
    "/resume_memory_occupation",
    "/scale_elastic_ep",
    "/set_internal_state",
    "/sleep",
    "/stage_weight_update",
    "/start_draft_weight_update",
    "/start_profile",
    "/start_weight_update",
    "/stop_profile",
    "/unload_lora_adapter",
    "/update_weight_version",
    "/update_weights",
    "/update_weights_from_cpu",
    "/update_weights_from_disk",
    "/update_weights_from_distributed",
    "/update_weights_from_ipc",
    "/update_weights_from_tensor",
    "/v1/load_lora_adapter",
    "/v1/unload_lora_adapter",
    "/wake_up",
    "/weight_checker",
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

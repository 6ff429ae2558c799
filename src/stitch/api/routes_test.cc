#include "stitch/api/routes.h"

#include <gtest/gtest.h>

namespace stitch {
namespace {

TEST(RoutesTest, VersionedRoutesAreClassifiedByTheirExactPath) {
  for (ApiRoute route : kApiRoutes) {
    const ClassifiedRoute c = ClassifyRoute(RoutePath(route));
    EXPECT_EQ(c.kind, RouteClass::kVersioned) << RoutePath(route);
    EXPECT_EQ(c.api, route);
  }
  EXPECT_EQ(ClassifyRoute("/generate/").kind, RouteClass::kOther);
  EXPECT_EQ(ClassifyRoute("/v1/completions/x").kind, RouteClass::kOther);
}

TEST(RoutesTest, EngineControlRoutesAreBlockedWithOrWithoutATrailingSlash) {
  for (const char* path : {"/update_weights_from_disk", "/update_weights_from_disk//",
                           "/pause_generation", "/abort_request", "/stage_weight_update",
                           "/update_weights_from_cpu", "/flush_cache", "/start_profile"}) {
    EXPECT_EQ(ClassifyRoute(path).kind, RouteClass::kBlocked) << path;
  }
}

TEST(RoutesTest, VllmControlRoutesAreBlocked) {
  for (const char* path : {"/pause", "/resume", "/collective_rpc", "/update_weight_version",
                           "/abort_requests", "/reset_prefix_cache", "/sleep", "/wake_up/"}) {
    EXPECT_EQ(ClassifyRoute(path).kind, RouteClass::kBlocked) << path;
  }
}

TEST(RoutesTest, EverythingElseIsForwarded) {
  for (const char* path :
       {"/", "/model_info", "/get_model_info", "/v1/models", "/health",
        "/update_weights_from_disk_x", "/is_paused", "/weight_info", "/metrics"}) {
    EXPECT_EQ(ClassifyRoute(path).kind, RouteClass::kOther) << path;
  }
}

}  // namespace
}  // namespace stitch

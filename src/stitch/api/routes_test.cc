#include "stitch/api/routes.h"

#include <string>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

namespace stitch {
namespace {

TEST(RoutesTest, VersionedRoutesAreClassifiedByTheirExactPath) {
  for (ApiRoute route : kVersionedRoutes) {
    const ClassifiedRoute c = ClassifyRoute(RoutePath(route));
    EXPECT_EQ(c.kind, RouteClass::kVersioned) << RoutePath(route);
    EXPECT_EQ(c.api, route);
  }
  EXPECT_EQ(ClassifyRoute("/inference/v1/generate").api, ApiRoute::kTokens);
  EXPECT_EQ(ClassifyRoute("/generate/").kind, RouteClass::kOther);
  EXPECT_EQ(ClassifyRoute("/generate/").api, std::nullopt);
  EXPECT_EQ(ClassifyRoute("/pause_generation").api, std::nullopt);
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
  for (const char* path :
       {"/pause", "/resume", "/collective_rpc", "/update_weight_version", "/abort_requests",
        "/reset_prefix_cache", "/sleep", "/wake_up/", "/inference/v1/abort_requests"}) {
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

TEST(RoutesTest, ControlRoutesAreBlockedInAnyLetterCase) {
  for (const char* path : {"/PAUSE", "/Pause_Generation", "/UPDATE_WEIGHTS_FROM_DISK/"}) {
    EXPECT_EQ(ClassifyRoute(path).kind, RouteClass::kBlocked) << path;
  }
}

std::string CanonicalPath(std::string_view target) {
  absl::StatusOr<CanonicalTarget> c = CanonicalizeTarget(target);
  EXPECT_TRUE(c.ok()) << target << ": " << c.status();
  return c.ok() ? c->path : std::string();
}

// Engines served by uvicorn decode the path before routing: the sidecar
// classifies what they will read.
TEST(RoutesTest, EncodedDottedAndDoubledPathsAreClassifiedAsTheEngineReadsThem) {
  for (const char* target :
       {"/%70ause_generation", "/%75pdate_weights_from_disk", "/%2Fpause", "//pause", "/x/../pause",
        "/./flush_cache", "/v1/%2E%2E/pause", "/flush_cache?%41=1", "/%2570ause_generation/.."}) {
    const std::string path = CanonicalPath(target);
    if (std::string_view(target) == "/%2570ause_generation/..") {
      // One decoding only: "%25" is a literal '%', as the engine reads it.
      EXPECT_EQ(path, "/") << target;
      continue;
    }
    EXPECT_EQ(ClassifyRoute(path).kind, RouteClass::kBlocked) << target << " -> " << path;
  }
  EXPECT_EQ(ClassifyRoute(CanonicalPath("/v1//completions")).api, ApiRoute::kCompletions);
  EXPECT_EQ(ClassifyRoute(CanonicalPath("/%67enerate")).kind, RouteClass::kVersioned);
}

TEST(RoutesTest, TheForwardedTargetDecodesToTheClassifiedPath) {
  absl::StatusOr<CanonicalTarget> c = CanonicalizeTarget("/%67et_model_info?a=%20b&c");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->path, "/get_model_info");
  EXPECT_EQ(c->target, "/get_model_info?a=%20b&c");
  c = CanonicalizeTarget("/a%3Fb%25/c%20d/");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->path, "/a?b%/c d/");
  EXPECT_EQ(c->target, "/a%3Fb%25/c%20d/");
  c = CanonicalizeTarget("/");
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->target, "/");
}

TEST(RoutesTest, FragmentsBadEscapesAndControlCharactersAreRefused) {
  for (const char* target : {"/flush_cache#f", "/flush_cache?%zz", "/%7", "/pause%zz", "/a%00b",
                             "/a%0Ab", "/../pause", "/a b"}) {
    absl::StatusOr<CanonicalTarget> c = CanonicalizeTarget(target);
    EXPECT_TRUE(absl::IsInvalidArgument(c.status())) << target;
  }
  EXPECT_THAT(std::string(CanonicalizeTarget("/flush_cache#f").status().message()),
              ::testing::HasSubstr("fragment"));
}

}  // namespace
}  // namespace stitch

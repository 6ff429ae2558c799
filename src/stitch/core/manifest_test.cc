#include "stitch/core/manifest.h"

#include <gtest/gtest.h>

namespace stitch {
namespace {

TEST(ValidatePayloadFileName, AcceptsRelativeNames) {
  EXPECT_TRUE(ValidatePayloadFileName("model-00001-of-00002.safetensors").ok());
  EXPECT_TRUE(ValidatePayloadFileName("shards/a.safetensors").ok());
  EXPECT_TRUE(ValidatePayloadFileName("..hidden").ok());
}

TEST(ValidatePayloadFileName, RejectsUnsafeNames) {
  for (std::string name :
       {std::string(""), std::string("/etc/passwd"), std::string("../x"), std::string("a/../../b"),
        std::string("a/./b"), std::string("a//b"), std::string("a\\b"), std::string("a/"),
        std::string(".."), std::string("a\0b", 3), std::string(256, 'x')}) {
    absl::Status s = ValidatePayloadFileName(name);
    EXPECT_FALSE(s.ok()) << name;
    EXPECT_NE(s.message().find("unsafe file name"), std::string::npos) << s;
  }
}

TEST(VersionManifest, EmptyDelta) {
  VersionManifest m{3, VersionKind::kDelta, 2, {}};
  EXPECT_TRUE(m.is_empty_delta());
  m.files.push_back("a.safetensors");
  EXPECT_FALSE(m.is_empty_delta());
  VersionManifest full{3, VersionKind::kFull, std::nullopt, {}};
  EXPECT_FALSE(full.is_empty_delta());
  EXPECT_EQ(VersionKindName(VersionKind::kDelta), "DELTA");
}

}  // namespace
}  // namespace stitch

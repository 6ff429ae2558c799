#include "stitch/store/s3/s3_sigv4.h"

#include <gtest/gtest.h>

namespace stitch {
namespace {

TEST(SigV4EncodeTest, KeepsOnlyUnreservedCharacters) {
  EXPECT_EQ(SigV4Encode("AZaz09-._~", SlashEncoding::kEncode), "AZaz09-._~");
  EXPECT_EQ(SigV4Encode("a/b c", SlashEncoding::kKeep), "a/b%20c");
  EXPECT_EQ(SigV4Encode("a/b c", SlashEncoding::kEncode), "a%2Fb%20c");
  EXPECT_EQ(SigV4Encode("\xc3\xa9", SlashEncoding::kEncode), "%C3%A9");
}

}  // namespace
}  // namespace stitch

#include "stitch/core/stable_hash.h"

#include <gtest/gtest.h>

namespace stitch {
namespace {

// The values are part of the wire: replicas built apart must choose the same
// owner for a file, and gateways the same ring. They are FNV-1a then
// splitmix64's finaliser, as computed independently.
TEST(StableHash, GivesTheSameValuesEverywhere) {
  EXPECT_EQ(StableHash(""), 0xf52a15e9a9b5e89bULL);
  EXPECT_EQ(StableHash("a"), 0x02c0bdbf481420f8ULL);
  EXPECT_EQ(StableHash("http://10.0.0.7:8000\n12/model-00001-of-00004.safetensors"),
            0xc96dd926a4fbe39fULL);
  EXPECT_EQ(StableMix(0), 0u);
  EXPECT_EQ(StableMix(1), 0x5692161d100b05e5ULL);
}

}  // namespace
}  // namespace stitch

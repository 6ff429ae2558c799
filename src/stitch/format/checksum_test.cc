#include "stitch/format/checksum.h"

#include <gtest/gtest.h>
#include <xxhash.h>

#include <string>
#include <vector>

#include "stitch/format/xxh3_ops.h"

namespace stitch {
namespace {

std::span<const std::byte> Bytes(std::string_view s) { return std::as_bytes(std::span(s)); }

// Expected values from Python: xxhash.xxh3_128(data).hexdigest().
TEST(ChecksumTest, MatchesPythonHexdigest) {
  EXPECT_EQ(Xxh3Checksum({}).ToHex(), "99aa06d3014798d86001c324468d497f");
  EXPECT_EQ(Xxh3Checksum(Bytes("stitch")).ToHex(), "bd5168b7a7ec9a83ce025a558e6bfe02");
  std::vector<std::byte> big;
  for (int r = 0; r < 1000; ++r) {
    for (int i = 0; i < 256; ++i) big.push_back(static_cast<std::byte>(i));
  }
  EXPECT_EQ(Xxh3Checksum(big).ToHex(), "548512d98989de2d776474c39d20f9aa");
}

TEST(ChecksumTest, StreamingEqualsOneShotWhateverThePieces) {
  std::vector<std::byte> data(300'000);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<std::byte>(i * 31 + (i >> 9));
  const Checksum128 whole = Xxh3Checksum(data);
  for (size_t piece : {size_t{1}, size_t{7}, size_t{240}, size_t{4096}, size_t{131072}}) {
    Xxh3Hasher h;
    for (size_t off = 0; off < data.size(); off += piece) {
      h.Update(std::span(data).subspan(off, std::min(piece, data.size() - off)));
    }
    EXPECT_EQ(h.Digest(), whole) << "piece " << piece;
  }
  Xxh3Hasher h;
  h.Update(Bytes("junk"));
  h.Reset();
  h.Update(data);
  EXPECT_EQ(h.Digest(), whole);
}

// Both builds of xxh3 (xxh3_ops.h) agree with libxxhash on every size
// class xxh3 treats apart (0, 1-3, 4-8, 9-16, 17-128, 129-240, longer, and
// across its 1 KiB stripes and internal buffer), one-shot and streamed.
TEST(ChecksumTest, EveryBuildOfXxh3AgreesWithLibxxhash) {
  std::vector<const format_internal::Xxh3Ops*> builds = {&format_internal::Xxh3OpsDefault()};
  if (format_internal::Xxh3OpsAvx2() != nullptr) builds.push_back(format_internal::Xxh3OpsAvx2());
  std::vector<unsigned char> data(70'000);
  for (size_t i = 0; i < data.size(); ++i) data[i] = static_cast<unsigned char>(i * 131 + (i >> 7));
  for (const format_internal::Xxh3Ops* ops : builds) {
    for (size_t n : {0, 1, 3, 4, 8, 9, 16, 17, 128, 129, 240, 241, 1024, 1025, 65536, 70000}) {
      const XXH128_hash_t want = XXH3_128bits(data.data(), n);
      uint64_t high = 0, low = 0;
      ops->hash(data.data(), n, high, low);
      EXPECT_EQ(high, want.high64) << n;
      EXPECT_EQ(low, want.low64) << n;
      format_internal::Xxh3State state;
      ops->reset(state);
      for (size_t off = 0; off < n; off += 333)
        ops->update(state, &data[off], std::min<size_t>(333, n - off));
      ops->digest(state, high, low);
      EXPECT_EQ(high, want.high64) << "streamed " << n;
      EXPECT_EQ(low, want.low64) << "streamed " << n;
    }
  }
}

TEST(ChecksumTest, HexRoundTripsAndRejectsMalformedText) {
  const Checksum128 c = Xxh3Checksum(Bytes("stitch"));
  absl::StatusOr<Checksum128> back = Checksum128::FromHex(c.ToHex());
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(*back, c);
  absl::StatusOr<Checksum128> upper = Checksum128::FromHex("BD5168B7A7EC9A83CE025A558E6BFE02");
  ASSERT_TRUE(upper.ok());
  EXPECT_EQ(*upper, c);
  for (std::string_view bad :
       {"", "bd5168b7", "bd5168b7a7ec9a83ce025a558e6bfe0", "bd5168b7a7ec9a83ce025a558e6bfe021",
        "zd5168b7a7ec9a83ce025a558e6bfe02", "bd5168b7a7ec9a83 e025a558e6bfe02"}) {
    absl::StatusOr<Checksum128> r = Checksum128::FromHex(bad);
    EXPECT_TRUE(absl::IsInvalidArgument(r.status())) << bad;
  }
}

}  // namespace
}  // namespace stitch

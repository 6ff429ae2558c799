#include "stitch/format/checksum.h"

#include <gtest/gtest.h>
#include <xxhash.h>

#include <map>
#include <string>
#include <utility>
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

// The fingerprint is defined byte for byte (so that other implementations
// can compute it): name, NUL, the checksum's 16 canonical bytes, per tensor
// in name order.
TEST(ChecksumTest, WeightsFingerprintHashesNamesAndChecksumsInNameOrder) {
  const Checksum128 a = Xxh3Checksum(Bytes("tensor a"));
  const Checksum128 b = Xxh3Checksum(Bytes("tensor b"));
  std::map<std::string, Checksum128, std::less<>> weights{{"b.weight", b}, {"a.weight", a}};
  std::string expected_input;
  for (const auto& [name, c] :
       {std::pair{std::string("a.weight"), a}, std::pair{std::string("b.weight"), b}}) {
    expected_input += name;
    expected_input.push_back('\0');
    const std::string hex = c.ToHex();
    for (size_t i = 0; i < 32; i += 2) {
      expected_input.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
    }
  }
  EXPECT_EQ(WeightsFingerprint(weights), Xxh3Checksum(Bytes(expected_input)));

  // Any change to a checksum or a name changes it; so does a missing tensor.
  const Checksum128 original = WeightsFingerprint(weights);
  auto changed = weights;
  changed["b.weight"] = Xxh3Checksum(Bytes("tensor b, one byte flipped"));
  EXPECT_NE(WeightsFingerprint(changed), original);
  auto renamed = weights;
  renamed.erase("b.weight");
  renamed["c.weight"] = b;
  EXPECT_NE(WeightsFingerprint(renamed), original);
  auto fewer = weights;
  fewer.erase("a.weight");
  EXPECT_NE(WeightsFingerprint(fewer), original);
  EXPECT_EQ(WeightsFingerprint({}), Xxh3Checksum({}));
}

}  // namespace
}  // namespace stitch

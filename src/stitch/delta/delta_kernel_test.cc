#include "stitch/delta/delta_kernel.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <zstd.h>

#include <atomic>
#include <chrono>
#include <random>
#include <stdexcept>
#include <thread>
#include <vector>

#include "stitch/core/errors.h"
#include "stitch/delta/delta_test_util.h"

namespace stitch {
namespace {

namespace fs = std::filesystem;

using testing::RandomBytes;

class VectorSink final : public FrameSink {
 public:
  absl::Status Append(std::span<const std::byte> b) override {
    bytes.insert(bytes.end(), b.begin(), b.end());
    return absl::OkStatus();
  }
  std::vector<std::byte> bytes;
};

std::vector<std::byte> Nudged(std::vector<std::byte> v, size_t every, uint64_t salt) {
  for (size_t i = salt % every; i < v.size(); i += every) v[i] ^= std::byte{0x01};
  return v;
}

struct Encoded {
  EncodedFrame info;
  std::vector<std::byte> frame;
};

Encoded Encode(std::span<const std::byte> base, std::span<const std::byte> target, int level = 1) {
  CodecWorkspace ws;
  MemorySource b(base), t(target);
  VectorSink sink;
  EncodeSpec spec{"w", base.size(), level};
  absl::StatusOr<EncodedFrame> r = EncodeXorFrame(ws, spec, b, t, sink);
  EXPECT_TRUE(r.ok()) << r.status();
  EXPECT_EQ(r->frame_size, sink.bytes.size());
  return Encoded{*r, sink.bytes};
}

FrameRef Ref(const std::vector<std::byte>& frame, std::string label = "frame") {
  return FrameRef{-1, 0, frame.size(), frame, std::move(label)};
}

// Sizes around the chunk boundaries, and empty.
class FoldSizeTest : public ::testing::TestWithParam<size_t> {};

TEST_P(FoldSizeTest, EncodeThenFoldReproducesTheTargetAndItsChecksum) {
  const size_t n = GetParam();
  std::vector<std::byte> base = RandomBytes(n, 1);
  std::vector<std::byte> target = Nudged(base, 97, 5);
  Encoded e = Encode(base, target);
  EXPECT_EQ(e.info.changed, n > 5);
  EXPECT_EQ(e.info.target_checksum, Xxh3Checksum(target));
  // A standard frame: content size recorded, decodable by plain zstd.
  EXPECT_EQ(ZSTD_getFrameContentSize(e.frame.data(), e.frame.size()), n);

  std::vector<std::byte> out = base;
  CodecWorkspace ws;
  MemorySource src(out);
  MemorySink sink(out);
  std::vector<FrameRef> frames{Ref(e.frame)};
  FoldSpec spec{"w", n, frames, e.info.target_checksum};
  absl::Status s = FoldFrames(ws, spec, src, sink);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(out, target);
}

INSTANTIATE_TEST_SUITE_P(Sizes, FoldSizeTest,
                         ::testing::Values(size_t{0}, size_t{1}, size_t{100}, kChunkBytes - 1,
                                           kChunkBytes, kChunkBytes + 1, 3 * kChunkBytes + 12345));

// An XOR stream whose non-zero bytes are separated by zero runs of the
// given lengths, cycled (a length and its position vary the parse: runs
// too short to be a match, runs at the start and end of zstd's 128 KiB
// blocks and of the 64-byte scan steps).
std::vector<std::byte> XorPattern(size_t n, std::span<const size_t> gaps, uint64_t seed) {
  std::vector<std::byte> x(n, std::byte{0});
  std::vector<std::byte> values = RandomBytes(n, seed);
  size_t at = gaps[0], k = 1;
  while (at < n) {
    x[at] = values[at] == std::byte{0} ? std::byte{0x5a} : values[at];
    at += 1 + gaps[k++ % gaps.size()];
  }
  return x;
}

TEST(DeltaKernelTest, EveryLevelRoundTripsEveryShapeOfXorStreamThroughPlainZstd) {
  const std::vector<std::vector<size_t>> shapes = {
      {0},                                    // dense: no zero byte at all
      {1, 2, 3},                              // zero runs too short to be matches
      {4, 5, 3, 4, 1, 0, 6},                  // runs at the match threshold
      {63, 64, 65, 0, 127, 1},                // across the 64-byte scan steps
      {97, 211, 5, 1000, 0, 0, 50},           // sparse, like a 1% delta
      {kChunkBytes - 3, 2, kChunkBytes + 7},  // runs across 128 KiB blocks
      {3 * kChunkBytes},                      // all zero but one byte
  };
  const size_t sizes[] = {
      1, 3, 4, 5, 63, 64, 65, 4099, kChunkBytes - 1, kChunkBytes + 1, 3 * kChunkBytes + 77};
  uint64_t seed = 10;
  for (int level : {-3, 1, 3}) {
    for (const std::vector<size_t>& gaps : shapes) {
      for (size_t n : sizes) {
        SCOPED_TRACE(::testing::Message()
                     << "level " << level << ", size " << n << ", first gap " << gaps[0]);
        const std::vector<std::byte> base = RandomBytes(n, ++seed);
        const std::vector<std::byte> x = XorPattern(n, gaps, seed);
        std::vector<std::byte> target(n);
        for (size_t i = 0; i < n; ++i) target[i] = base[i] ^ x[i];
        Encoded e = Encode(base, target, level);
        EXPECT_EQ(e.info.changed, x != std::vector<std::byte>(n, std::byte{0}));
        std::vector<std::byte> decoded(n + 1);
        const size_t r =
            ZSTD_decompress(decoded.data(), decoded.size(), e.frame.data(), e.frame.size());
        ASSERT_FALSE(ZSTD_isError(r)) << ZSTD_getErrorName(r);
        ASSERT_EQ(r, n);
        decoded.resize(n);
        EXPECT_EQ(decoded, x);
      }
    }
  }
}

TEST(DeltaKernelTest, DefaultLevelFramesOfSparseDeltasAreSmallerThanZstdLevelOne) {
  // A bf16 update touching 1% of the values at random by a mantissa step or
  // two: small XOR values at geometric distances. The zero-run parser is
  // what the default level uses; zstd's own level 1 is what a plain zstd
  // encoder of the same stream gives.
  const size_t n = 8 * kChunkBytes;
  std::mt19937_64 rng(7);
  std::geometric_distribution<size_t> gap(0.01);
  std::vector<std::byte> x(n, std::byte{0});
  for (size_t v = gap(rng); 2 * v < n; v += 1 + gap(rng)) {
    x[2 * v] = static_cast<std::byte>(1 + 2 * (rng() % 4));
  }
  std::vector<std::byte> zero(n, std::byte{0});
  Encoded e = Encode(zero, x, kDefaultZstdLevel);
  std::vector<std::byte> plain(ZSTD_compressBound(n));
  const size_t plain_size = ZSTD_compress(plain.data(), plain.size(), x.data(), n, 1);
  ASSERT_FALSE(ZSTD_isError(plain_size));
  EXPECT_LT(e.frame.size(), plain_size);
}

TEST(DeltaKernelTest, UnchangedTensorIsReportedUnchanged) {
  std::vector<std::byte> base = RandomBytes(50'000, 2);
  Encoded e = Encode(base, base);
  EXPECT_FALSE(e.info.changed);
  EXPECT_EQ(e.info.target_checksum, Xxh3Checksum(base));
}

TEST(DeltaKernelTest, LongChainsFoldInSeveralPassesToMemoryAndFiles) {
  const size_t n = 2 * kChunkBytes + 777;
  const size_t k = 2 * kMaxFramesPerPass + 3;
  std::vector<std::vector<std::byte>> versions{RandomBytes(n, 3)};
  std::vector<std::vector<std::byte>> frames;
  for (size_t i = 0; i < k; ++i) {
    versions.push_back(Nudged(versions.back(), 50 + i, i));
    frames.push_back(Encode(versions[i], versions[i + 1]).frame);
  }
  std::vector<FrameRef> refs;
  for (const auto& f : frames) refs.push_back(Ref(f));
  const Checksum128 expected = Xxh3Checksum(versions.back());
  CodecWorkspace ws;

  std::vector<std::byte> mem = versions.front();
  MemorySource src(mem);
  MemorySink sink(mem);
  FoldSpec spec{"w", n, refs, expected};
  absl::Status s = FoldFrames(ws, spec, src, sink);
  ASSERT_TRUE(s.ok()) << s;
  EXPECT_EQ(mem, versions.back());

  // From a base file into an output file (passes after the first read the
  // output back).
  testing::ScratchDir dir;
  const fs::path in_path = dir / "in", out_path = dir / "out";
  ASSERT_TRUE(WriteFileAtomically(in_path,
                                  std::string(reinterpret_cast<const char*>(versions[0].data()), n))
                  .ok());
  UniqueFd in(::open(in_path.c_str(), O_RDONLY));
  UniqueFd out(::open(out_path.c_str(), O_RDWR | O_CREAT, 0644));
  ASSERT_TRUE(in && out);
  FileSource fsrc(in.get(), 0, &in_path);
  FileSink fsink(out.get(), 0, &out_path);
  s = FoldFrames(ws, spec, fsrc, fsink);
  ASSERT_TRUE(s.ok()) << s;
  absl::StatusOr<std::string> written = ReadFileToString(out_path);
  ASSERT_TRUE(written.ok());
  EXPECT_EQ(*written, std::string(reinterpret_cast<const char*>(versions.back().data()), n));
}

TEST(DeltaKernelTest, FoldingAPrefixTwiceRestoresIt) {
  const size_t n = 3 * kChunkBytes;
  std::vector<std::byte> base = RandomBytes(n, 4);
  std::vector<std::byte> target = Nudged(base, 33, 1);
  Encoded e = Encode(base, target);
  std::vector<FrameRef> frames{Ref(e.frame)};
  std::vector<std::byte> mem = base;
  CodecWorkspace ws;
  MemorySource src(mem);
  MemorySink sink(mem);
  FoldSpec spec{"w", n, frames};
  spec.limit = kChunkBytes + 10;
  ASSERT_TRUE(FoldFrames(ws, spec, src, sink).ok());
  EXPECT_NE(mem, base);
  EXPECT_TRUE(std::equal(mem.begin(), mem.begin() + static_cast<long>(spec.limit), target.begin()));
  EXPECT_TRUE(std::equal(mem.begin() + static_cast<long>(spec.limit), mem.end(),
                         base.begin() + static_cast<long>(spec.limit)));
  ASSERT_TRUE(FoldFrames(ws, spec, src, sink).ok());
  EXPECT_EQ(mem, base);
}

// Runs one fold of `frame` onto a copy of `base` and returns the status and
// how far it got.
absl::Status FoldOnce(const std::vector<std::byte>& base, const std::vector<std::byte>& frame,
                      std::optional<Checksum128> expected, FoldProgress* progress = nullptr) {
  std::vector<std::byte> mem = base;
  CodecWorkspace ws;
  MemorySource src(mem);
  MemorySink sink(mem);
  std::vector<FrameRef> frames{Ref(frame, "/d/delta.safetensors (version 3)")};
  FoldSpec spec{"layer.w", base.size(), frames, expected};
  return FoldFrames(ws, spec, src, sink, progress);
}

TEST(DeltaKernelTest, BadFramesAreDataLossNamingTensorAndFile) {
  const size_t n = 2 * kChunkBytes + 100;
  std::vector<std::byte> base = RandomBytes(n, 6);
  std::vector<std::byte> target = RandomBytes(n, 7);  // incompressible: a long frame
  Encoded e = Encode(base, target);
  const Checksum128 sum = e.info.target_checksum;

  auto expect_loss = [&](const absl::Status& s, std::string_view what) {
    EXPECT_TRUE(absl::IsDataLoss(s)) << what << ": " << s;
    EXPECT_NE(s.message().find("layer.w"), std::string_view::npos) << s;
    EXPECT_NE(s.message().find("/d/delta.safetensors"), std::string_view::npos) << s;
    EXPECT_EQ(s.message().find('\n'), std::string_view::npos) << s;
  };

  std::vector<std::byte> truncated(e.frame.begin(),
                                   e.frame.begin() + static_cast<long>(e.frame.size() / 2));
  FoldProgress p;
  absl::Status s = FoldOnce(base, truncated, sum, &p);
  expect_loss(s, "truncated");
  EXPECT_NE(s.message().find("truncated"), std::string_view::npos) << s;
  EXPECT_LT(p.prefix_done, n);

  std::vector<std::byte> corrupt = e.frame;
  for (size_t i = 20; i < corrupt.size(); i += 101) corrupt[i] ^= std::byte{0x5a};
  expect_loss(FoldOnce(base, corrupt, sum), "corrupt");

  std::vector<std::byte> trailing = e.frame;
  trailing.push_back(std::byte{0});
  s = FoldOnce(base, trailing, sum);
  expect_loss(s, "trailing");
  EXPECT_NE(s.message().find("trailing"), std::string_view::npos) << s;

  // A frame of a longer tensor folded onto a shorter one.
  std::vector<std::byte> longer_base = RandomBytes(n + 10, 8);
  Encoded longer = Encode(longer_base, RandomBytes(n + 10, 9));
  s = FoldOnce(base, longer.frame, std::nullopt);
  expect_loss(s, "too long");
  EXPECT_NE(s.message().find("more than"), std::string_view::npos) << s;

  // A frame of a shorter tensor.
  Encoded shorter = Encode(RandomBytes(n - 10, 10), RandomBytes(n - 10, 11));
  s = FoldOnce(base, shorter.frame, std::nullopt);
  expect_loss(s, "too short");

  Checksum128 wrong = sum;
  wrong.low ^= 1;
  s = FoldOnce(base, e.frame, wrong);
  expect_loss(s, "checksum");
  EXPECT_EQ(GetErrorKind(s), ErrorKind::kChecksumMismatch);
  EXPECT_NE(s.message().find(wrong.ToHex()), std::string_view::npos) << s;

  expect_loss(FoldOnce(base, {}, sum), "empty frame");
}

TEST(DeltaKernelTest, FrameHeadersAreCheckedWithoutDecoding) {
  std::vector<std::byte> base = RandomBytes(1000, 12);
  Encoded e = Encode(base, Nudged(base, 10, 0));
  FrameRef ref = Ref(e.frame, "f.safetensors");
  EXPECT_TRUE(CheckFrameHeader(ref, "w", 1000).ok());
  EXPECT_TRUE(CheckFrameHeader(ref, "w", std::nullopt).ok());
  absl::Status s = CheckFrameHeader(ref, "w", 999);
  EXPECT_TRUE(absl::IsDataLoss(s)) << s;
  EXPECT_NE(s.message().find("decodes to 1000 bytes"), std::string_view::npos) << s;
  std::vector<std::byte> junk = RandomBytes(64, 13);
  s = CheckFrameHeader(Ref(junk, "f.safetensors"), "w", 1000);
  EXPECT_TRUE(absl::IsDataLoss(s)) << s;
  EXPECT_NE(s.message().find("not a zstd frame"), std::string_view::npos) << s;

  CodecWorkspace ws;
  absl::StatusOr<uint64_t> size = DecodedFrameSize(ws, ref, "w", UINT64_MAX);
  ASSERT_TRUE(size.ok()) << size.status();
  EXPECT_EQ(*size, 1000u);
  EXPECT_TRUE(absl::IsDataLoss(DecodedFrameSize(ws, ref, "w", 999).status()));
}

TEST(DeltaKernelTest, ParallelForRunsEveryTaskAndReportsTheRealFailure) {
  std::vector<std::atomic<int>> ran(100);
  absl::Status s = ParallelFor(ran.size(), 4, [&](size_t i, int worker) {
    EXPECT_GE(worker, 0);
    EXPECT_LT(worker, 4);
    ran[i]++;
    return absl::OkStatus();
  });
  EXPECT_TRUE(s.ok());
  for (auto& r : ran) EXPECT_EQ(r.load(), 1);

  // Task 0 runs until it sees the cancel flag; task 1 fails. The failure is
  // reported, not task 0's cancellation.
  std::atomic<bool> cancel{false};
  s = ParallelFor(
      2, 2,
      [&](size_t i, int) -> absl::Status {
        if (i == 1) return absl::DataLossError("task 1 broke");
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
        while (!cancel.load() && std::chrono::steady_clock::now() < deadline)
          std::this_thread::yield();
        return absl::CancelledError("cancelled");
      },
      &cancel);
  EXPECT_TRUE(absl::IsDataLoss(s)) << s;
  EXPECT_TRUE(cancel.load());

  s = ParallelFor(3, 1, [](size_t i, int) -> absl::Status {
    if (i == 1) throw std::runtime_error("boom");
    return absl::OkStatus();
  });
  EXPECT_TRUE(absl::IsInternal(s)) << s;
  EXPECT_NE(s.message().find("boom"), std::string_view::npos);
}

TEST(DeltaKernelTest, ProgressReachesTheTotal) {
  std::vector<std::pair<uint64_t, uint64_t>> calls;
  ProgressMeter m(
      100, [&](uint64_t d, uint64_t t) { calls.emplace_back(d, t); }, 10);
  for (int i = 0; i < 25; ++i) m.Add(4);
  m.Finish();
  ASSERT_FALSE(calls.empty());
  EXPECT_EQ(calls.back(), (std::pair<uint64_t, uint64_t>{100, 100}));
  EXPECT_GE(calls.size(), 10u);
}

TEST(DeltaKernelTest, LargestFirstOrdersBySizeStably) {
  std::vector<uint64_t> sizes{5, 9, 5, 1, 9};
  EXPECT_EQ(LargestFirst(sizes), (std::vector<size_t>{1, 4, 0, 2, 3}));
}

}  // namespace
}  // namespace stitch

#include "stitch/format/safetensors.h"

#include "stitch/format/checkpoint_reader.h"

#include <stdlib.h>

#include <cstring>
#include <fstream>
#include <random>
#include <sstream>

#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/temp_dir.h"

namespace stitch {
namespace {

namespace fs = std::filesystem;

std::string Msg(const absl::Status& s) { return std::string(s.message()); }

using ::testing::HasSubstr;
using ::testing::Not;

constexpr DType kAllDTypes[] = {DType::kBool, DType::kU8,     DType::kI8,    DType::kU16,
                                DType::kI16,  DType::kF16,    DType::kBF16,  DType::kU32,
                                DType::kI32,  DType::kF32,    DType::kU64,   DType::kI64,
                                DType::kF64,  DType::kF8E4M3, DType::kF8E5M2};

using ::stitch::testing::TempDir;

std::vector<std::byte> RandomBytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::byte> out(n);
  for (std::byte& b : out) b = static_cast<std::byte>(rng());
  return out;
}

// A raw file: 8-byte little-endian length of `header`, `header`, then
// `data_size` bytes of data.
std::string RawFile(std::string_view header, size_t data_size) {
  std::string out(8, '\0');
  for (size_t i = 0; i < 8; ++i) out[i] = static_cast<char>((header.size() >> (8 * i)) & 0xff);
  out += header;
  out.append(data_size, '\x5a');
  return out;
}

absl::StatusOr<SafetensorsHeader> Parse(std::string_view file) {
  return ParseSafetensorsHeader(std::as_bytes(std::span(file.data(), file.size())), file.size());
}

void WriteRaw(const fs::path& path, std::string_view contents) {
  std::ofstream(path, std::ios::binary) << contents;
}

std::string ReadAll(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

TEST(DType, NamesAndSizesRoundTrip) {
  for (DType d : kAllDTypes) {
    auto parsed = ParseDType(DTypeName(d));
    ASSERT_TRUE(parsed.ok()) << DTypeName(d);
    EXPECT_EQ(*parsed, d);
  }
  EXPECT_EQ(DTypeName(DType::kBF16), "BF16");
  EXPECT_EQ(DTypeName(DType::kF8E4M3), "F8_E4M3");
  EXPECT_EQ(DTypeSize(DType::kBool), 1u);
  EXPECT_EQ(DTypeSize(DType::kBF16), 2u);
  EXPECT_EQ(DTypeSize(DType::kF32), 4u);
  EXPECT_EQ(DTypeSize(DType::kI64), 8u);
  EXPECT_EQ(DTypeSize(DType::kF8E5M2), 1u);
  auto bad = ParseDType("F4");
  ASSERT_FALSE(bad.ok());
  EXPECT_THAT(Msg(bad.status()), HasSubstr("unknown dtype \"F4\""));
}

TEST(TensorInfo, NumelHandlesScalarsZerosAndOverflow) {
  EXPECT_EQ((TensorInfo{"s", DType::kF32, {}, 0, 4}.numel()), 1);
  EXPECT_EQ((TensorInfo{"m", DType::kF32, {2, 3}, 0, 24}.numel()), 6);
  EXPECT_EQ((TensorInfo{"z", DType::kF32, {int64_t{1} << 40, int64_t{1} << 40, 0}, 0, 0}.numel()),
            0);
  EXPECT_EQ((TensorInfo{"o", DType::kF32, {int64_t{1} << 40, int64_t{1} << 40}, 0, 0}.numel()), -1);
}

TEST(Safetensors, RoundTripsEveryDType) {
  TempDir dir;
  const fs::path path = dir.path() / "all.safetensors";
  std::vector<std::vector<std::byte>> buffers;
  std::vector<TensorView> views;
  uint32_t seed = 1;
  for (DType d : kAllDTypes) {
    buffers.push_back(RandomBytes(2 * 3 * DTypeSize(d), seed++));
    views.push_back({"layer." + std::string(DTypeName(d)), d, {2, 3}, buffers.back()});
  }
  ASSERT_TRUE(WriteSafetensors(path, views, {{"format", "pt"}, {"k", "v"}}).ok());

  auto f = SafetensorsFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status();
  ASSERT_EQ(f->tensors().size(), views.size());
  EXPECT_EQ(f->metadata(), (std::map<std::string, std::string>{{"format", "pt"}, {"k", "v"}}));
  for (const TensorView& v : views) {
    const TensorInfo* t = f->Find(v.name);
    ASSERT_NE(t, nullptr) << v.name;
    EXPECT_EQ(t->dtype, v.dtype) << v.name;
    EXPECT_EQ(t->shape, v.shape) << v.name;
    EXPECT_EQ(t->numel(), 6);
    auto data = f->Data(*t);
    ASSERT_EQ(data.size(), v.data.size());
    EXPECT_EQ(std::memcmp(data.data(), v.data.data(), data.size()), 0) << v.name;
  }
  // Declaration order is file order.
  for (size_t i = 0; i < views.size(); ++i) EXPECT_EQ(f->tensors()[i].name, views[i].name);
}

TEST(Safetensors, HeaderIsPaddedToEightBytesWithContiguousOffsets) {
  SafetensorsWriter w;
  ASSERT_TRUE(w.Add("a", DType::kF32, {3}, 12).ok());
  ASSERT_TRUE(w.Add("b", DType::kU8, {5}, 5).ok());
  ASSERT_TRUE(w.Add("c", DType::kBF16, {1, 1, 1}, 2).ok());
  EXPECT_EQ(w.data_size(), 19u);
  std::string h = w.SerializeHeader();
  EXPECT_EQ(h.size() % 8, 0u);
  EXPECT_EQ(h[8], '{');
  EXPECT_EQ(h.back(), ' ') << "padding is expected for this header";
  EXPECT_THAT(h, Not(HasSubstr("__metadata__")));
  uint64_t len = 0;
  for (int i = 7; i >= 0; --i) len = (len << 8) | static_cast<unsigned char>(h[i]);
  EXPECT_EQ(len + 8, h.size());

  std::string file = h + std::string(19, '\0');
  auto parsed = Parse(file);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  ASSERT_EQ(parsed->tensors.size(), 3u);
  EXPECT_EQ(parsed->data_start, h.size());
  EXPECT_EQ(parsed->tensors[0].begin, 0u);
  EXPECT_EQ(parsed->tensors[0].end, 12u);
  EXPECT_EQ(parsed->tensors[1].begin, 12u);
  EXPECT_EQ(parsed->tensors[1].end, 17u);
  EXPECT_EQ(parsed->tensors[2].begin, 17u);
  EXPECT_EQ(parsed->tensors[2].end, 19u);
  EXPECT_TRUE(parsed->metadata.empty());

  w.SetMetadata("k", "v");
  EXPECT_THAT(w.SerializeHeader(), HasSubstr("\"__metadata__\":{\"k\":\"v\"}"));
}

TEST(Safetensors, ExactHeaderForReferenceCompatibility) {
  // Byte for byte what Python's safetensors (0.8) writes for
  // save({"w": np.zeros(2, np.float16)}) with and without metadata.
  SafetensorsWriter w;
  ASSERT_TRUE(w.Add("w", DType::kF16, {2}, 4).ok());
  using namespace std::string_literals;
  EXPECT_EQ(w.SerializeHeader(),
            "8\0\0\0\0\0\0\0"s + R"({"w":{"dtype":"F16","shape":[2],"data_offsets":[0,4]}}  )");
  w.SetMetadata("k", "v");
  EXPECT_EQ(
      w.SerializeHeader(),
      "P\0\0\0\0\0\0\0"s +
          R"({"__metadata__":{"k":"v"},"w":{"dtype":"F16","shape":[2],"data_offsets":[0,4]}} )");
}

TEST(Safetensors, DataIsMappedNotCopied) {
  TempDir dir;
  const fs::path path = dir.path() / "big.safetensors";
  const std::vector<std::byte> big = RandomBytes(3 << 20, 7);
  const std::vector<std::byte> small = RandomBytes(24, 8);
  ASSERT_TRUE(WriteSafetensors(path, {{"small", DType::kF32, {6}, small},
                                      {"big", DType::kU8, {static_cast<int64_t>(big.size())}, big}})
                  .ok());
  auto f = SafetensorsFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status();
  const TensorInfo* t = f->Find("big");
  ASSERT_NE(t, nullptr);
  auto data = f->Data(*t);
  ASSERT_EQ(data.size(), big.size());
  EXPECT_EQ(std::memcmp(data.data(), big.data(), big.size()), 0);
  EXPECT_EQ(f->Data(*t).data(), data.data());

  // The bytes live inside a mapping of this very file.
  const auto addr = reinterpret_cast<uintptr_t>(data.data());
  std::ifstream maps("/proc/self/maps");
  std::string line;
  bool found = false;
  while (std::getline(maps, line)) {
    uintptr_t lo = 0, hi = 0;
    if (std::sscanf(line.c_str(), "%lx-%lx", &lo, &hi) != 2) continue;
    if (addr >= lo && addr + data.size() <= hi) {
      EXPECT_THAT(line, HasSubstr(path.filename().string()));
      found = true;
    }
  }
  EXPECT_TRUE(found) << "tensor bytes are not inside one mapping";

  // Moving keeps the mapping; the moved-to object still reads the same bytes.
  SafetensorsFile moved = *std::move(f);
  const TensorInfo* t2 = moved.Find("small");
  ASSERT_NE(t2, nullptr);
  EXPECT_EQ(std::memcmp(moved.Data(*t2).data(), small.data(), small.size()), 0);
}

TEST(Safetensors, EmptyDataAndZeroSizeTensorsAreLegal) {
  TempDir dir;
  const fs::path empty = dir.path() / "empty.safetensors";
  ASSERT_TRUE(WriteSafetensors(empty, {}).ok());
  auto f = SafetensorsFile::Open(empty);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_TRUE(f->tensors().empty());
  EXPECT_EQ(ReadAll(empty).size(), f->header().data_start);

  const fs::path zeros = dir.path() / "zeros.safetensors";
  const std::vector<std::byte> four = RandomBytes(4, 3);
  ASSERT_TRUE(WriteSafetensors(zeros, {{"z0", DType::kF32, {0, 4}, {}},
                                       {"x", DType::kF32, {1}, four},
                                       {"z1", DType::kI64, {3, 0}, {}}})
                  .ok());
  auto g = SafetensorsFile::Open(zeros);
  ASSERT_TRUE(g.ok()) << g.status();
  ASSERT_EQ(g->tensors().size(), 3u);
  const TensorInfo* z1 = g->Find("z1");
  ASSERT_NE(z1, nullptr);
  EXPECT_EQ(z1->begin, 4u);
  EXPECT_EQ(z1->end, 4u);
  EXPECT_EQ(z1->numel(), 0);
  EXPECT_TRUE(g->Data(*z1).empty());
  EXPECT_EQ(std::memcmp(g->Data(*g->Find("x")).data(), four.data(), 4), 0);
  EXPECT_EQ(g->Find("absent"), nullptr);

  // A header that declares only zero-size tensors, with no data at all.
  auto parsed = Parse(RawFile(R"({"e":{"dtype":"F32","shape":[0],"data_offsets":[0,0]}})", 0));
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  EXPECT_EQ(parsed->tensors.size(), 1u);
}

TEST(Safetensors, AcceptsUnsortedEntriesAndScalars) {
  auto parsed = Parse(
      RawFile(R"({"b":{"dtype":"F32","shape":[],"data_offsets":[4,8]},)"
              R"("a":{"dtype":"U16","shape":[2],"data_offsets":[0,4]},"__metadata__":{"x":"y"}})",
              8));
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  ASSERT_EQ(parsed->tensors.size(), 2u);
  EXPECT_EQ(parsed->tensors[0].name, "a");  // sorted by offset
  EXPECT_EQ(parsed->tensors[1].name, "b");
  EXPECT_TRUE(parsed->tensors[1].shape.empty());
  EXPECT_EQ(parsed->metadata.at("x"), "y");
}

struct Malformed {
  std::string label;
  std::string file;
  std::string reason;  // expected in the message
};

std::string Entry(absl::string_view dtype, absl::string_view shape, uint64_t b, uint64_t e) {
  return absl::StrCat(R"({"dtype":")", dtype, R"(","shape":)", shape, R"(,"data_offsets":[)", b,
                      ",", e, "]}");
}

std::vector<Malformed> MalformedFiles() {
  std::string len_beyond(8, '\0');
  len_beyond[0] = 100;  // header length 100 in a 12-byte file
  len_beyond += "{}  ";
  std::string len_over(8, '\0');
  const uint64_t over = kMaxSafetensorsHeader + 1;
  for (size_t i = 0; i < 8; ++i) len_over[i] = static_cast<char>((over >> (8 * i)) & 0xff);
  len_over += "{}";
  const std::string a4 = Entry("U8", "[4]", 0, 4);
  return {
      {"short file", "abc", "shorter than the 8-byte header length"},
      {"length beyond file", len_beyond, "bad header length (beyond the end of the file"},
      {"length over limit", len_over, "above the limit of 100000000"},
      {"not json", RawFile("{not json", 0), "not valid JSON"},
      {"trailing garbage", RawFile("{} x", 0), "not valid JSON"},
      {"empty header", RawFile("", 0), "not valid JSON"},
      {"not an object", RawFile("[1,2]", 0), "not a JSON object"},
      {"invalid utf8", RawFile("{\"\xff\":1}", 0), "not valid JSON"},
      {"entry not object", RawFile(R"({"a":5})", 0),
       "tensor \"a\": entry is a number, expected an object"},
      {"lacks dtype", RawFile(R"({"a":{"shape":[4],"data_offsets":[0,4]}})", 4), "lacks dtype"},
      {"lacks shape", RawFile(R"({"a":{"dtype":"U8","data_offsets":[0,4]}})", 4), "lacks shape"},
      {"lacks offsets", RawFile(R"({"a":{"dtype":"U8","shape":[4]}})", 4), "lacks data_offsets"},
      {"dtype not string", RawFile(R"({"a":{"dtype":8,"shape":[4],"data_offsets":[0,4]}})", 4),
       "dtype is a number, expected a string"},
      {"shape not array", RawFile(R"({"a":{"dtype":"U8","shape":"4","data_offsets":[0,4]}})", 4),
       "shape is a string"},
      {"shape of floats", RawFile(R"({"a":{"dtype":"U8","shape":[4.0],"data_offsets":[0,4]}})", 4),
       "non-negative integer dimension"},
      {"offsets not pair", RawFile(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[4]}})", 4),
       "expected [begin, end]"},
      {"offsets negative", RawFile(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[-1,3]}})", 4),
       "expected [begin, end]"},
      {"offsets reversed", RawFile(absl::StrCat(R"({"a":)", Entry("U8", "[4]", 4, 0), "}"), 4),
       "end before they begin"},
      {"unknown field",
       RawFile(R"({"a":{"dtype":"U8","shape":[4],"data_offsets":[0,4],"x":1}})", 4),
       "unknown field \"x\""},
      {"unknown dtype", RawFile(absl::StrCat(R"({"a":)", Entry("F4", "[4]", 0, 4), "}"), 4),
       "unknown dtype \"F4\""},
      {"negative dim", RawFile(absl::StrCat(R"({"a":)", Entry("U8", "[-4]", 0, 4), "}"), 4),
       "negative dimension -4"},
      {"size mismatch", RawFile(absl::StrCat(R"({"a":)", Entry("F32", "[2,3]", 0, 20), "}"), 20),
       "shape [2, 3] of F32 needs 24 bytes but data_offsets [0, 20] hold 20"},
      {"numel overflow",
       RawFile(absl::StrCat(R"({"a":)", Entry("F32", "[4294967296,4294967296,16]", 0, 0), "}"), 0),
       "too many elements"},
      {"bytes overflow",
       RawFile(absl::StrCat(R"({"a":)", Entry("F64", "[4611686018427387904]", 0, 0), "}"), 0),
       "too many elements"},
      {"out of bounds", RawFile(absl::StrCat(R"({"a":)", Entry("U8", "[8]", 0, 8), "}"), 4),
       "reach beyond the data section (4 bytes)"},
      {"overlap",
       RawFile(absl::StrCat(R"({"a":)", a4, R"(,"b":)", Entry("U8", "[4]", 2, 6), "}"), 6),
       "overlap tensor \"a\""},
      {"hole between",
       RawFile(absl::StrCat(R"({"a":)", a4, R"(,"b":)", Entry("U8", "[4]", 8, 12), "}"), 12),
       "data bytes [4, 8) belong to no tensor"},
      {"hole at start", RawFile(absl::StrCat(R"({"b":)", Entry("U8", "[4]", 4, 8), "}"), 8),
       "data bytes [0, 4) belong to no tensor"},
      {"trailing bytes", RawFile(absl::StrCat(R"({"a":)", a4, "}"), 6), "2 trailing bytes"},
      {"data without tensors", RawFile("{}", 3), "3 trailing bytes"},
      {"duplicate tensor", RawFile(absl::StrCat(R"({"a":)", a4, R"(,"a":)", a4, "}"), 4),
       "duplicate key \"a\""},
      {"duplicate field",
       RawFile(R"({"a":{"dtype":"U8","dtype":"I8","shape":[4],"data_offsets":[0,4]}})", 4),
       "duplicate key \"dtype\""},
      {"metadata not object", RawFile(R"({"__metadata__":["a"]})", 0),
       "__metadata__ is a array, expected an object of strings"},
      {"metadata value not string", RawFile(R"({"__metadata__":{"k":1}})", 0),
       "__metadata__ must be an object of strings, but \"k\" is a number"},
      {"too deep", RawFile(std::string(40, '[') + std::string(40, ']'), 0), "not valid JSON"},
  };
}

TEST(Safetensors, RejectsMalformedHeadersWithTheReason) {
  for (const Malformed& m : MalformedFiles()) {
    auto parsed = Parse(m.file);
    ASSERT_FALSE(parsed.ok()) << m.label;
    EXPECT_EQ(parsed.status().code(), absl::StatusCode::kInvalidArgument) << m.label;
    EXPECT_THAT(Msg(parsed.status()), HasSubstr(m.reason)) << m.label;
  }
}

TEST(Safetensors, OpenAndReadHeaderNameTheFile) {
  TempDir dir;
  for (const Malformed& m : MalformedFiles()) {
    const fs::path path = dir.path() / "bad.safetensors";
    WriteRaw(path, m.file);
    auto f = SafetensorsFile::Open(path);
    ASSERT_FALSE(f.ok()) << m.label;
    EXPECT_THAT(Msg(f.status()), HasSubstr(path.string())) << m.label;
    EXPECT_THAT(Msg(f.status()), HasSubstr(m.reason)) << m.label;
    auto h = ReadSafetensorsHeader(path);
    ASSERT_FALSE(h.ok()) << m.label;
    EXPECT_EQ(h.status().message(), f.status().message()) << m.label;
  }
  auto missing = SafetensorsFile::Open(dir.path() / "missing.safetensors");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Msg(missing.status()), HasSubstr("missing.safetensors"));
  auto directory = SafetensorsFile::Open(dir.path());
  EXPECT_THAT(Msg(directory.status()), HasSubstr("not a regular file"));
}

// A file that is not safetensors (a link to /etc/passwd, say) must not
// have its first bytes echoed as a "header length".
TEST(Safetensors, AnImplausibleHeaderLengthIsNotQuoted) {
  TempDir dir;
  const fs::path path = dir.path() / "passwd.safetensors";
  const std::string text = "root:x:0:0:root:/root:/bin/bash\n";
  WriteRaw(path, text);
  uint64_t as_length = 0;
  std::memcpy(&as_length, text.data(), 8);
  auto f = OpenSafetensorsForReading(path, "passwd.safetensors");
  ASSERT_FALSE(f.ok());
  EXPECT_THAT(Msg(f.status()), HasSubstr("bad header length"));
  EXPECT_THAT(Msg(f.status()), Not(HasSubstr(absl::StrCat(as_length))));
}

// The header a reader accepts is bounded by what the index maps to the
// file, by the length field alone: a hostile header is never read.
TEST(Safetensors, AHeaderOverWhatTheIndexAllowsIsRefusedUnread) {
  TempDir dir;
  const fs::path path = dir.path() / "big.safetensors";
  const uint64_t len = MaxHeaderBytesFor(2) + 8;
  std::string file(8, '\0');
  for (size_t i = 0; i < 8; ++i) file[i] = static_cast<char>((len >> (8 * i)) & 0xff);
  file += std::string(len, ' ');
  WriteRaw(path, file);
  auto f = OpenSafetensorsForReading(path, "big.safetensors", MaxHeaderBytesFor(2));
  ASSERT_FALSE(f.ok());
  EXPECT_EQ(f.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(f.status()), HasSubstr("not read"));
  // Without the bound the same header is read (and found not to be JSON).
  EXPECT_THAT(Msg(OpenSafetensorsForReading(path, "big.safetensors").status()),
              HasSubstr("not valid JSON"));
}

TEST(Safetensors, ReadHeaderMatchesOpen) {
  TempDir dir;
  const fs::path path = dir.path() / "m.safetensors";
  const auto bytes = RandomBytes(64, 5);
  ASSERT_TRUE(WriteSafetensors(path, {{"x", DType::kF64, {2, 4}, bytes}}, {{"a", "b"}}).ok());
  auto h = ReadSafetensorsHeader(path);
  ASSERT_TRUE(h.ok()) << h.status();
  ASSERT_EQ(h->tensors.size(), 1u);
  EXPECT_EQ(h->tensors[0].shape, (std::vector<int64_t>{2, 4}));
  EXPECT_EQ(h->metadata.at("a"), "b");
  EXPECT_EQ(h->data_start + 64, fs::file_size(path));
}

TEST(Safetensors, ParseRequiresTheWholeHeaderInThePrefix) {
  const std::string file = RawFile(absl::StrCat(R"({"a":)", Entry("U8", "[4]", 0, 4), "}"), 4);
  auto bytes = std::as_bytes(std::span(file.data(), file.size()));
  EXPECT_TRUE(ParseSafetensorsHeader(bytes.first(file.size() - 4), file.size()).ok());
  auto cut = ParseSafetensorsHeader(bytes.first(20), file.size());
  ASSERT_FALSE(cut.ok());
  EXPECT_THAT(Msg(cut.status()), HasSubstr("the header needs"));
  auto longer = ParseSafetensorsHeader(bytes, file.size() - 1);
  EXPECT_FALSE(longer.ok());
}

TEST(Safetensors, ParsesThousandsOfTensors) {
  SafetensorsWriter w;
  constexpr int kTensors = 20000;
  for (int i = 0; i < kTensors; ++i) {
    ASSERT_TRUE(
        w.Add(absl::StrCat("model.layers.", i, ".self_attn.q_proj.weight"), DType::kBF16, {2, 2}, 8)
            .ok());
  }
  std::string file = w.SerializeHeader() + std::string(w.data_size(), '\0');
  auto parsed = Parse(file);
  ASSERT_TRUE(parsed.ok()) << parsed.status();
  ASSERT_EQ(parsed->tensors.size(), static_cast<size_t>(kTensors));
  EXPECT_EQ(parsed->tensors.back().end, w.data_size());
}

TEST(Safetensors, SurvivesMutatedHeaders) {
  // A deterministic mini-fuzz over a valid file: every mutation either parses
  // into a header that tiles the file exactly or is rejected; nothing crashes.
  SafetensorsWriter w;
  ASSERT_TRUE(w.Add("a", DType::kF32, {2}, 8).ok());
  ASSERT_TRUE(w.Add("b", DType::kU8, {0}, 0).ok());
  ASSERT_TRUE(w.Add("c", DType::kI16, {3}, 6).ok());
  w.SetMetadata("k", "v");
  const std::string valid = w.SerializeHeader() + std::string(w.data_size(), '\1');
  std::mt19937 rng(42);
  for (int i = 0; i < 5000; ++i) {
    std::string file = valid;
    const int edits = 1 + static_cast<int>(rng() % 4);
    for (int e = 0; e < edits; ++e) {
      const size_t pos = rng() % file.size();
      switch (rng() % 3) {
        case 0:
          file[pos] = static_cast<char>(rng());
          break;
        case 1:
          file.erase(pos, 1);
          break;
        default:
          file.insert(pos, 1, "{}[],:\"0123456789-"[rng() % 18]);
      }
    }
    auto parsed = Parse(file);
    if (!parsed.ok()) continue;
    uint64_t cursor = 0;
    for (const TensorInfo& t : parsed->tensors) {
      ASSERT_EQ(t.begin, cursor);
      ASSERT_EQ(static_cast<uint64_t>(t.numel()) * DTypeSize(t.dtype), t.nbytes());
      cursor = t.end;
    }
    ASSERT_EQ(parsed->data_start + cursor, file.size());
  }
}

TEST(SafetensorsWriter, RejectsBadDeclarations) {
  SafetensorsWriter w;
  ASSERT_TRUE(w.Add("a", DType::kF32, {2}, 8).ok());
  auto dup = w.Add("a", DType::kF32, {2}, 8);
  EXPECT_EQ(dup.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(dup), HasSubstr("tensor \"a\": declared twice"));
  EXPECT_THAT(Msg(w.Add("__metadata__", DType::kU8, {1}, 1)), HasSubstr("reserved"));
  EXPECT_THAT(Msg(w.Add("b", DType::kF32, {2, 3}, 20)),
              HasSubstr("shape [2, 3] of F32 does not hold 20 bytes"));
  EXPECT_THAT(Msg(w.Add("c", DType::kF32, {-1}, 0)), HasSubstr("negative dimension"));
  EXPECT_THAT(Msg(w.Add("d", DType::kU8, {int64_t{1} << 62, 16}, 0)), HasSubstr("does not hold"));
  EXPECT_THAT(Msg(w.Add("\xff", DType::kU8, {1}, 1)), HasSubstr("not valid UTF-8"));
  EXPECT_TRUE(w.Add("u", DType::kU8, {5}, 5).ok());
  EXPECT_EQ(w.data_size(), 13u);
}

TEST(SafetensorsWriter, OutputEnforcesTheDeclaredBytes) {
  TempDir dir;
  const fs::path path = dir.path() / "w.safetensors";
  SafetensorsWriter w;
  ASSERT_TRUE(w.Add("a", DType::kU8, {4}, 4).ok());
  ASSERT_TRUE(w.Add("b", DType::kU8, {2}, 2).ok());
  auto out = w.Begin(path);
  ASSERT_TRUE(out.ok()) << out.status();
  const auto bytes = RandomBytes(7, 9);
  auto span = std::span(bytes);

  auto too_many = (*out)->Append(span);
  EXPECT_EQ(too_many.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(Msg(too_many), HasSubstr("would exceed the 6 declared data bytes"));
  EXPECT_THAT(Msg(too_many), HasSubstr(path.string()));

  ASSERT_TRUE((*out)->Append(span.first(3)).ok());
  auto early = (*out)->Finish();
  EXPECT_THAT(Msg(early), HasSubstr("only 3 of the 6 declared data bytes"));
  EXPECT_FALSE((*out)->Append(span.subspan(3, 4)).ok()) << "3 + 4 > 6";
  ASSERT_TRUE((*out)->Append(span.subspan(3, 3)).ok());
  ASSERT_TRUE((*out)->Finish().ok());
  EXPECT_THAT(Msg((*out)->Finish()), HasSubstr("already finished"));
  EXPECT_THAT(Msg((*out)->Append({})), HasSubstr("already finished"));

  auto f = SafetensorsFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status();
  EXPECT_EQ(std::memcmp(f->Data(*f->Find("a")).data(), bytes.data(), 4), 0);
  EXPECT_EQ(std::memcmp(f->Data(*f->Find("b")).data(), bytes.data() + 4, 2), 0);
}

TEST(SafetensorsWriter, BuffersSmallAndLargeAppends) {
  TempDir dir;
  const fs::path path = dir.path() / "mixed.safetensors";
  const auto big = RandomBytes((3 << 20) + 5, 11);
  SafetensorsWriter w;
  ASSERT_TRUE(w.Add("t", DType::kU8, {static_cast<int64_t>(big.size())}, big.size()).ok());
  auto out = w.Begin(path);
  ASSERT_TRUE(out.ok());
  auto s = std::span(big);
  size_t pos = 0;
  // 1-byte, 3-byte ... appends, then one bigger than the buffer, then the rest.
  for (size_t n = 1; pos + n < 1000; n += 2) {
    ASSERT_TRUE((*out)->Append(s.subspan(pos, n)).ok());
    pos += n;
  }
  ASSERT_TRUE((*out)->Append(s.subspan(pos, (2 << 20))).ok());
  pos += 2 << 20;
  ASSERT_TRUE((*out)->Append(s.subspan(pos)).ok());
  ASSERT_TRUE((*out)->Finish().ok());
  auto f = SafetensorsFile::Open(path);
  ASSERT_TRUE(f.ok()) << f.status();
  auto data = f->Data(f->tensors()[0]);
  ASSERT_EQ(data.size(), big.size());
  EXPECT_EQ(std::memcmp(data.data(), big.data(), big.size()), 0);
}

TEST(SafetensorsWriter, ReportsFileAndTensorErrors) {
  TempDir dir;
  auto no_dir = WriteSafetensors(dir.path() / "absent" / "x.safetensors", {});
  EXPECT_EQ(no_dir.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Msg(no_dir), HasSubstr("absent/x.safetensors"));

  const auto bytes = RandomBytes(6, 1);
  auto mismatch = WriteSafetensors(dir.path() / "y.safetensors", {{"w", DType::kF32, {2}, bytes}});
  EXPECT_THAT(Msg(mismatch), HasSubstr("tensor \"w\""));
  EXPECT_THAT(Msg(mismatch), HasSubstr("y.safetensors"));
  EXPECT_FALSE(fs::exists(dir.path() / "y.safetensors"))
      << "nothing is created for a bad declaration";

  auto bad_meta = WriteSafetensors(dir.path() / "z.safetensors", {}, {{"k", "\xc0\x80"}});
  EXPECT_THAT(Msg(bad_meta), HasSubstr("not valid UTF-8"));
}

}  // namespace
}  // namespace stitch

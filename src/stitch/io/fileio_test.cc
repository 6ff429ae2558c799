#include "stitch/io/fileio.h"

#include <fcntl.h>
#include <stdlib.h>
#include <unistd.h>

#include <cerrno>
#include <fstream>
#include <random>
#include <set>

#include "gmock/gmock.h"
#include "gtest/gtest.h"
#include "tests/support/temp_dir.h"

namespace stitch {
namespace {

namespace fs = std::filesystem;

std::string Msg(const absl::Status& s) { return std::string(s.message()); }

using ::testing::ElementsAre;
using ::testing::HasSubstr;
using ::testing::StartsWith;

using ::stitch::testing::TempDir;

std::string RandomString(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::string out(n, '\0');
  for (char& c : out) c = static_cast<char>(rng());
  return out;
}

void WriteText(const fs::path& path, std::string_view text) {
  std::ofstream(path, std::ios::binary) << text;
}

std::vector<std::string> Names(const fs::path& dir) {
  std::vector<std::string> names;
  for (const auto& e : fs::directory_iterator(dir)) names.push_back(e.path().filename());
  std::sort(names.begin(), names.end());
  return names;
}

TEST(ErrnoStatus, MapsCodesAndNamesThePath) {
  auto s = ErrnoStatus(ENOENT, "open", "/x/y");
  EXPECT_EQ(s.code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(s.message(), "open /x/y: No such file or directory");
  EXPECT_EQ(ErrnoStatus(ENOTDIR, "open", "/p").code(), absl::StatusCode::kNotFound);
  EXPECT_EQ(ErrnoStatus(EACCES, "open", "/p").code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(ErrnoStatus(EPERM, "open", "/p").code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(ErrnoStatus(EROFS, "open", "/p").code(), absl::StatusCode::kPermissionDenied);
  EXPECT_EQ(ErrnoStatus(ENOSPC, "write", "/p").code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(ErrnoStatus(EDQUOT, "write", "/p").code(), absl::StatusCode::kResourceExhausted);
  EXPECT_EQ(ErrnoStatus(EEXIST, "mkdir", "/p").code(), absl::StatusCode::kAlreadyExists);
  EXPECT_EQ(ErrnoStatus(ENOTEMPTY, "rename", "/p").code(), absl::StatusCode::kAlreadyExists);
  auto io = ErrnoStatus(EIO, "fsync", "/d/f");
  EXPECT_EQ(io.code(), absl::StatusCode::kInternal);
  EXPECT_THAT(Msg(io), StartsWith("fsync /d/f: "));
}

TEST(ReadFileToString, ReadsBinaryAndReportsMissing) {
  TempDir dir;
  const std::string contents = RandomString(200'000, 1);
  WriteText(dir.path() / "f", contents);
  auto read = ReadFileToString(dir.path() / "f");
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(*read, contents);
  auto missing = ReadFileToString(dir.path() / "absent");
  EXPECT_EQ(missing.status().code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Msg(missing.status()), HasSubstr((dir.path() / "absent").string()));
}

TEST(ReadFileToString, RefusesAFileOverTheLimitBeforeReadingIt) {
  TempDir dir;
  const fs::path path = dir / "f";
  ASSERT_TRUE(WriteFileAtomically(path, std::string(5000, 'x')).ok());
  auto refused = ReadFileToString(path, 4999);
  EXPECT_TRUE(absl::IsOutOfRange(refused.status())) << refused.status();
  EXPECT_THAT(std::string(refused.status().message()),
              HasSubstr("is 5000 bytes, above the limit of 4999 bytes"));
  auto read = ReadFileToString(path, 5000);
  ASSERT_TRUE(read.ok()) << read.status();
  EXPECT_EQ(read->size(), 5000u);
}

TEST(FileHolds, ComparesWholeContentsInPieces) {
  TempDir dir;
  const fs::path path = dir / "f";
  std::string contents(200000, 'a');
  contents.back() = 'z';
  ASSERT_TRUE(WriteFileAtomically(path, contents).ok());
  EXPECT_TRUE(*FileHolds(path, contents));
  std::string other = contents;
  other.back() = 'y';
  EXPECT_FALSE(*FileHolds(path, other));
  EXPECT_FALSE(*FileHolds(path, contents.substr(1)));
  EXPECT_FALSE(*FileHolds(dir / "missing", contents));
}

TEST(WriteFileAtomically, CreatesAndReplacesWithoutLeftovers) {
  TempDir dir;
  const fs::path path = dir.path() / "pointer";
  ASSERT_TRUE(WriteFileAtomically(path, "first version, longer").ok());
  EXPECT_EQ(*ReadFileToString(path), "first version, longer");
  ASSERT_TRUE(WriteFileAtomically(path, "second").ok());
  EXPECT_EQ(*ReadFileToString(path), "second");
  ASSERT_TRUE(WriteFileAtomically(path, "").ok());
  EXPECT_EQ(*ReadFileToString(path), "");
  EXPECT_THAT(Names(dir.path()), ElementsAre("pointer"));

  auto no_dir = WriteFileAtomically(dir.path() / "absent" / "f", "x");
  EXPECT_EQ(no_dir.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Msg(no_dir), HasSubstr("absent"));
}

TEST(WriteFileAtomically, OverADirectoryFailsAndCleansUp) {
  TempDir dir;
  fs::create_directory(dir.path() / "d");
  WriteText(dir.path() / "d" / "inside", "x");
  auto s = WriteFileAtomically(dir.path() / "d", "contents");
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(Msg(s), HasSubstr((dir.path() / "d").string()));
  EXPECT_THAT(Names(dir.path()), ElementsAre("d")) << "the temporary file is removed";
}

TEST(CopyFileDurably, CopiesExactlyAndTruncates) {
  TempDir dir;
  const std::string big = RandomString((3 << 20) + 17, 2);
  WriteText(dir.path() / "src", big);
  ASSERT_TRUE(CopyFileDurably(dir.path() / "src", dir.path() / "dst").ok());
  EXPECT_EQ(*ReadFileToString(dir.path() / "dst"), big);

  WriteText(dir.path() / "small", "abc");
  ASSERT_TRUE(CopyFileDurably(dir.path() / "small", dir.path() / "dst").ok());
  EXPECT_EQ(*ReadFileToString(dir.path() / "dst"), "abc") << "a longer destination is truncated";

  WriteText(dir.path() / "empty", "");
  ASSERT_TRUE(CopyFileDurably(dir.path() / "empty", dir.path() / "dst").ok());
  EXPECT_EQ(fs::file_size(dir.path() / "dst"), 0u);

  auto missing = CopyFileDurably(dir.path() / "absent", dir.path() / "x");
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound);
  EXPECT_THAT(Msg(missing), HasSubstr("absent"));
  EXPECT_FALSE(fs::exists(dir.path() / "x"));
  auto bad_dest = CopyFileDurably(dir.path() / "small", dir.path() / "no" / "x");
  EXPECT_EQ(bad_dest.code(), absl::StatusCode::kNotFound);
}

TEST(RenameDurably, MovesFilesAndDirectories) {
  TempDir dir;
  WriteText(dir.path() / "a", "payload");
  fs::create_directory(dir.path() / "sub");
  ASSERT_TRUE(RenameDurably(dir.path() / "a", dir.path() / "sub" / "b").ok());
  EXPECT_FALSE(fs::exists(dir.path() / "a"));
  EXPECT_EQ(*ReadFileToString(dir.path() / "sub" / "b"), "payload");

  fs::create_directory(dir.path() / "empty");
  ASSERT_TRUE(RenameDurably(dir.path() / "sub", dir.path() / "empty").ok());
  EXPECT_EQ(*ReadFileToString(dir.path() / "empty" / "b"), "payload");

  fs::create_directory(dir.path() / "other");
  WriteText(dir.path() / "other" / "f", "x");
  auto not_empty = RenameDurably(dir.path() / "empty", dir.path() / "other");
  EXPECT_EQ(not_empty.code(), absl::StatusCode::kAlreadyExists);
  EXPECT_THAT(Msg(not_empty), HasSubstr("other"));

  auto missing = RenameDurably(dir.path() / "absent", dir.path() / "c");
  EXPECT_EQ(missing.code(), absl::StatusCode::kNotFound);
}

TEST(FsyncTree, SyncsATreeAndReportsMissing) {
  TempDir dir;
  fs::create_directories(dir.path() / "a" / "b");
  WriteText(dir.path() / "a" / "b" / "f", "x");
  WriteText(dir.path() / "g", "y");
  EXPECT_TRUE(FsyncTree(dir.path()).ok());
  EXPECT_TRUE(FsyncPath(dir.path() / "g").ok());
  EXPECT_EQ(FsyncPath(dir.path() / "absent").code(), absl::StatusCode::kNotFound);
  EXPECT_FALSE(FsyncTree(dir.path() / "absent").ok());
}

TEST(TempSiblingPath, IsAUniqueHiddenSibling) {
  const fs::path p = "/some/dir/model.safetensors";
  std::set<fs::path> seen;
  for (int i = 0; i < 100; ++i) {
    fs::path t = TempSiblingPath(p);
    EXPECT_EQ(t.parent_path(), p.parent_path());
    EXPECT_THAT(t.filename().string(), StartsWith(".model.safetensors.tmp-"));
    EXPECT_TRUE(seen.insert(t).second) << t;
  }
}

TEST(UniqueFd, ClosesOnDestructionAndMoves) {
  TempDir dir;
  WriteText(dir.path() / "f", "x");
  int raw = -1;
  {
    UniqueFd fd(::open((dir.path() / "f").c_str(), O_RDONLY | O_CLOEXEC));
    ASSERT_TRUE(fd);
    raw = fd.get();
    UniqueFd moved(std::move(fd));
    EXPECT_FALSE(fd);  // NOLINT(bugprone-use-after-move): testing the moved-from state
    EXPECT_EQ(moved.get(), raw);
    UniqueFd assigned;
    assigned = std::move(moved);
    EXPECT_EQ(assigned.get(), raw);
    EXPECT_NE(::fcntl(raw, F_GETFD), -1);
  }
  errno = 0;
  EXPECT_EQ(::fcntl(raw, F_GETFD), -1);
  EXPECT_EQ(errno, EBADF);

  UniqueFd released(::open((dir.path() / "f").c_str(), O_RDONLY | O_CLOEXEC));
  int r = released.release();
  EXPECT_FALSE(released);
  EXPECT_NE(::fcntl(r, F_GETFD), -1) << "release() hands over without closing";
  ::close(r);
}

TEST(WriteAll, WritesEverything) {
  TempDir dir;
  const fs::path path = dir.path() / "out";
  const std::string data = RandomString(1 << 20, 3);
  {
    UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644));
    ASSERT_TRUE(fd);
    ASSERT_TRUE(WriteAll(fd.get(), std::as_bytes(std::span(data)), path).ok());
  }
  EXPECT_EQ(*ReadFileToString(path), data);
  UniqueFd ro(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  auto s = WriteAll(ro.get(), std::as_bytes(std::span(data)), path);
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(Msg(s), HasSubstr("write " + path.string()));
}

}  // namespace
}  // namespace stitch

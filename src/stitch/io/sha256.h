// SHA-256 as object stores record it: the S3 store signs payloads with it
// (`x-amz-content-sha256`), records it per object (`x-amz-meta-stitch-sha256`,
// `x-amz-checksum-sha256`) and checks downloads against it; the multi-host
// publisher's receipts carry it. Backed by OpenSSL.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace stitch {

// The hex digest of the empty string, the payload hash of a bodiless request.
inline constexpr std::string_view kEmptySha256 =
    "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855";

// Streaming SHA-256. Move-only; not thread-safe.
class Sha256 {
 public:
  Sha256();
  Sha256(Sha256&&) noexcept;
  Sha256& operator=(Sha256&&) noexcept;
  ~Sha256();

  void Update(std::string_view bytes);
  // 64 lowercase hex digits of everything fed since construction or the last
  // Finish(); starts over afterwards.
  std::string FinishHex();

 private:
  struct State;
  std::unique_ptr<State> state_;
};

// 64 lowercase hex digits.
std::string Sha256Hex(std::string_view bytes);

// True when `hex` is 64 hex digits (either case).
bool IsSha256Hex(std::string_view hex);

// The base64 form S3's `x-amz-checksum-sha256` uses, from the hex form.
// REQUIRES: IsSha256Hex(hex).
std::string Sha256HexToBase64(std::string_view hex);

// A file's size and SHA-256, read in one pass.
struct FileDigest {
  uint64_t size = 0;
  std::string sha256;  // hex
};

// Hashes the regular file at `path`. Errors name the path.
[[nodiscard]] absl::StatusOr<FileDigest> HashFile(const std::filesystem::path& path);

}  // namespace stitch

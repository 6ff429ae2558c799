// Checksums of tensor bytes: xxh3-128, as the delta format records them.
//
// The text form is XXH128's canonical (big-endian) representation as 32
// lowercase hex digits, the same string Python's
// `xxhash.xxh3_128(data).hexdigest()` returns.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"

namespace stitch {

// The name recorded as the index's `checksum_format`.
inline constexpr std::string_view kChecksumFormat = "xxh3-128";

struct Checksum128 {
  uint64_t high = 0;
  uint64_t low = 0;

  // 32 lowercase hex digits, big-endian (high word first).
  std::string ToHex() const;

  // Parses exactly 32 hex digits (lowercase or uppercase). Anything else is
  // InvalidArgument.
  [[nodiscard]] static absl::StatusOr<Checksum128> FromHex(std::string_view hex);

  friend bool operator==(const Checksum128&, const Checksum128&) = default;
};

// The xxh3-128 of `bytes` in one call.
Checksum128 Xxh3Checksum(std::span<const std::byte> bytes);

// The fingerprint of a whole set of weights: the xxh3-128 of, for every
// tensor in name order, its name, a NUL byte and the 16 bytes of its
// checksum's canonical form. Two sets of weights have the same fingerprint
// exactly when they name the same tensors with the same checksums, so an
// engine that reports the fingerprint of what it loaded can be checked
// against the checksums a store records, without moving any tensor bytes.
Checksum128 WeightsFingerprint(const std::map<std::string, Checksum128, std::less<>>& checksums);

// Streaming xxh3-128: Update() with consecutive pieces, then Digest(). The
// result equals Xxh3Checksum of the concatenation. Move-only; not
// thread-safe.
class Xxh3Hasher {
 public:
  Xxh3Hasher();
  Xxh3Hasher(Xxh3Hasher&&) noexcept;
  Xxh3Hasher& operator=(Xxh3Hasher&&) noexcept;
  ~Xxh3Hasher();

  // Starts over, as if freshly constructed.
  void Reset();
  void Update(std::span<const std::byte> bytes);
  // The checksum of everything fed since construction or Reset(). Does not
  // change the state.
  Checksum128 Digest() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace stitch

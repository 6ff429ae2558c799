#include "stitch/format/checksum.h"

#include <xxhash.h>

#include <cstdlib>
#include <new>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "stitch/format/xxh3_ops.h"

namespace stitch {

namespace {

int HexValue(char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

std::string Checksum128::ToHex() const {
  XXH128_canonical_t canonical;
  XXH128_canonicalFromHash(&canonical, XXH128_hash_t{low, high});
  static constexpr char kDigits[] = "0123456789abcdef";
  std::string out(32, '0');
  for (size_t i = 0; i < sizeof canonical.digest; ++i) {
    out[2 * i] = kDigits[canonical.digest[i] >> 4];
    out[2 * i + 1] = kDigits[canonical.digest[i] & 0xf];
  }
  return out;
}

absl::StatusOr<Checksum128> Checksum128::FromHex(std::string_view hex) {
  auto bad = [&] {
    return absl::InvalidArgumentError(
        absl::StrCat("checksum \"",
                     absl::CEscape(absl::string_view(hex.data(), std::min<size_t>(hex.size(), 64))),
                     "\" is not 32 hex digits (xxh3-128)"));
  };
  if (hex.size() != 32) return bad();
  XXH128_canonical_t canonical;
  for (size_t i = 0; i < 16; ++i) {
    int hi = HexValue(hex[2 * i]);
    int lo = HexValue(hex[2 * i + 1]);
    if (hi < 0 || lo < 0) return bad();
    canonical.digest[i] = static_cast<unsigned char>(hi << 4 | lo);
  }
  const XXH128_hash_t h = XXH128_hashFromCanonical(&canonical);
  return Checksum128{h.high64, h.low64};
}

namespace {

// The xxh3 build for this CPU, picked once.
const format_internal::Xxh3Ops& Ops() {
  static const format_internal::Xxh3Ops& ops = format_internal::Xxh3OpsAvx2() != nullptr
                                                   ? *format_internal::Xxh3OpsAvx2()
                                                   : format_internal::Xxh3OpsDefault();
  return ops;
}

}  // namespace

Checksum128 Xxh3Checksum(std::span<const std::byte> bytes) {
  Checksum128 c;
  Ops().hash(bytes.data(), bytes.size(), c.high, c.low);
  return c;
}

struct Xxh3Hasher::State {
  format_internal::Xxh3State s;
};

Xxh3Hasher::Xxh3Hasher() : state_(std::make_unique<State>()) { Reset(); }
Xxh3Hasher::Xxh3Hasher(Xxh3Hasher&&) noexcept = default;
Xxh3Hasher& Xxh3Hasher::operator=(Xxh3Hasher&&) noexcept = default;
Xxh3Hasher::~Xxh3Hasher() = default;

void Xxh3Hasher::Reset() { Ops().reset(state_->s); }

void Xxh3Hasher::Update(std::span<const std::byte> bytes) {
  Ops().update(state_->s, bytes.data(), bytes.size());
}

Checksum128 Xxh3Hasher::Digest() const {
  Checksum128 c;
  Ops().digest(state_->s, c.high, c.low);
  return c;
}

Checksum128 WeightsFingerprint(const std::map<std::string, Checksum128, std::less<>>& checksums) {
  Xxh3Hasher hasher;
  for (const auto& [name, checksum] : checksums) {
    XXH128_canonical_t canonical;
    XXH128_canonicalFromHash(&canonical, XXH128_hash_t{checksum.low, checksum.high});
    hasher.Update(std::as_bytes(std::span(name.data(), name.size())));
    const std::byte separator{0};
    hasher.Update(std::span(&separator, 1));
    hasher.Update(std::as_bytes(std::span(canonical.digest)));
  }
  return hasher.Digest();
}

}  // namespace stitch

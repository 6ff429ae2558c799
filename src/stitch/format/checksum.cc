#include "stitch/format/checksum.h"

#include <xxhash.h>

#include <cstdlib>
#include <new>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"

namespace stitch {

namespace {

Checksum128 FromXxh(XXH128_hash_t h) { return Checksum128{h.high64, h.low64}; }

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
  return FromXxh(XXH128_hashFromCanonical(&canonical));
}

Checksum128 Xxh3Checksum(std::span<const std::byte> bytes) {
  return FromXxh(XXH3_128bits(bytes.data(), bytes.size()));
}

// XXH3_state_t must be 64-byte aligned; XXH3_createState guarantees that.
struct Xxh3Hasher::State {
  XXH3_state_t* s;
  State() : s(XXH3_createState()) {
    if (s == nullptr) throw std::bad_alloc();
    XXH3_128bits_reset(s);
  }
  ~State() { XXH3_freeState(s); }
};

Xxh3Hasher::Xxh3Hasher() : state_(std::make_unique<State>()) {}
Xxh3Hasher::Xxh3Hasher(Xxh3Hasher&&) noexcept = default;
Xxh3Hasher& Xxh3Hasher::operator=(Xxh3Hasher&&) noexcept = default;
Xxh3Hasher::~Xxh3Hasher() = default;

void Xxh3Hasher::Reset() { XXH3_128bits_reset(state_->s); }

void Xxh3Hasher::Update(std::span<const std::byte> bytes) {
  XXH3_128bits_update(state_->s, bytes.data(), bytes.size());
}

Checksum128 Xxh3Hasher::Digest() const { return FromXxh(XXH3_128bits_digest(state_->s)); }

}  // namespace stitch

#include "stitch/io/sha256.h"

#include <fcntl.h>
#include <openssl/evp.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <vector>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "stitch/core/errors.h"
#include "stitch/io/fileio.h"

namespace stitch {

struct Sha256::State {
  EVP_MD_CTX* ctx = nullptr;
  ~State() { EVP_MD_CTX_free(ctx); }
};

namespace {

EVP_MD_CTX* NewSha256Context() {
  EVP_MD_CTX* ctx = EVP_MD_CTX_new();
  // Only allocation can fail here; a process that cannot hash cannot verify
  // anything, so it stops loudly rather than publishing unverified bytes.
  if (ctx == nullptr || EVP_DigestInit_ex(ctx, EVP_sha256(), nullptr) != 1) std::abort();
  return ctx;
}

}  // namespace

Sha256::Sha256() : state_(std::make_unique<State>()) { state_->ctx = NewSha256Context(); }
Sha256::Sha256(Sha256&&) noexcept = default;
Sha256& Sha256::operator=(Sha256&&) noexcept = default;
Sha256::~Sha256() = default;

void Sha256::Update(std::string_view bytes) {
  if (EVP_DigestUpdate(state_->ctx, bytes.data(), bytes.size()) != 1) std::abort();
}

std::string Sha256::FinishHex() {
  unsigned char digest[EVP_MAX_MD_SIZE];
  unsigned int length = 0;
  if (EVP_DigestFinal_ex(state_->ctx, digest, &length) != 1) std::abort();
  if (EVP_DigestInit_ex(state_->ctx, EVP_sha256(), nullptr) != 1) std::abort();
  return absl::BytesToHexString(absl::string_view(reinterpret_cast<const char*>(digest), length));
}

std::string Sha256Hex(std::string_view bytes) {
  Sha256 hasher;
  hasher.Update(bytes);
  return hasher.FinishHex();
}

bool IsSha256Hex(std::string_view hex) {
  if (hex.size() != 64) return false;
  for (char c : hex) {
    if (!absl::ascii_isxdigit(static_cast<unsigned char>(c))) return false;
  }
  return true;
}

std::string Sha256HexToBase64(std::string_view hex) {
  return absl::Base64Escape(absl::HexStringToBytes(AbslView(hex)));
}

absl::StatusOr<FileDigest> HashFile(const std::filesystem::path& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) return ErrnoStatus(errno, "open", path);
  Sha256 hasher;
  FileDigest out;
  std::vector<char> buffer(1 << 20);
  while (true) {
    ssize_t n = ::read(fd.get(), buffer.data(), buffer.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return ErrnoStatus(errno, "read", path);
    if (n == 0) break;
    hasher.Update(std::string_view(buffer.data(), static_cast<size_t>(n)));
    out.size += static_cast<uint64_t>(n);
  }
  out.sha256 = hasher.FinishHex();
  return out;
}

}  // namespace stitch

#include "encode_floor.h"

#include <xxhash.h>
#include <zstd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <vector>

#include "stitch/format/delta_kernel.h"

namespace stitch {
namespace {

// The same XOR as delta_bench's floor: 32-byte vectors, baseline build.
using Vec = uint64_t __attribute__((vector_size(32)));
void Xor(std::byte* out, const std::byte* a, const std::byte* b, size_t n) {
  size_t i = 0;
  for (; i + sizeof(Vec) <= n; i += sizeof(Vec)) {
    Vec x, y;
    std::memcpy(&x, a + i, sizeof x);
    std::memcpy(&y, b + i, sizeof y);
    x ^= y;
    std::memcpy(out + i, &x, sizeof x);
  }
  for (; i < n; ++i) out[i] = a[i] ^ b[i];
}

}  // namespace

FloorTiming EncodeFloor(std::span<const std::byte> base, std::span<const std::byte> target,
                        size_t tensor_bytes) {
  ZSTD_CCtx* c = ZSTD_createCCtx();
  XXH3_state_t* h = XXH3_createState();
  std::vector<std::byte> x(kChunkBytes), out(ZSTD_CStreamOutSize()), frame;
  FloorTiming result;
  const auto start = std::chrono::steady_clock::now();
  for (size_t at = 0; at < base.size(); at += tensor_bytes) {
    const size_t bytes = std::min(tensor_bytes, base.size() - at);
    frame.clear();
    frame.reserve(bytes / 16);
    ZSTD_CCtx_reset(c, ZSTD_reset_session_only);
    ZSTD_CCtx_setParameter(c, ZSTD_c_compressionLevel, 1);
    ZSTD_CCtx_setPledgedSrcSize(c, bytes);
    XXH3_128bits_reset(h);
    const std::byte* b = base.data() + at;
    const std::byte* t = target.data() + at;
    auto drain = [&](ZSTD_inBuffer& in, ZSTD_EndDirective mode) {
      for (;;) {
        ZSTD_outBuffer o{out.data(), out.size(), 0};
        const size_t r = ZSTD_compressStream2(c, &o, &in, mode);
        if (ZSTD_isError(r)) return;
        frame.insert(frame.end(), out.data(), out.data() + o.pos);
        if (mode == ZSTD_e_end ? r == 0 : in.pos == in.size) return;
      }
    };
    for (size_t off = 0; off < bytes; off += kChunkBytes) {
      const size_t n = std::min(kChunkBytes, bytes - off);
      Xor(x.data(), b + off, t + off, n);
      XXH3_128bits_update(h, t + off, n);
      ZSTD_inBuffer in{x.data(), n, 0};
      drain(in, ZSTD_e_continue);
    }
    ZSTD_inBuffer none{nullptr, 0, 0};
    drain(none, ZSTD_e_end);
    XXH128_hash_t sum = XXH3_128bits_digest(h);
    static_cast<void>(sum);
    result.compressed_bytes += frame.size();
  }
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  XXH3_freeState(h);
  ZSTD_freeCCtx(c);
  return result;
}

}  // namespace stitch

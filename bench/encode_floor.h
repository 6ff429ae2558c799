// The encode floor of delta_bench, also built as a shared library for
// bench/python_encode_bench.py (encode_floor_lib.cc): one thread, a
// minimal fused loop of XOR, zstd level 1 and xxh3-128 over each tensor in
// kChunkBytes chunks. Header-only: benchmarks are single files.
#pragma once

#include <xxhash.h>
#include <zstd.h>

#include <algorithm>
#include <cstddef>
#include <optional>
#include <span>
#include <vector>

#include "stitch/delta/delta_kernel.h"

namespace stitch::bench {

// The zstd and xxh3 contexts of the floor, made once for many tensors, and
// the caller's scratch: `x` (kChunkBytes) for the XOR, `out`
// (ZSTD_CStreamOutSize() bytes) for zstd's output.
class FloorEncoder {
 public:
  FloorEncoder(std::span<std::byte> x, std::span<std::byte> out)
      : c_(ZSTD_createCCtx()), h_(XXH3_createState()), x_(x), out_(out) {}
  ~FloorEncoder() {
    XXH3_freeState(h_);
    ZSTD_freeCCtx(c_);
  }
  FloorEncoder(const FloorEncoder&) = delete;
  FloorEncoder& operator=(const FloorEncoder&) = delete;

  // Replaces `frame` by the zstd frame of the XOR of the `bytes` at `base`
  // and `target`; returns the xxh3-128 of the target, or nullopt on a zstd
  // error.
  std::optional<XXH128_hash_t> Encode(const std::byte* base, const std::byte* target, size_t bytes,
                                      std::vector<std::byte>& frame) {
    frame.clear();
    frame.reserve(bytes / 16);
    ZSTD_CCtx_reset(c_, ZSTD_reset_session_only);
    ZSTD_CCtx_setParameter(c_, ZSTD_c_compressionLevel, 1);
    ZSTD_CCtx_setPledgedSrcSize(c_, bytes);
    XXH3_128bits_reset(h_);
    auto drain = [&](ZSTD_inBuffer& in, ZSTD_EndDirective mode) {
      for (;;) {
        ZSTD_outBuffer o{out_.data(), out_.size(), 0};
        const size_t r = ZSTD_compressStream2(c_, &o, &in, mode);
        if (ZSTD_isError(r)) return false;
        frame.insert(frame.end(), out_.data(), out_.data() + o.pos);
        if (mode == ZSTD_e_end ? r == 0 : in.pos == in.size) return true;
      }
    };
    for (size_t off = 0; off < bytes; off += kChunkBytes) {
      const size_t n = std::min(kChunkBytes, bytes - off);
      XorBytes(x_.data(), base + off, target + off, n);
      XXH3_128bits_update(h_, target + off, n);
      ZSTD_inBuffer in{x_.data(), n, 0};
      if (!drain(in, ZSTD_e_continue)) return std::nullopt;
    }
    ZSTD_inBuffer none{nullptr, 0, 0};
    if (!drain(none, ZSTD_e_end)) return std::nullopt;
    return XXH3_128bits_digest(h_);
  }

 private:
  ZSTD_CCtx* c_;
  XXH3_state_t* h_;
  std::span<std::byte> x_, out_;
};

}  // namespace stitch::bench

// Over ~600 lines on purpose: the codec's inner loops (XOR, the zero-run
// matcher, encode, fold, undo) share one workspace type, whose buffers and
// zstd contexts stay private to this file.

#include "stitch/delta/delta_kernel.h"

#define ZSTD_STATIC_LINKING_ONLY  // ZSTD_getFrameHeader, ZSTD_registerSequenceProducer
#include <unistd.h>
#include <zstd.h>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <exception>
#include <new>
#include <numeric>
#include <thread>

#include "absl/strings/str_cat.h"
#include "stitch/core/errors.h"
#include "stitch/io/fileio.h"

namespace stitch {
namespace {

// Compressed bytes read per refill of one frame's input.
constexpr size_t kFrameInputBytes = 64 * 1024;

// Compressed output is staged in a buffer of kCompressedStageBytes and
// handed to the frame sink once less than kCompressedFlushBytes are free.
constexpr size_t kCompressedStageBytes = 1024 * 1024;
constexpr size_t kCompressedFlushBytes = 256 * 1024;

// XOR loops over 32-byte vectors (GCC/Clang vector extensions; memcpy keeps
// the loads and stores unaligned-safe and compiles to plain vector moves).
// GCC also builds an AVX2 clone and picks it at load time. The chunks these
// run on are L2-resident, so they are cheap next to zstd either way.
#if defined(__GNUC__) && !defined(__clang__) && defined(__x86_64__)
#define STITCH_XOR_CLONES __attribute__((target_clones("avx2", "default")))
#else
#define STITCH_XOR_CLONES
#endif

using Vec = uint64_t __attribute__((vector_size(32)));

// XorBytes (delta_kernel.h), with the AVX2 clone.
STITCH_XOR_CLONES void XorInto(std::byte* out, const std::byte* a, const std::byte* b, size_t n) {
  XorBytes(out, a, b, n);
}

// XorBytes that also returns whether any result byte is non-zero, and,
// when kCopy, stores b's bytes at `copy` as well (`copy` may be `a`: each
// vector is read before it is written).
template <bool kCopy>
[[gnu::always_inline]] inline bool XorAnyLoop(std::byte* out, const std::byte* a,
                                              const std::byte* b, std::byte* copy, size_t n) {
  Vec any = {0, 0, 0, 0};
  size_t i = 0;
  for (; i + sizeof(Vec) <= n; i += sizeof(Vec)) {
    Vec x, y;
    std::memcpy(&x, a + i, sizeof x);
    std::memcpy(&y, b + i, sizeof y);
    if constexpr (kCopy) std::memcpy(copy + i, &y, sizeof y);
    x ^= y;
    any |= x;
    std::memcpy(out + i, &x, sizeof x);
  }
  uint64_t tail = 0;
  for (; i < n; ++i) {
    const std::byte y = b[i];
    out[i] = a[i] ^ y;
    if constexpr (kCopy) copy[i] = y;
    tail |= static_cast<uint64_t>(out[i]);
  }
  return (any[0] | any[1] | any[2] | any[3] | tail) != 0;
}

STITCH_XOR_CLONES bool XorIntoAny(std::byte* out, const std::byte* a, const std::byte* b,
                                  size_t n) {
  return XorAnyLoop<false>(out, a, b, nullptr, n);
}

STITCH_XOR_CLONES bool XorIntoAnyAndCopy(std::byte* out, const std::byte* a, const std::byte* b,
                                         std::byte* copy, size_t n) {
  return XorAnyLoop<true>(out, a, b, copy, n);
}

#if ZSTD_VERSION_NUMBER >= 10504
// Bit i set when byte i of the 64 at `p` is not zero.
inline uint64_t NonZeroMask64(const std::byte* p) {
#if defined(__SSE2__)
  const __m128i zero = _mm_setzero_si128();
  uint64_t z = 0;
  for (int k = 0; k < 4; ++k) {
    const __m128i v = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p + 16 * k));
    z |= static_cast<uint64_t>(static_cast<uint32_t>(_mm_movemask_epi8(_mm_cmpeq_epi8(v, zero))))
         << (16 * k);
  }
  return ~z;
#else
  uint64_t m = 0;
  for (int i = 0; i < 64; ++i) m |= static_cast<uint64_t>(p[i] != std::byte{0}) << i;
  return m;
#endif
}

// The parse of the zero-run producer: every run of at least kMinZeroRun
// zero bytes becomes a match at offset 1 whose first zero is kept as a
// literal (the match repeats it); every other byte is a literal. A sparse
// XOR stream is exactly this: long zero runs between the few changed bytes.
// zstd then entropy-codes the parse (Huffman literals, FSE sequences), so the
// frame is an ordinary zstd frame any decoder reads.
constexpr size_t kMinZeroRun = 1 + ZSTD_MINMATCH_MIN;

// ZSTD_sequenceProducer_F over one block (at most ZSTD_BLOCKSIZE_MAX bytes,
// no history). Each sequence covers at least kMinZeroRun bytes, so at most
// srcSize / kMinZeroRun + 1 are written: within ZSTD_sequenceBound(srcSize),
// the capacity zstd guarantees.
size_t ZeroRunSequences(void* /*state*/, ZSTD_Sequence* out, size_t capacity, const void* src,
                        size_t n, const void* /*dict*/, size_t /*dict_size*/, int /*level*/,
                        size_t /*window_size*/) {
  if (capacity < n / kMinZeroRun + 1) return ZSTD_SEQUENCE_PRODUCER_ERROR;
  const auto* p = static_cast<const std::byte*>(src);
  size_t count = 0;
  size_t literal_start = 0;  // first byte not yet in a sequence
  size_t zeros_from = 0;     // the zero run before the next non-zero byte starts here
  // Ends the zero run [zeros_from, q) with a sequence when it is long enough.
  // Branch-free in the common case: the slot is always written and counted
  // only when used.
  auto end_run = [&](size_t q) {
    const size_t run = q - zeros_from;
    out[count] = ZSTD_Sequence{1, static_cast<unsigned>(zeros_from + 1 - literal_start),
                               static_cast<unsigned>(run - 1), 0};
    const bool emit = run >= kMinZeroRun;
    count += emit ? 1 : 0;
    literal_start = emit ? q : literal_start;
  };
  size_t i = 0;
  for (; i + 64 <= n; i += 64) {
    for (uint64_t m = NonZeroMask64(p + i); m != 0; m &= m - 1) {
      const size_t q = i + static_cast<size_t>(__builtin_ctzll(m));
      end_run(q);
      zeros_from = q + 1;
    }
  }
  for (; i < n; ++i) {
    if (p[i] != std::byte{0}) {
      end_run(i);
      zeros_from = i + 1;
    }
  }
  if (n - zeros_from >= kMinZeroRun) end_run(n);  // a trailing zero run
  if (literal_start < n) {                        // trailing literals: the block delimiter
    out[count++] = ZSTD_Sequence{0, static_cast<unsigned>(n - literal_start), 0, 0};
  }
  return count;
}
#endif  // ZSTD_VERSION_NUMBER >= 10504

absl::Status FrameError(std::string_view tensor, std::string_view label, absl::string_view what) {
  return absl::DataLossError(absl::StrCat("tensor \"", AbslView(tensor), "\": zstd frame in ",
                                          AbslView(label), " ", what));
}

// One frame being decoded in lockstep with others.
struct DecoderSlot {
  ZSTD_DCtx* dctx = nullptr;
  AlignedBuffer input;
  ZSTD_inBuffer in{nullptr, 0, 0};
  const FrameRef* frame = nullptr;
  uint64_t next_read = 0;  // offset within the frame of the next unread byte
  uint64_t produced = 0;
  bool done = false;
};

}  // namespace

struct CodecWorkspace::Impl {
  AlignedBuffer work;  // base chunk / folded result (when the sink has no memory)
  AlignedBuffer xbuf;  // XOR stream of the first frame; the accumulated XOR
  AlignedBuffer ybuf;  // XOR stream of the other frames; the target chunk (encode)
  std::vector<DecoderSlot> slots;
  ZSTD_CCtx* cctx = nullptr;
  AlignedBuffer cout;  // compressed output
  Xxh3Hasher hasher;
  Xxh3Hasher base_hasher;  // EncodeXorFrame's, of the base tensor

  ~Impl() {
    for (DecoderSlot& s : slots) ZSTD_freeDCtx(s.dctx);
    ZSTD_freeCCtx(cctx);
  }

  static absl::StatusOr<AlignedBuffer> Buffer(size_t n) {
    return AlignedBuffer::Allocate(n, BufferInit::kUninitialized);
  }

  absl::Status EnsureChunkBuffers() {
    if (work.size() != 0) return absl::OkStatus();
    for (AlignedBuffer* b : {&work, &xbuf, &ybuf}) {
      absl::StatusOr<AlignedBuffer> nb = Buffer(kChunkBytes);
      if (!nb.ok()) return nb.status();
      *b = *std::move(nb);
    }
    return absl::OkStatus();
  }

  absl::Status EnsureSlots(size_t n) {
    while (slots.size() < n) {
      DecoderSlot s;
      s.dctx = ZSTD_createDCtx();
      if (s.dctx == nullptr)
        return absl::ResourceExhaustedError("out of memory creating a zstd decoder");
      absl::StatusOr<AlignedBuffer> in = Buffer(kFrameInputBytes);
      if (!in.ok()) {
        ZSTD_freeDCtx(s.dctx);
        return in.status();
      }
      s.input = *std::move(in);
      slots.push_back(std::move(s));
    }
    return absl::OkStatus();
  }

  absl::Status EnsureEncoder() {
    if (cctx != nullptr) return absl::OkStatus();
    cctx = ZSTD_createCCtx();
    if (cctx == nullptr)
      return absl::ResourceExhaustedError("out of memory creating a zstd encoder");
    absl::StatusOr<AlignedBuffer> b = Buffer(kCompressedStageBytes);
    if (!b.ok()) return b.status();
    cout = *std::move(b);
    return absl::OkStatus();
  }
};

CodecWorkspace::CodecWorkspace() : impl_(std::make_unique<Impl>()) {}
CodecWorkspace::~CodecWorkspace() = default;

absl::StatusOr<std::span<const std::byte>> FileSource::Read(uint64_t offset,
                                                            std::span<std::byte> scratch) {
  if (absl::Status s = ReadFully(fd_, offset_ + offset, scratch, *path_); !s.ok()) return s;
  return scratch;
}

absl::Status FileSink::Commit(uint64_t offset, std::span<const std::byte> bytes) {
  size_t done = 0;
  while (done < bytes.size()) {
    ssize_t n = ::pwrite(fd_, bytes.data() + done, bytes.size() - done,
                         static_cast<off_t>(offset_ + offset + done));
    if (n < 0) {
      if (errno == EINTR) continue;
      return ErrnoStatus(errno, "write", *path_);
    }
    done += static_cast<size_t>(n);
  }
  return absl::OkStatus();
}

void ProgressMeter::Add(uint64_t n) {
  uint64_t before = done_.fetch_add(n, std::memory_order_relaxed);
  uint64_t after = before + n;
  if (before / step_ != after / step_) {
    absl::MutexLock lock(&mu_);
    if (callback_) callback_(std::min(after, total_), total_);
  }
}

void ProgressMeter::Finish() {
  absl::MutexLock lock(&mu_);
  if (callback_) callback_(total_, total_);
}

namespace {

// Makes more compressed input available to `s` if it has consumed what it
// had and the frame has more.
absl::Status Refill(DecoderSlot& s) {
  if (s.in.pos < s.in.size || s.next_read >= s.frame->size) return absl::OkStatus();
  const FrameRef& f = *s.frame;
  if (f.fd < 0) {
    s.in = ZSTD_inBuffer{f.memory.data(), f.memory.size(), 0};
    s.next_read = f.size;
    return absl::OkStatus();
  }
  size_t n = static_cast<size_t>(std::min<uint64_t>(s.input.size(), f.size - s.next_read));
  if (absl::Status st = ReadFully(f.fd, f.offset + s.next_read, s.input.span().first(n), f.label);
      !st.ok()) {
    return st;
  }
  s.in = ZSTD_inBuffer{s.input.data(), n, 0};
  s.next_read += n;
  return absl::OkStatus();
}

bool InputExhausted(const DecoderSlot& s) {
  return s.in.pos == s.in.size && s.next_read >= s.frame->size;
}

void StartSlot(DecoderSlot& s, const FrameRef& frame) {
  ZSTD_DCtx_reset(s.dctx, ZSTD_reset_session_only);
  s.in = ZSTD_inBuffer{nullptr, 0, 0};
  s.frame = &frame;
  s.next_read = 0;
  s.produced = 0;
  s.done = false;
}

// Decodes exactly out.size() more bytes of the frame into `out`.
absl::Status DecodeInto(DecoderSlot& s, std::span<std::byte> out, std::string_view tensor,
                        uint64_t nbytes) {
  ZSTD_outBuffer o{out.data(), out.size(), 0};
  while (o.pos < o.size) {
    if (s.done) {
      return FrameError(tensor, s.frame->label,
                        absl::StrCat("is truncated: it decodes to ", s.produced + o.pos,
                                     " bytes, the tensor has ", nbytes));
    }
    if (absl::Status st = Refill(s); !st.ok()) return st;
    const size_t out_before = o.pos, in_before = s.in.pos;
    size_t r = ZSTD_decompressStream(s.dctx, &o, &s.in);
    if (ZSTD_isError(r)) {
      return FrameError(tensor, s.frame->label, absl::StrCat("is corrupt: ", ZSTD_getErrorName(r)));
    }
    if (r == 0) {
      s.done = true;
    } else if (o.pos == out_before && s.in.pos == in_before && InputExhausted(s)) {
      return FrameError(tensor, s.frame->label,
                        absl::StrCat("is truncated: its compressed bytes end after ",
                                     s.produced + o.pos, " of ", nbytes, " decoded bytes"));
    }
  }
  s.produced += out.size();
  return absl::OkStatus();
}

// After all `nbytes` were produced: the frame must end here, with nothing
// after it.
absl::Status FinishSlot(DecoderSlot& s, std::string_view tensor, uint64_t nbytes) {
  while (!s.done) {
    if (absl::Status st = Refill(s); !st.ok()) return st;
    std::byte extra;
    ZSTD_outBuffer o{&extra, 1, 0};
    const size_t in_before = s.in.pos;
    size_t r = ZSTD_decompressStream(s.dctx, &o, &s.in);
    if (ZSTD_isError(r)) {
      return FrameError(tensor, s.frame->label, absl::StrCat("is corrupt: ", ZSTD_getErrorName(r)));
    }
    if (o.pos != 0) {
      return FrameError(tensor, s.frame->label,
                        absl::StrCat("decodes to more than the tensor's ", nbytes, " bytes"));
    }
    if (r == 0) {
      s.done = true;
    } else if (s.in.pos == in_before && InputExhausted(s)) {
      return FrameError(tensor, s.frame->label, "is truncated: its compressed bytes end early");
    }
  }
  uint64_t trailing = (s.in.size - s.in.pos) + (s.frame->size - s.next_read);
  if (trailing != 0) {
    return FrameError(tensor, s.frame->label,
                      absl::StrCat("is followed by ", trailing, " trailing bytes"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::Status FoldFrames(CodecWorkspace& ws, const FoldSpec& spec, ChunkSource& base, ChunkSink& out,
                        FoldProgress* progress) {
  CodecWorkspace::Impl& w = ws.impl();
  const uint64_t limit = std::min(spec.limit, spec.nbytes);
  if (spec.frames.empty()) {
    return absl::InternalError(
        absl::StrCat("tensor \"", AbslView(spec.tensor), "\": no frames to fold"));
  }
  if (spec.expected && limit != spec.nbytes) {
    return absl::InternalError("a checksum can only be verified over the whole tensor");
  }
  if (progress != nullptr) *progress = FoldProgress{};
  if (absl::Status s = w.EnsureChunkBuffers(); !s.ok()) return s;
  const size_t group_max = std::min(spec.frames.size(), kMaxFramesPerPass);
  if (absl::Status s = w.EnsureSlots(group_max); !s.ok()) return s;

  for (size_t start = 0; start < spec.frames.size(); start += kMaxFramesPerPass) {
    const size_t count = std::min(kMaxFramesPerPass, spec.frames.size() - start);
    const bool last_pass = start + count == spec.frames.size();
    const bool hash = last_pass && spec.expected.has_value();
    ChunkSource* src = &base;
    if (start > 0) {
      src = out.ReadBack();
      if (src == nullptr) {
        return absl::InternalError(
            absl::StrCat("tensor \"", AbslView(spec.tensor), "\": a chain of ", spec.frames.size(),
                         " frames needs a destination that can be read back"));
      }
    }
    for (size_t j = 0; j < count; ++j) StartSlot(w.slots[j], spec.frames[start + j]);
    if (hash) w.hasher.Reset();

    for (uint64_t off = 0; off < limit; off += kChunkBytes) {
      if (spec.cancel != nullptr && spec.cancel->load(std::memory_order_relaxed)) {
        return absl::CancelledError("cancelled after another tensor failed");
      }
      const size_t n = static_cast<size_t>(std::min<uint64_t>(kChunkBytes, limit - off));
      std::span<std::byte> x = w.xbuf.span().first(n);
      for (size_t j = 0; j < count; ++j) {
        std::span<std::byte> dst = j == 0 ? x : w.ybuf.span().first(n);
        if (absl::Status s = DecodeInto(w.slots[j], dst, spec.tensor, spec.nbytes); !s.ok()) {
          return s;
        }
        if (j > 0) XorInto(x.data(), x.data(), dst.data(), n);
      }
      absl::StatusOr<std::span<const std::byte>> b = src->Read(off, w.work.span().first(n));
      if (!b.ok()) return b.status();
      std::span<std::byte> t = out.Target(off, w.work.span().first(n));
      XorInto(t.data(), b->data(), x.data(), n);
      if (hash) w.hasher.Update(t);
      if (absl::Status s = out.Commit(off, t); !s.ok()) return s;
      if (progress != nullptr) progress->prefix_done = off + n;
      if (last_pass && spec.progress != nullptr) spec.progress->Add(n);
    }
    if (limit == spec.nbytes) {
      for (size_t j = 0; j < count; ++j) {
        if (absl::Status s = FinishSlot(w.slots[j], spec.tensor, spec.nbytes); !s.ok()) return s;
      }
    }
    if (progress != nullptr) *progress = FoldProgress{start + count, 0};
  }

  if (spec.expected) {
    Checksum128 got = w.hasher.Digest();
    if (got != *spec.expected) {
      return WithKind(
          absl::DataLossError(absl::StrCat(
              "tensor \"", AbslView(spec.tensor), "\": checksum mismatch after applying ",
              spec.frames.back().label, ": expected xxh3-128 ", spec.expected->ToHex(), ", got ",
              got.ToHex(), "; the delta or its base checkpoint is corrupt")),
          ErrorKind::kChecksumMismatch);
    }
  }
  return absl::OkStatus();
}

absl::StatusOr<EncodedFrame> EncodeXorFrame(CodecWorkspace& ws, const EncodeSpec& spec,
                                            ChunkSource& base, ChunkSource& target,
                                            FrameSink& out) {
  CodecWorkspace::Impl& w = ws.impl();
  if (absl::Status s = w.EnsureChunkBuffers(); !s.ok()) return s;
  if (absl::Status s = w.EnsureEncoder(); !s.ok()) return s;
  auto zstd_error = [&](size_t r) {
    return absl::InternalError(absl::StrCat("tensor \"", AbslView(spec.tensor),
                                            "\": zstd compression failed: ", ZSTD_getErrorName(r)));
  };
  ZSTD_CCtx_reset(w.cctx, ZSTD_reset_session_and_parameters);
  for (auto [param, value] :
       {std::pair{ZSTD_c_compressionLevel, spec.level}, std::pair{ZSTD_c_checksumFlag, 0},
        std::pair{ZSTD_c_contentSizeFlag, 1},
        std::pair{ZSTD_c_enableLongDistanceMatching, static_cast<int>(ZSTD_ps_disable)}}) {
    if (size_t r = ZSTD_CCtx_setParameter(w.cctx, param, value); ZSTD_isError(r))
      return zstd_error(r);
  }
  // The reset above also unregisters the producer. (zstd before 1.5.4 has
  // no producer API: its own level-1 matcher encodes instead.)
#if ZSTD_VERSION_NUMBER >= 10504
  if (spec.level <= kZeroRunMaxLevel) {
    ZSTD_registerSequenceProducer(w.cctx, nullptr, ZeroRunSequences);
  }
#endif
  if (size_t r = ZSTD_CCtx_setPledgedSrcSize(w.cctx, spec.nbytes); ZSTD_isError(r)) {
    return zstd_error(r);
  }
  w.hasher.Reset();
  w.base_hasher.Reset();
  EncodedFrame result;

  // Compressed bytes collect in `cout` and go to the sink when it is nearly
  // full (a delta compresses ~50:1, so a write per chunk would be mostly
  // syscall overhead).
  ZSTD_outBuffer o{w.cout.data(), w.cout.size(), 0};
  auto flush = [&]() -> absl::Status {
    if (o.pos == 0) return absl::OkStatus();
    absl::Status s = out.Append(w.cout.span().first(o.pos));
    result.frame_size += o.pos;
    o.pos = 0;
    return s;
  };
  auto drain = [&](ZSTD_inBuffer& in, ZSTD_EndDirective mode) -> absl::Status {
    for (;;) {
      if (o.size - o.pos < kCompressedFlushBytes) {
        if (absl::Status s = flush(); !s.ok()) return s;
      }
      size_t r = ZSTD_compressStream2(w.cctx, &o, &in, mode);
      if (ZSTD_isError(r)) return zstd_error(r);
      const bool finished = mode == ZSTD_e_end ? r == 0 : in.pos == in.size;
      if (finished) return mode == ZSTD_e_end ? flush() : absl::OkStatus();
    }
  };

  for (uint64_t off = 0; off < spec.nbytes; off += kChunkBytes) {
    if (spec.cancel != nullptr && spec.cancel->load(std::memory_order_relaxed)) {
      return absl::CancelledError("cancelled after another tensor failed");
    }
    const size_t n = static_cast<size_t>(std::min<uint64_t>(kChunkBytes, spec.nbytes - off));
    absl::StatusOr<std::span<const std::byte>> b = base.Read(off, w.work.span().first(n));
    if (!b.ok()) return b.status();
    absl::StatusOr<std::span<const std::byte>> t = target.Read(off, w.ybuf.span().first(n));
    if (!t.ok()) return t.status();
    // Hashed before the XOR: with copy_target_to, `b` may be the very
    // memory the target is copied into.
    w.base_hasher.Update(*b);
    const bool changed =
        spec.copy_target_to != nullptr
            ? XorIntoAnyAndCopy(w.xbuf.data(), b->data(), t->data(), spec.copy_target_to + off, n)
            : XorIntoAny(w.xbuf.data(), b->data(), t->data(), n);
    if (changed) result.changed = true;
    w.hasher.Update(*t);
    ZSTD_inBuffer in{w.xbuf.data(), n, 0};
    if (absl::Status s = drain(in, ZSTD_e_continue); !s.ok()) return s;
    if (spec.progress != nullptr) spec.progress->Add(n);
  }
  ZSTD_inBuffer none{nullptr, 0, 0};
  if (absl::Status s = drain(none, ZSTD_e_end); !s.ok()) return s;
  result.target_checksum = w.hasher.Digest();
  result.base_checksum = w.base_hasher.Digest();
  return result;
}

absl::StatusOr<FrameHeaderInfo> ParseFrameHeader(std::span<const std::byte> prefix,
                                                 std::string_view label) {
  ZSTD_frameHeader h;
  size_t r = ZSTD_getFrameHeader(&h, prefix.data(), prefix.size());
  if (ZSTD_isError(r)) {
    return absl::InvalidArgumentError(
        absl::StrCat(AbslView(label), ": not a zstd frame (", ZSTD_getErrorName(r), ")"));
  }
  if (r > 0) {
    return absl::InvalidArgumentError(absl::StrCat(
        AbslView(label), ": zstd frame header is cut short (", prefix.size(), " bytes)"));
  }
  if (h.frameType != ZSTD_frame) {
    return absl::InvalidArgumentError(
        absl::StrCat(AbslView(label), ": a skippable zstd frame holds no data"));
  }
  FrameHeaderInfo info;
  if (h.frameContentSize != ZSTD_CONTENTSIZE_UNKNOWN) info.content_size = h.frameContentSize;
  info.window_size = h.windowSize;
  return info;
}

absl::Status CheckFrameHeader(const FrameRef& frame, std::string_view tensor,
                              std::optional<uint64_t> nbytes) {
  std::byte buf[kMaxFrameHeaderBytes];
  const size_t n = static_cast<size_t>(std::min<uint64_t>(frame.size, sizeof buf));
  std::span<const std::byte> prefix;
  if (frame.fd >= 0) {
    if (absl::Status s = ReadFully(frame.fd, frame.offset, std::span(buf, n), frame.label);
        !s.ok()) {
      return s;
    }
    prefix = std::span<const std::byte>(buf, n);
  } else {
    prefix = frame.memory.first(n);
  }
  absl::StatusOr<FrameHeaderInfo> info = ParseFrameHeader(prefix, frame.label);
  if (!info.ok()) {
    return absl::DataLossError(
        absl::StrCat("tensor \"", AbslView(tensor), "\": ", info.status().message()));
  }
  if (nbytes && info->content_size && *info->content_size != *nbytes) {
    return FrameError(
        tensor, frame.label,
        absl::StrCat("decodes to ", *info->content_size, " bytes, the tensor has ", *nbytes));
  }
  return absl::OkStatus();
}

absl::StatusOr<uint64_t> DecodedFrameSize(CodecWorkspace& ws, const FrameRef& frame,
                                          std::string_view tensor, uint64_t max_bytes) {
  CodecWorkspace::Impl& w = ws.impl();
  if (absl::Status s = w.EnsureChunkBuffers(); !s.ok()) return s;
  if (absl::Status s = w.EnsureSlots(1); !s.ok()) return s;
  DecoderSlot& s = w.slots[0];
  StartSlot(s, frame);
  while (!s.done) {
    if (absl::Status st = Refill(s); !st.ok()) return st;
    ZSTD_outBuffer o{w.xbuf.data(), w.xbuf.size(), 0};
    const size_t in_before = s.in.pos;
    size_t r = ZSTD_decompressStream(s.dctx, &o, &s.in);
    if (ZSTD_isError(r)) {
      return FrameError(tensor, frame.label, absl::StrCat("is corrupt: ", ZSTD_getErrorName(r)));
    }
    s.produced += o.pos;
    if (s.produced > max_bytes) {
      return FrameError(tensor, frame.label,
                        absl::StrCat("decodes to more than ", max_bytes, " bytes"));
    }
    if (r == 0) {
      s.done = true;
    } else if (o.pos == 0 && s.in.pos == in_before && InputExhausted(s)) {
      return FrameError(tensor, frame.label, "is truncated: its compressed bytes end early");
    }
  }
  uint64_t trailing = (s.in.size - s.in.pos) + (frame.size - s.next_read);
  if (trailing != 0) {
    return FrameError(tensor, frame.label,
                      absl::StrCat("is followed by ", trailing, " trailing bytes"));
  }
  return s.produced;
}

std::vector<size_t> LargestFirst(std::span<const uint64_t> sizes) {
  std::vector<size_t> order(sizes.size());
  std::iota(order.begin(), order.end(), size_t{0});
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return sizes[a] > sizes[b]; });
  return order;
}

}  // namespace stitch

// An owned byte buffer aligned to kBufferAlignment (a cache line, and enough
// for any vector load). Move-only.
#pragma once

#include <cstddef>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <span>

#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"

namespace stitch {

inline constexpr size_t kBufferAlignment = 64;

// Whether a new buffer's bytes are zeroed (and its pages faulted in) or left
// as they come, for a caller that overwrites every byte at once.
enum class BufferInit { kZeroed, kUninitialized };

class AlignedBuffer {
 public:
  AlignedBuffer() = default;

  // A buffer of `size` bytes. ResourceExhausted when memory runs out.
  [[nodiscard]] static absl::StatusOr<AlignedBuffer> Allocate(
      size_t size, BufferInit init = BufferInit::kZeroed) {
    // aligned_alloc needs a size that is a multiple of the alignment, and
    // must not be asked for 0 bytes portably.
    size_t rounded = (size + kBufferAlignment - 1) / kBufferAlignment * kBufferAlignment;
    if (rounded == 0) rounded = kBufferAlignment;
    void* p = std::aligned_alloc(kBufferAlignment, rounded);
    if (p == nullptr) {
      return absl::ResourceExhaustedError(
          absl::StrCat("out of memory allocating ", size, " bytes for a tensor buffer"));
    }
    if (init == BufferInit::kZeroed) std::memset(p, 0, rounded);
    AlignedBuffer b;
    b.data_.reset(static_cast<std::byte*>(p));
    b.size_ = size;
    return b;
  }

  std::byte* data() { return data_.get(); }
  const std::byte* data() const { return data_.get(); }
  size_t size() const { return size_; }
  std::span<std::byte> span() { return {data_.get(), size_}; }
  std::span<const std::byte> span() const { return {data_.get(), size_}; }

 private:
  struct Free {
    void operator()(std::byte* p) const { std::free(p); }
  };
  std::unique_ptr<std::byte, Free> data_;
  size_t size_ = 0;
};

}  // namespace stitch

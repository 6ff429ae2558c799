// Fuzzes ParseSafetensorsHeader, which must be safe on arbitrary bytes, and
// checks what it accepts: the tensors tile the data section exactly, each
// range matches its shape and dtype, and writing the header back out with
// SafetensorsWriter yields a header that parses to the same tensors.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <span>
#include <string>

#include "stitch/format/safetensors.h"

namespace {

void Check(bool ok) {
  if (!ok) std::abort();
}

void CheckAccepted(const stitch::SafetensorsHeader& h, uint64_t file_size) {
  uint64_t cursor = 0;
  for (const stitch::TensorInfo& t : h.tensors) {
    Check(t.begin == cursor && t.end >= t.begin);
    Check(t.numel() >= 0);
    Check(static_cast<uint64_t>(t.numel()) * stitch::DTypeSize(t.dtype) == t.nbytes());
    cursor = t.end;
  }
  Check(h.data_start >= 8 && h.data_start + cursor == file_size);

  stitch::SafetensorsWriter w;
  for (const stitch::TensorInfo& t : h.tensors)
    Check(w.Add(t.name, t.dtype, t.shape, t.nbytes()).ok());
  for (const auto& [k, v] : h.metadata) w.SetMetadata(k, v);
  const std::string file = w.SerializeHeader() + std::string(w.data_size(), '\0');
  auto again = stitch::ParseSafetensorsHeader(std::as_bytes(std::span(file.data(), file.size())),
                                              file.size());
  Check(again.ok());
  Check(again->metadata == h.metadata && again->tensors.size() == h.tensors.size());
  for (size_t i = 0; i < h.tensors.size(); ++i) {
    const stitch::TensorInfo& a = h.tensors[i];
    const stitch::TensorInfo& b = again->tensors[i];
    Check(a.name == b.name && a.dtype == b.dtype && a.shape == b.shape && a.begin == b.begin &&
          a.end == b.end);
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const auto bytes = std::as_bytes(std::span(data, size));
  auto h = stitch::ParseSafetensorsHeader(bytes, size);
  if (h.ok()) CheckAccepted(*h, size);
  // The same bytes as the prefix of a larger file: trailing data the prefix
  // does not show must never be read.
  auto longer = stitch::ParseSafetensorsHeader(bytes, uint64_t{size} + 16);
  if (longer.ok()) Check(longer->data_start <= size);
  return 0;
}

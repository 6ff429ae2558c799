// The demo trainer's publishing: each step's weights become the next version
// of the run, as an XOR+zstd DELTA against the previous step, or as a FULL
// anchor every `anchor_every` versions, written under a work directory and
// published to the store (bytes durable before the pointer moves).
#pragma once

#include <cstdint>
#include <filesystem>
#include <span>
#include <string>

#include "absl/status/statusor.h"
#include "stitch/format/safetensors.h"
#include "stitch/store/store.h"

namespace stitch {

enum class PublishedKind { kFull, kDelta };

struct PublishRecord {
  int64_t version = 0;
  PublishedKind kind = PublishedKind::kDelta;
  uint64_t payload_bytes = 0;  // bytes of the version's payload files
  double seconds = 0;          // encode + publish
};

class StepPublisher {
 public:
  // Publishes into `store` (a claimed run; not owned, must outlive this),
  // writing version directories under `work_dir` (created when missing). REQUIRES: anchor_every >
  // 0.
  StepPublisher(Store& store, std::filesystem::path work_dir, int64_t anchor_every);

  // Publishes `target` as `version`: FULL when version % anchor_every == 0,
  // else a DELTA against `base` (the tensors of version - 1). Errors from
  // the encoder or PublishVersion (a rewind, a conflict, I/O) pass through.
  [[nodiscard]] absl::StatusOr<PublishRecord> Publish(int64_t version,
                                                      std::span<const TensorView> base,
                                                      std::span<const TensorView> target);

 private:
  Store& store_;
  std::filesystem::path work_dir_;
  int64_t anchor_every_;
};

}  // namespace stitch

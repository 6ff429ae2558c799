#include "stitch/demo/publisher.h"

#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "stitch/core/version.h"
#include "stitch/delta/delta_encode.h"
#include "stitch/publish/publish.h"

namespace stitch {

StepPublisher::StepPublisher(Store& store, std::filesystem::path work_dir, int64_t anchor_every)
    : store_(store), work_dir_(std::move(work_dir)), anchor_every_(anchor_every) {}

absl::StatusOr<PublishRecord> StepPublisher::Publish(int64_t version,
                                                     std::span<const TensorView> base,
                                                     std::span<const TensorView> target) {
  const auto start = std::chrono::steady_clock::now();
  const std::filesystem::path dir = work_dir_ / VersionDirName(version);
  std::error_code ec;
  std::filesystem::create_directories(work_dir_, ec);
  if (ec) {
    return absl::InternalError(
        absl::StrCat("demo: cannot create ", work_dir_.string(), ": ", ec.message()));
  }
  PublishRecord record;
  record.version = version;
  if (version % anchor_every_ == 0) {
    FullVersionOptions options;
    options.version = version;
    options.run_id = store_.run_id();
    auto full = WriteFullVersion(target, dir, options);
    if (!full.ok()) return full.status();
    record.kind = PublishedKind::kFull;
    record.payload_bytes = full->checkpoint_bytes;
  } else {
    EncodeOptions options;
    options.version = version;
    options.base_version = version - 1;
    options.run_id = store_.run_id();
    options.threads = 1;
    auto delta = EncodeDelta(base, target, dir, options);
    if (!delta.ok()) return delta.status();
    record.kind = PublishedKind::kDelta;
    record.payload_bytes = delta->payload_bytes;
  }
  auto published = PublishVersion(store_, dir, nullptr);
  if (!published.ok()) return published.status();
  record.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return record;
}

}  // namespace stitch

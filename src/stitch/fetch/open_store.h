// Opening a store by URI, for every party (replicas, publishers, the
// command line): the filesystem and in-memory stores as they are, a remote
// store (S3) behind the verified version cache and its peers
// (cached_store.h).
#pragma once

#include <filesystem>
#include <memory>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "stitch/fetch/peers.h"
#include "stitch/format/index.h"
#include "stitch/store/store.h"

namespace stitch {

// Opens a store for `run_id` from a URI: a plain path or file:///abs/path
// (filesystem store), mem://NAME (in-memory store shared within a process),
// s3://bucket/prefix[?endpoint=URL&region=R]. `cache_dir` is where remote
// (and in-memory) stores materialize versions. An empty `run_id` opens a
// read-only view: it reads the pointer, manifests and versions, creates
// nothing, and refuses PublishFiles and AdvancePointer.
struct StoreOptions {
  std::string run_id;
  std::filesystem::path cache_dir;
  // Where a remote store looks for version files first.
  StorePeers peers;
  // How large a version's index may be (the filesystem and S3 stores refuse
  // a larger one, DataLoss, before reading it). A replica narrows it to what
  // its base checkpoint can hold (IndexBoundsFor).
  IndexBounds index_bounds;
};
[[nodiscard]] absl::StatusOr<std::unique_ptr<Store>> OpenStore(std::string_view uri,
                                                               const StoreOptions& options);

}  // namespace stitch

// Where each missing file of a version comes from: its owner among the
// peers, other peers, or the remote store itself (peers.h). The fetcher
// holds the peer logic (owner choice, waits, fallbacks, counters); the
// version cache (cached_store.h) holds the files.
//
// One materialization asks every missing file's owner first, without
// waiting: a file it holds arrives; a file this replica owns is then taken
// from the store before any wait on another owner begins, so that replicas
// waiting on each other always have their own files under way. The rest
// are asked of their owner again, waiting up to StorePeers::owner_wait,
// then of up to StorePeers::extra_tries more peers without waiting, then
// of the store. A peer's bytes that are not the store's are dropped and
// counted (peer_rejected): a peer can delay a replica, never poison it.
//
// Thread-safety: Fetch may run from several threads at once (for
// different versions); the counters are atomic.
#pragma once

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "stitch/fetch/peer_client.h"
#include "stitch/fetch/peers.h"
#include "stitch/fetch/version_cache.h"
#include "stitch/store/remote_store.h"
#include "stitch/store/store.h"

namespace stitch {

class VersionFetcher {
 public:
  // `remote` and `source` must outlive the fetcher. `parallelism`: files in
  // flight at once (at least 1).
  VersionFetcher(RemoteStore& remote, StorePeers peers, PeerSource& source, int parallelism);

  // Brings `missing` (indexes into `files`) of `version` into `target`,
  // recording in `record` each file that arrived, even when another
  // failed. The first failure (the store's: a peer's only moves on to the
  // next source) is returned.
  [[nodiscard]] absl::Status Fetch(int64_t version, const std::filesystem::path& target,
                                   const std::vector<StoredFile>& files,
                                   const std::vector<size_t>& missing, CacheRecord& record);

  StoreTraffic traffic() const;

 private:
  // One file into `target`, from `peers` in the file's PeerOrder from its
  // `from`-th (its owner: 0; waited for `owner_wait_ms`), within
  // extra_tries; else from the store.
  [[nodiscard]] absl::StatusOr<CachedFile> FetchOne(int64_t version,
                                                    const std::filesystem::path& target,
                                                    const StoredFile& want,
                                                    const std::vector<std::string>& peers,
                                                    size_t from, int64_t owner_wait_ms);
  // One file from one peer; counts what arrived and what was rejected.
  [[nodiscard]] absl::StatusOr<CachedFile> FromPeer(const std::string& peer, int64_t version,
                                                    const std::filesystem::path& target,
                                                    const StoredFile& want, int64_t wait_ms);

  RemoteStore& remote_;
  const StorePeers peers_;
  PeerSource& source_;
  const int parallelism_;
  std::atomic<uint64_t> files_downloaded_{0};
  std::atomic<uint64_t> bytes_downloaded_{0};
  std::atomic<uint64_t> peer_files_{0};
  std::atomic<uint64_t> peer_bytes_{0};
  std::atomic<uint64_t> peer_rejected_{0};
};

}  // namespace stitch

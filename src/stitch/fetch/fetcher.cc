#include "stitch/fetch/fetcher.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "spdlog/spdlog.h"
#include "stitch/core/errors.h"
#include "stitch/core/version.h"
#include "stitch/io/parallel.h"

namespace stitch {
namespace fs = std::filesystem;

VersionFetcher::VersionFetcher(RemoteStore& remote, StorePeers peers, PeerSource& source,
                               int parallelism)
    : remote_(remote),
      peers_(std::move(peers)),
      source_(source),
      parallelism_(std::max(1, parallelism)) {}

absl::StatusOr<CachedFile> VersionFetcher::FromPeer(const std::string& peer, int64_t version,
                                                    const fs::path& target, const StoredFile& want,
                                                    int64_t wait_ms) {
  auto fetched = ReceiveIntoCache(
      target / want.name, want,
      absl::StrCat("peer ", peer, " (", VersionDirName(version), "/", want.name, ")"),
      [&](CacheFileSink& sink) { return source_.Fetch(peer, version, want, wait_ms, sink); });
  if (fetched.ok()) {
    peer_files_.fetch_add(1);
    peer_bytes_.fetch_add(want.size);
  } else if (absl::IsDataLoss(fetched.status())) {
    // A peer can delay a replica, never poison it: its bytes are dropped.
    peer_rejected_.fetch_add(1);
    spdlog::warn("{}: {}; taking the file from elsewhere", remote_.uri(),
                 std::string(fetched.status().message()));
  }
  return fetched;
}

absl::Status VersionFetcher::Fetch(int64_t version, const fs::path& target,
                                   const std::vector<StoredFile>& files,
                                   const std::vector<size_t>& missing, CacheRecord& record) {
  absl::Mutex record_mu;
  auto keep = [&](const StoredFile& want, CachedFile cached) {
    absl::MutexLock guard(&record_mu);
    record.files[want.name] = std::move(cached);
  };
  const std::vector<std::string> peers =
      peers_.discover && !missing.empty() ? peers_.discover() : std::vector<std::string>();
  if (peers.empty()) {
    return ParallelFor(missing.size(), parallelism_, [&](size_t m) -> absl::Status {
      const StoredFile& want = files[missing[m]];
      auto cached = FetchOne(version, target, want, peers, 0, 0);
      if (!cached.ok()) return cached.status();
      keep(want, *std::move(cached));
      return absl::OkStatus();
    });
  }
  // Every file's owner first, without waiting (the file comment).
  enum class Asked { kWait, kOwned, kArrived, kOwnerFailed };
  std::vector<Asked> asked_owner(missing.size(), Asked::kWait);
  absl::Status asked = ParallelFor(missing.size(), parallelism_, [&](size_t m) -> absl::Status {
    const StoredFile& want = files[missing[m]];
    const size_t owner = PeerOrder(peers, version, want.name).front();
    auto fetched = FromPeer(peers[owner], version, target, want, 0);
    if (fetched.ok()) {
      keep(want, *std::move(fetched));
      asked_owner[m] = Asked::kArrived;
    } else if (absl::IsFailedPrecondition(fetched.status())) {
      asked_owner[m] = Asked::kOwned;
    } else if (!absl::IsNotFound(fetched.status())) {
      asked_owner[m] = Asked::kOwnerFailed;  // it lied or did not answer
    }
    return absl::OkStatus();
  });
  if (!asked.ok()) return asked;
  std::vector<size_t> rest;
  for (Asked first : {Asked::kOwned, Asked::kOwnerFailed, Asked::kWait}) {
    for (size_t m = 0; m < missing.size(); ++m) {
      if (asked_owner[m] == first) rest.push_back(m);
    }
  }
  const int64_t wait_ms =
      std::chrono::duration_cast<std::chrono::milliseconds>(peers_.owner_wait).count();
  return ParallelFor(rest.size(), parallelism_, [&](size_t r) -> absl::Status {
    const size_t m = rest[r];
    const StoredFile& want = files[missing[m]];
    const size_t from = asked_owner[m] == Asked::kOwned         ? peers.size()
                        : asked_owner[m] == Asked::kOwnerFailed ? 1
                                                                : 0;
    auto cached = FetchOne(version, target, want, peers, from, wait_ms);
    if (!cached.ok()) return cached.status();
    keep(want, *std::move(cached));
    return absl::OkStatus();
  });
}

absl::StatusOr<CachedFile> VersionFetcher::FetchOne(int64_t version, const fs::path& target,
                                                    const StoredFile& want,
                                                    const std::vector<std::string>& peers,
                                                    size_t from, int64_t owner_wait_ms) {
  const std::vector<size_t> order =
      from >= peers.size() ? std::vector<size_t>() : PeerOrder(peers, version, want.name);
  const size_t tries =
      std::min(order.size(), 1 + static_cast<size_t>(std::max(0, peers_.extra_tries)));
  for (size_t k = from; k < tries; ++k) {
    auto fetched = FromPeer(peers[order[k]], version, target, want, k == 0 ? owner_wait_ms : 0);
    if (fetched.ok()) return fetched;
    if (k == 0 && absl::IsFailedPrecondition(fetched.status())) break;  // the owner is this replica
    if (!absl::IsNotFound(fetched.status()) && !absl::IsFailedPrecondition(fetched.status()) &&
        !absl::IsDataLoss(fetched.status())) {
      spdlog::info("{}: {}", remote_.uri(), std::string(fetched.status().message()));
    }
  }
  auto cached =
      ReceiveIntoCache(target / want.name, want,
                       absl::StrCat(remote_.uri(), " ", VersionDirName(version), "/", want.name),
                       [&](CacheFileSink& sink) { return remote_.ReadFile(version, want, sink); });
  if (!cached.ok()) return cached.status();
  files_downloaded_.fetch_add(1);
  bytes_downloaded_.fetch_add(want.size);
  return cached;
}

StoreTraffic VersionFetcher::traffic() const {
  StoreTraffic t;
  t.files_downloaded = files_downloaded_.load();
  t.bytes_downloaded = bytes_downloaded_.load();
  t.peer_files = peer_files_.load();
  t.peer_bytes = peer_bytes_.load();
  t.peer_rejected = peer_rejected_.load();
  return t;
}

}  // namespace stitch

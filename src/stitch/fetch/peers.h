// Peers before the store: other replicas a version cache may take a
// version's files from before asking the remote store itself, and which of
// them owns each file. A peer only carries bytes: every file is checked
// against the size and SHA-256 the store records for it, and a peer that
// is wrong, lacks the file or does not answer is passed over.
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <vector>

namespace stitch {

struct StorePeers {
  // The peers' base URLs ("http://host:port"), asked once per
  // materialization (a pool: docs/sidecar.md, "--peers"); unset: none.
  // Called from the cache's threads.
  std::function<std::vector<std::string>()> discover;
  std::string token;  // sent as "Authorization: Bearer <token>"; "": none
  // This replica's id among its peers, sent as kPeerIdHeader (api/routes.h):
  // set by the cache (Store::peer_id), not by callers.
  std::string self_id;
  // Each file has an owner among the peers (PeerOrder: every replica picks
  // the same one), which fetches it from the store itself; the others ask
  // the owner first and wait up to this long for it, so that a version
  // every replica wants at once leaves the store about once. Then up to
  // `extra_tries` more peers are asked without waiting, then the store.
  std::chrono::milliseconds owner_wait = std::chrono::seconds(10);
  int extra_tries = 2;
  std::chrono::milliseconds connect_timeout = std::chrono::seconds(2);
  // A peer that sends no byte of a file's body for this long is left.
  std::chrono::milliseconds stall_timeout = std::chrono::seconds(10);
  // Every transfer from a peer has a deadline (PeerTransferDeadline): the
  // file's size at `min_rate` bytes/s, plus `allowance`, the connect
  // timeout and any wait asked for. A peer that trickles (however steadily)
  // or does not answer is left at the deadline for the next peer or the
  // store, and an owner that did not answer at once is never waited on: no
  // peer delays a replica by more than one deadline per file.
  // REQUIRES: min_rate > 0.
  uint64_t min_rate = uint64_t{4} << 20;
  std::chrono::milliseconds allowance = std::chrono::seconds(2);
};

// The indexes of `peers` in the order every replica gives them for `file`
// of `version` (rendezvous hashing with core/stable_hash.h, which every
// build computes alike): the first is the file's owner.
std::vector<size_t> PeerOrder(const std::vector<std::string>& peers, int64_t version,
                              std::string_view file);

// How long one transfer of a `size`-byte file from a peer may take in all
// when the peer is asked to wait up to `wait_ms` for it: the connect
// timeout, the allowance, the wait, and the size at the floor rate.
// Saturates rather than overflows.
std::chrono::milliseconds PeerTransferDeadline(const StorePeers& peers, uint64_t size,
                                               int64_t wait_ms);

}  // namespace stitch

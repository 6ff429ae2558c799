// Asking a peer for one file of a version: the port the fetcher
// (fetcher.h) goes through, so that its owner choice and waits can be
// tested with fake peers, and the HTTP client that asks a real sidecar's
// kPeerFileRoute (api/routes.h) on net's client.
//
// Thread-safety: HttpPeerSource is safe to use from several threads at
// once; each call blocks (never call it on an event-loop thread).
#pragma once

#include <cstdint>
#include <string>

#include "absl/status/status.h"
#include "stitch/fetch/peers.h"
#include "stitch/io/byte_sink.h"
#include "stitch/store/remote_store.h"

namespace stitch {

class PeerSource {
 public:
  virtual ~PeerSource() = default;
  // Writes `want` of `version`, as the peer at `peer` (a base URL) holds
  // it, into `sink`, asking it to wait up to `wait_ms` for the file when it
  // does not hold it yet. Whatever it sends is checked by the caller against
  // the store's record; a peer's word counts for nothing. Errors, each
  // naming the peer:
  //   NotFound            the peer does not hold the file
  //   FailedPrecondition  the peer is this replica (it answered 409)
  //   DataLoss            (ErrorKind::kChecksumMismatch) it declared or sent
  //                       a body of another size than want.size
  //   Unavailable         it did not answer, stalled or missed its deadline
  [[nodiscard]] virtual absl::Status Fetch(const std::string& peer, int64_t version,
                                           const StoredFile& want, int64_t wait_ms,
                                           ByteSink& sink) = 0;
};

// Asks a sidecar over HTTP: GET <peer>kPeerFileRoute?version=N&name=FILE
// [&wait_ms=T], with the fleet's token and this replica's id
// (peers.self_id, sent as kPeerIdHeader). A response declaring a
// Content-Length other than want.size is refused before its body; one that
// sends more is cut where the sink stops it. Each transfer has the deadline
// PeerTransferDeadline gives, and a body that stalls for
// peers.stall_timeout is left.
class HttpPeerSource final : public PeerSource {
 public:
  explicit HttpPeerSource(StorePeers peers) : peers_(std::move(peers)) {}
  [[nodiscard]] absl::Status Fetch(const std::string& peer, int64_t version, const StoredFile& want,
                                   int64_t wait_ms, ByteSink& sink) override;

 private:
  const StorePeers peers_;
};

}  // namespace stitch

// Publishing one version whose payload files are spread over the hosts of a
// distributed trainer: each host uploads its own shards once, and rank 0
// moves the pointer last, only after the receipts prove the version whole.
//
// Every rank calls PublishFromHosts with its own local view of the version
// directory (the same weight_vNNNNNN name everywhere). It is a collective
// of up to three all-gathers; after each, every rank decides from the same
// gathered values whether to go on, so a failure anywhere never leaves a
// rank waiting.
//   1. begin:  rank 0 reads the pointer (the compare-and-swap's expected
//              value) and its own directory's index, which it must hold by
//              now, and refuses an unclaimed run or a version that does not
//              follow the pointer (publish.h CheckFollows: a rewind, a gap,
//              a DELTA on another base), before any byte moves; it tells
//              every rank the version's kind, and whether the pointer names
//              the version already (a retry of a publish that completed:
//              the steps below then only compare, as publish.h
//              PublishVersion does, and the pointer stays);
//   2. upload: each host leader checks each of its files on its own
//              (delta/delta_verify.h VerifyPayloadFile: structure and
//              bounds, a DELTA's frames, a FULL version's recorded
//              checksums; no links or special files), makes them durable in
//              the store and produces a receipt (file, size, SHA-256, the
//              tensors the file holds).
//              An S3 store: the leader uploads them straight to their final
//              keys (parallel, multipart, verified by HEAD) and writes its
//              receipt to `updates/weight_vN/.receipts/rank-NNNNNN.json`.
//              Any other store (a filesystem mounted on every host): the
//              version directory is shared; the leader fsyncs its files and
//              sends its receipt through the all-gather;
//   3. commit: rank 0 checks the index again, merges the receipts and
//              verifies them (VerifyReceipts: no conflicts, every weight_map
//              file covered, the store holding what the receipts say; for a
//              mounted store, as seen after Store::Refresh; and
//              CheckReceiptTensors: each file holds exactly the tensors the
//              weight_map maps to it),
//              publishes rank 0's other files (config, tokenizer) and the
//              index (S3) or the directory (Store::PublishFiles), then
//              advances the pointer with a compare-and-swap against the
//              value read in step 1, and wakes `pool`.
// Every rank returns the same outcome (publish.h PublishOutcome), or the
// first error (with its status code; a lost compare-and-swap is
// kPointerConflict; different bytes for a stored version AlreadyExists).
#pragma once

#include <filesystem>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "stitch/core/version.h"
#include "stitch/pool/pool.h"
#include "stitch/publish/publish.h"
#include "stitch/publish/trainer_comms.h"
#include "stitch/store/store.h"

namespace stitch {

struct MultiHostPublishOptions {
  // The payload files this host's leader uploads, relative to `dir`. When
  // empty: the weight_map files present in `dir` if it holds the index, else
  // every *.safetensors file under it (names starting with '.' skipped).
  // Pass them explicitly when `dir` is shared by all hosts.
  std::vector<std::string> files;
  // Woken (best effort) by rank 0 after the pointer moved; may be null.
  Pool* pool = nullptr;
};

// Publishes `dir` (named weight_vNNNNNN) as version `<store.run_id()>/<name>`
// with the protocol above. REQUIRES: every rank passes a store opened on the
// same URI for the same run.
[[nodiscard]] absl::StatusOr<PublishOutcome> PublishFromHosts(
    Store& store, TrainerComms& comms, const std::filesystem::path& dir,
    const MultiHostPublishOptions& options = {});

// The receipt name of the host led by `rank`: "rank-000003".
std::string HostReceiptName(int rank);

}  // namespace stitch

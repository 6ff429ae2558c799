#include "stitch/publish/anchor.h"

#include <algorithm>
#include <system_error>
#include <vector>

#include "absl/strings/str_cat.h"
#include "stitch/core/errors.h"
#include "stitch/core/version.h"
#include "stitch/delta/delta_apply.h"
#include "stitch/delta/delta_encode.h"
#include "stitch/io/fileio.h"
#include "stitch/store/materialize_chain.h"
#include "stitch/store/remote_store.h"
#include "stitch/store/version_dir.h"

namespace stitch {
namespace {

namespace fs = std::filesystem;

// The payload bytes of a published version: the store's records for a
// remote store, the files' sizes otherwise.
absl::StatusOr<uint64_t> PayloadBytes(Store& store, int64_t version,
                                      const VersionManifest& manifest) {
  uint64_t total = 0;
  if (RemoteStore* remote = store.remote()) {
    auto described = remote->DescribeVersion(version);
    if (!described.ok()) return described.status();
    for (const StoredFile& f : described->files) {
      if (std::find(manifest.files.begin(), manifest.files.end(), f.name) != manifest.files.end()) {
        total += f.size;
      }
    }
    return total;
  }
  auto dir = store.Materialize(version);
  if (!dir.ok()) return dir.status();
  return FilesBytes(*dir, manifest.files);
}

// A scratch directory removed when this goes out of scope.
struct Scratch {
  fs::path path;
  ~Scratch() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

}  // namespace

absl::StatusOr<uint64_t> FilesBytes(const fs::path& dir, const std::vector<std::string>& files) {
  uint64_t total = 0;
  for (const std::string& name : files) {
    std::error_code ec;
    const uintmax_t size = fs::file_size(dir / name, ec);
    if (ec) return ErrnoStatus(ec.value(), "size of", dir / name);
    total += size;
  }
  return total;
}

absl::StatusOr<ChainSinceAnchor> MeasureChain(Store& store, int64_t version) {
  ChainSinceAnchor chain;
  auto anchored = ListAnchors(store);
  if (!anchored.ok()) return anchored.status();
  for (int64_t v = version;;) {
    if (std::binary_search(anchored->begin(), anchored->end(), v)) {
      // An anchor written after the fact: the chain starts there.
      auto anchor = store.anchors()->ReadManifest(v);
      if (anchor.ok()) {
        auto bytes = PayloadBytes(*store.anchors(), v, *anchor);
        if (!bytes.ok()) return bytes.status();
        chain.anchor = v;
        chain.anchor_in_store = true;
        chain.anchor_bytes = *bytes;
        return chain;
      }
      if (!absl::IsNotFound(anchor.status())) return anchor.status();
    }
    auto manifest = store.ReadManifest(v);
    if (!manifest.ok()) {
      // The run's boot version lives outside the store.
      if (!absl::IsNotFound(manifest.status())) return manifest.status();
      chain.anchor = v;
      return chain;
    }
    auto bytes = PayloadBytes(store, v, *manifest);
    if (!bytes.ok()) return bytes.status();
    if (manifest->kind != VersionKind::kDelta || !manifest->base_version) {
      chain.anchor = v;
      chain.anchor_in_store = true;
      chain.anchor_bytes = *bytes;
      return chain;
    }
    ++chain.deltas;
    chain.delta_bytes += *bytes;
    v = *manifest->base_version;
  }
}

bool AnchorDue(const ChainSinceAnchor& chain, const AnchorBudget& budget,
               std::optional<uint64_t> full_bytes) {
  if (budget.max_deltas > 0 && chain.deltas >= budget.max_deltas) return true;
  if (!budget.by_bytes || chain.deltas == 0) return false;
  const uint64_t full = chain.anchor_in_store ? chain.anchor_bytes : full_bytes.value_or(0);
  return full > 0 && chain.delta_bytes >= full;
}

namespace {

// Folds `fold` into `<out_parent>/weight_vNNNNNN`, a FULL
// version of `contents`' weights with its other files (from `dir`), and
// checks the fingerprint against the DELTA's.
// Where a FULL version's weights come from: an anchor and the DELTAs after it.
struct Fold {
  fs::path anchor;
  std::vector<fs::path> deltas;
  ApplyOptions apply;
};

Fold StartFold(Store& store, int threads) {
  Fold fold;
  fold.apply.run_id = store.run_id();
  fold.apply.threads = threads;
  return fold;
}

absl::StatusOr<fs::path> FoldToFull(Store& store, const fs::path& dir,
                                    const VersionDirContents& contents, const Fold& fold,
                                    const fs::path& out_parent) {
  const int64_t version = contents.manifest.version;
  fs::create_directories(out_parent);
  Scratch scratch{out_parent / absl::StrCat(".anchor-work-", VersionDirName(version))};
  fs::remove_all(scratch.path);
  const fs::path materialized = scratch.path / "materialized";
  if (auto m = MaterializeCheckpoint(fold.anchor, fold.deltas, materialized, fold.apply); !m.ok()) {
    return m.status();
  }
  const fs::path out = out_parent / VersionDirName(version);
  fs::remove_all(out);
  FullVersionOptions full;
  full.version = version;
  full.run_id = store.run_id();
  if (auto w = WriteFullVersion(materialized, out, full); !w.ok()) return w.status();
  for (const std::string& name : contents.other_files) {
    fs::create_directories((out / name).parent_path());
    if (absl::Status s = CopyFileDurably(dir / name, out / name); !s.ok()) return s;
  }
  auto written = ReadVersionDir(out, version);
  if (!written.ok()) return written.status();
  const std::string& want = contents.manifest.weights_fingerprint;
  if (!want.empty() && written->manifest.weights_fingerprint != want) {
    return WithKind(
        absl::DataLossError(absl::StrCat(
            "the FULL anchor written for ", VersionDirName(version), " has weights fingerprint ",
            written->manifest.weights_fingerprint.empty() ? "(none)"
                                                          : written->manifest.weights_fingerprint,
            ", the DELTA records ", want, "; nothing was published")),
        ErrorKind::kChecksumMismatch);
  }
  return out;
}

absl::StatusOr<VersionDirContents> ReadDelta(const fs::path& dir, int64_t version) {
  auto contents = ReadVersionDir(dir, version);
  if (!contents.ok()) return contents.status();
  if (contents->manifest.kind != VersionKind::kDelta) {
    return absl::InvalidArgumentError(
        absl::StrCat(dir.string(), " is a FULL version already: it needs no anchor written"));
  }
  return contents;
}

}  // namespace

absl::StatusOr<fs::path> WriteAnchorFor(Store& store, const fs::path& delta_dir,
                                        const std::optional<fs::path>& base_checkpoint,
                                        const fs::path& out_parent, int threads) {
  const fs::path dir = delta_dir.lexically_normal().has_filename()
                           ? delta_dir.lexically_normal()
                           : delta_dir.lexically_normal().parent_path();
  auto version = ParseVersionDirName(dir.filename().string());
  if (!version.ok()) return version.status();
  auto contents = ReadDelta(dir, *version);
  if (!contents.ok()) return contents.status();
  // Where the weights come from: the base checkpoint and this DELTA, or the
  // store's chain and this DELTA.
  Fold fold = StartFold(store, threads);
  if (base_checkpoint) {
    fold.anchor = *base_checkpoint;
    fold.apply.anchor_version = *version - 1;
  } else {
    auto chain = MaterializeChain(store, *version - 1, std::nullopt);
    if (!chain.ok() || chain->empty() || chain->front().manifest.kind != VersionKind::kFull) {
      return absl::FailedPreconditionError(absl::StrCat(
          "cannot write ", VersionDirName(*version),
          " as a FULL anchor: the store holds no "
          "chain from a FULL version to ",
          VersionDirName(*version - 1),
          chain.ok() ? "" : absl::StrCat(" (", chain.status().message(), ")"),
          "; give the complete checkpoint of ", VersionDirName(*version - 1), " (--base)"));
    }
    fold.anchor = chain->front().dir;
    for (size_t i = 1; i < chain->size(); ++i) fold.deltas.push_back((*chain)[i].dir);
  }
  fold.deltas.push_back(dir);
  return FoldToFull(store, dir, *contents, fold, out_parent);
}

absl::StatusOr<fs::path> WriteAnchorOf(Store& store, int64_t version,
                                       const std::optional<BootCheckpoint>& boot,
                                       const fs::path& out_parent, int threads) {
  auto chain =
      MaterializeChain(store, version, boot ? std::optional<int64_t>(boot->version) : std::nullopt);
  if (!chain.ok()) {
    if (absl::IsNotFound(chain.status()) && !boot) {
      return absl::FailedPreconditionError(
          absl::StrCat("cannot compact ", VersionDirName(version), ": ", chain.status().message(),
                       "; when its chain starts at the run's boot checkpoint, give that (--base, "
                       "--boot-version)"));
    }
    return Annotate(chain.status(), absl::StrCat("compacting ", VersionDirName(version)));
  }
  if (chain->empty() || chain->back().version != version) {
    return absl::InvalidArgumentError(absl::StrCat(
        VersionDirName(version), " is the boot version: it is its own anchor, outside the store"));
  }
  if (chain->size() == 1 && chain->front().manifest.kind == VersionKind::kFull) {
    return absl::AlreadyExistsError(absl::StrCat(
        VersionDirName(version),
        chain->front().anchor ? " has an anchor already" : " is a FULL version already"));
  }
  auto contents = ReadDelta(chain->back().dir, version);
  if (!contents.ok()) return contents.status();
  Fold fold = StartFold(store, threads);
  size_t first = 0;
  if (chain->front().manifest.kind == VersionKind::kFull) {
    fold.anchor = chain->front().dir;
    first = 1;
  } else if (boot) {
    fold.anchor = boot->dir;
    fold.apply.anchor_version = boot->version;
  } else {
    return absl::FailedPreconditionError(absl::StrCat(
        "cannot compact ", VersionDirName(version), ": its chain reaches ",
        VersionDirName(chain->front().version - 1),
        ", which the store does not hold (the run's boot checkpoint); give it (--base, "
        "--boot-version)"));
  }
  for (size_t i = first; i < chain->size(); ++i) fold.deltas.push_back((*chain)[i].dir);
  return FoldToFull(store, chain->back().dir, *contents, fold, out_parent);
}

}  // namespace stitch

#include "stitch/publish/multihost.h"

#include <algorithm>
#include <boost/json.hpp>
#include <optional>
#include <set>
#include <system_error>
#include <utility>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "stitch/core/errors.h"
#include "stitch/core/pointer.h"
#include "stitch/delta/delta_verify.h"
#include "stitch/format/checksum.h"
#include "stitch/format/index.h"
#include "stitch/io/fileio.h"
#include "stitch/io/sha256.h"
#include "stitch/publish/publish.h"
#include "stitch/publish/receipts.h"
#include "stitch/publish/wake.h"
#include "stitch/store/s3/s3_store.h"
#include "stitch/store/version_dir.h"

namespace stitch {
namespace fs = std::filesystem;
namespace json = boost::json;
namespace {

// One rank's contribution to a step: how the step went for it, plus data
// (a receipt, or where to find it).
struct StepMessage {
  absl::Status status;
  std::string payload;
};

std::string EncodeStep(const absl::Status& status, std::string_view payload) {
  json::object o;
  o["code"] = static_cast<int>(status.code());
  o["message"] = std::string(status.message());
  o["kind"] = static_cast<int>(GetErrorKind(status));
  if (auto conflict = GetConflictDetails(status)) {
    o["conflict"] = json::array{conflict->expected, conflict->actual, conflict->proposed};
  }
  o["payload"] = std::string(payload);
  return json::serialize(o);
}

absl::StatusOr<StepMessage> DecodeStep(std::string_view where, std::string_view text) {
  json::error_code ec;
  json::value v = json::parse(json::string_view(text.data(), text.size()), ec);
  const json::object* o = ec ? nullptr : v.if_object();
  const json::value* code = o ? o->if_contains("code") : nullptr;
  const json::value* message = o ? o->if_contains("message") : nullptr;
  const json::value* kind = o ? o->if_contains("kind") : nullptr;
  const json::value* payload = o ? o->if_contains("payload") : nullptr;
  if (code == nullptr || !code->is_int64() || message == nullptr || !message->is_string() ||
      kind == nullptr || !kind->is_int64() || payload == nullptr || !payload->is_string()) {
    return absl::InternalError(
        absl::StrCat(AbslView(where),
                     ": a rank sent a malformed all-gather value; are all ranks running the "
                     "same stitch?"));
  }
  StepMessage out;
  out.payload = std::string(payload->as_string());
  auto status_code = static_cast<absl::StatusCode>(code->as_int64());
  if (status_code == absl::StatusCode::kOk) return out;
  const json::value* conflict = o->if_contains("conflict");
  if (conflict != nullptr && conflict->is_array() && conflict->as_array().size() == 3) {
    const json::array& a = conflict->as_array();
    if (a[0].is_string() && a[1].is_string() && a[2].is_string()) {
      out.status = ConflictError(
          where, ConflictDetails{std::string(a[0].as_string()), std::string(a[1].as_string()),
                                 std::string(a[2].as_string())});
      return out;
    }
  }
  out.status = absl::Status(status_code, std::string(message->as_string()));
  int64_t k = kind->as_int64();
  if (k > static_cast<int64_t>(ErrorKind::kOther) &&
      k <= static_cast<int64_t>(ErrorKind::kVersionNotReady)) {
    out.status = WithKind(std::move(out.status), static_cast<ErrorKind>(k));
  }
  return out;
}

// All-gathers this rank's step outcome; returns every rank's, in rank order.
absl::StatusOr<std::vector<StepMessage>> Exchange(TrainerComms& comms, std::string_view where,
                                                  const absl::Status& status,
                                                  std::string_view payload) {
  auto values = comms.AllGather(EncodeStep(status, payload));
  if (!values.ok()) return Annotate(values.status(), where);
  if (static_cast<int>(values->size()) != comms.world_size()) {
    return absl::InternalError(absl::StrCat(AbslView(where), ": all-gather returned ",
                                            values->size(), " values for ", comms.world_size(),
                                            " ranks"));
  }
  std::vector<StepMessage> out;
  for (const std::string& v : *values) {
    auto m = DecodeStep(where, v);
    if (!m.ok()) return m.status();
    out.push_back(*std::move(m));
  }
  return out;
}

// The first failure among the ranks (this rank's own status when it is the
// one), else OK.
absl::Status FirstFailure(const std::vector<StepMessage>& messages, int self,
                          const absl::Status& own) {
  for (size_t r = 0; r < messages.size(); ++r) {
    if (messages[r].status.ok()) continue;
    if (static_cast<int>(r) == self) return own;
    if (r == 0) return messages[r].status;
    return Annotate(messages[r].status, absl::StrCat("rank ", r));
  }
  return absl::OkStatus();
}

// The payload files a host leader uploads when it was not told.
absl::StatusOr<std::vector<std::string>> DiscoverHostFiles(const fs::path& dir) {
  std::error_code ec;
  std::set<std::string> out;
  fs::path index_path = dir / kIndexFileName;
  if (fs::is_regular_file(index_path, ec)) {
    auto text = ReadFileToString(index_path);
    if (!text.ok()) return text.status();
    auto index = CheckpointIndex::Parse(*text);
    if (!index.ok()) return Annotate(index.status(), index_path.string());
    for (const auto& [tensor, file] : index->weight_map) {
      if (fs::is_regular_file(dir / file, ec)) out.insert(file);
    }
    return std::vector<std::string>(out.begin(), out.end());
  }
  if (!fs::is_directory(dir, ec)) {
    return absl::NotFoundError(
        absl::StrCat("version directory ", dir.string(), " does not exist or is not a directory"));
  }
  for (fs::recursive_directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    std::string rel = it->path().lexically_relative(dir).generic_string();
    bool hidden = it->path().filename().string().starts_with(".");
    if (hidden) {
      if (it->is_directory(ec)) it.disable_recursion_pending();
      continue;
    }
    if (it->is_regular_file(ec) && it->path().extension() == ".safetensors") out.insert(rel);
  }
  if (ec) return absl::InternalError(absl::StrCat("list ", dir.string(), ": ", ec.message()));
  return std::vector<std::string>(out.begin(), out.end());
}

// What rank 0 tells every rank at the first step: how to check payload
// files, from the index only rank 0 may hold, and whether the pointer
// already names the version (a retry of a publish that completed).
struct BeginMessage {
  PayloadFileKind kind;
  bool already_published = false;
};

std::string EncodeBegin(const BeginMessage& begin) {
  return json::serialize(json::object{{"delta", begin.kind.kind == VersionKind::kDelta},
                                      {"version", begin.kind.version},
                                      {"checksums", begin.kind.records_checksums},
                                      {"already_published", begin.already_published}});
}

absl::StatusOr<BeginMessage> DecodeBegin(std::string_view where, std::string_view text) {
  json::error_code ec;
  json::value v = json::parse(json::string_view(text.data(), text.size()), ec);
  const json::object* o = ec ? nullptr : v.if_object();
  const json::value* delta = o ? o->if_contains("delta") : nullptr;
  const json::value* version = o ? o->if_contains("version") : nullptr;
  const json::value* checksums = o ? o->if_contains("checksums") : nullptr;
  const json::value* already = o ? o->if_contains("already_published") : nullptr;
  if (delta == nullptr || !delta->is_bool() || version == nullptr || !version->is_int64() ||
      checksums == nullptr || !checksums->is_bool() || already == nullptr || !already->is_bool()) {
    return absl::InternalError(
        absl::StrCat(AbslView(where),
                     ": rank 0 sent a malformed version kind; are all ranks running the same "
                     "stitch?"));
  }
  return BeginMessage{PayloadFileKind{delta->as_bool() ? VersionKind::kDelta : VersionKind::kFull,
                                      version->as_int64(), checksums->as_bool()},
                      already->as_bool()};
}

// Checks one of a host's payload files on its own (its structure, a DELTA's
// frames, a FULL version's checksums) and returns the tensors it holds,
// sorted, for rank 0 to hold against the index.
absl::StatusOr<std::vector<std::string>> CheckHostFile(const fs::path& dir, const std::string& name,
                                                       const PayloadFileKind& kind) {
  if (absl::Status s = ValidatePayloadFileName(name); !s.ok()) return s;
  if (absl::Status s = CheckPlainFile(dir, name); !s.ok()) return s;
  auto tensors = VerifyPayloadFile(dir, name, kind, VerifyOptions{});
  if (!tensors.ok()) return Annotate(tensors.status(), "publish");
  std::sort(tensors->begin(), tensors->end());
  return tensors;
}

// A mounted store: the leader's files are already in the shared directory;
// committing them means checking them, making them durable and saying what
// they hold.
absl::StatusOr<std::vector<FileReceipt>> CommitSharedFiles(const fs::path& dir,
                                                           const std::vector<std::string>& files,
                                                           const PayloadFileKind& kind) {
  std::vector<FileReceipt> out;
  std::set<fs::path> dirs{dir};
  for (const std::string& name : files) {
    auto tensors = CheckHostFile(dir, name, kind);
    if (!tensors.ok()) return tensors.status();
    fs::path path = dir / name;
    auto digest = HashFile(path);
    if (!digest.ok()) return digest.status();
    if (absl::Status s = FsyncPath(path); !s.ok()) return s;
    for (fs::path p = path.parent_path(); p != dir && p.has_relative_path(); p = p.parent_path()) {
      dirs.insert(p);
    }
    out.push_back(FileReceipt{name, digest->size, digest->sha256, *std::move(tensors)});
  }
  for (const fs::path& d : dirs) {
    if (absl::Status s = FsyncPath(d); !s.ok()) return s;
  }
  return out;
}

// Rank 0's index, as the store must keep it: nullopt when `dir` has none.
struct LoadedIndex {
  VersionManifest manifest;
  std::string json;
};
absl::StatusOr<std::optional<LoadedIndex>> LoadIndex(const fs::path& dir, int64_t version) {
  fs::path path = dir / kIndexFileName;
  std::error_code ec;
  if (!fs::exists(path, ec)) return std::optional<LoadedIndex>();
  auto text = ReadFileToString(path);
  if (!text.ok()) return text.status();
  auto index = CheckpointIndex::Parse(*text);
  if (!index.ok()) return Annotate(index.status(), path.string());
  auto recorded = index->version();
  if (!recorded.ok()) return Annotate(recorded.status(), path.string());
  LoadedIndex out;
  if (recorded->has_value()) {
    if (**recorded != version) {
      return absl::InvalidArgumentError(absl::StrCat(path.string(), " records metadata.version ",
                                                     **recorded,
                                                     " but is being published as version ", version,
                                                     "; rename the directory or fix the index"));
    }
    out.json = *std::move(text);
  } else {
    index->metadata["version"] = VersionMetadataString(version);
    out.json = index->ToJson();
  }
  auto manifest = index->ToManifest();
  if (!manifest.ok()) return Annotate(manifest.status(), path.string());
  out.manifest = *std::move(manifest);
  return std::optional<LoadedIndex>(std::move(out));
}

// The index rank 0 holds, required: the version's kind and its place after
// the pointer (unless the pointer names it already) are checked from it
// before any byte moves, and again before the pointer does.
absl::StatusOr<LoadedIndex> RequireIndex(const fs::path& dir, const VersionRef& ref,
                                         const VersionRef& pointer, std::string_view where) {
  auto index = LoadIndex(dir, ref.version);
  if (!index.ok()) return Annotate(index.status(), where);
  if (!index->has_value()) {
    return absl::FailedPreconditionError(
        absl::StrCat(AbslView(where), ": version ", ref.DirName(), ": the index (",
                     AbslView(kIndexFileName), ") is missing from rank 0's ", dir.string(),
                     "; the rank that publishes must hold it when the publish begins"));
  }
  if (pointer != ref) {
    if (absl::Status s = CheckFollows(where, pointer, (**index).manifest); !s.ok()) return s;
  }
  return **std::move(index);
}

// The pointer a publish of `ref` expects: `ref` itself for a retry of a
// publish that completed, else the version before it (CheckFollows).
VersionRef PointerBefore(const VersionRef& ref, bool already_published) {
  return already_published ? ref : VersionRef{ref.run_id, ref.version - 1};
}

// Rank 0's last step. Returns whether the version was published already
// (the pointer named it, or another publisher of these bytes moved it there
// first).
absl::StatusOr<bool> Commit(Store& store, S3Store* s3, const fs::path& dir, const VersionRef& ref,
                            const std::optional<VersionRef>& expected,
                            const std::vector<StepMessage>& uploads, std::string_view where) {
  std::vector<UploadReceipt> receipts;
  for (const StepMessage& m : uploads) {
    if (m.payload.empty()) continue;  // not a host leader
    std::string text = m.payload;
    if (s3 != nullptr) {
      auto stored = s3->GetReceipt(ref.version, m.payload);
      if (!stored.ok()) return stored.status();
      text = *std::move(stored);
    }
    auto receipt = ReceiptFromJson(text);
    if (!receipt.ok()) return Annotate(receipt.status(), where);
    receipts.push_back(*std::move(receipt));
  }
  if (s3 == nullptr) {
    // Make the other hosts' writes visible before looking at them.
    if (absl::Status s = store.Refresh(); !s.ok()) return s;
  }
  auto index = RequireIndex(dir, ref, *expected, where);
  if (!index.ok()) return index.status();
  std::optional<VersionManifest> manifest = index->manifest;
  auto parsed = CheckpointIndex::Parse(index->json);
  if (!parsed.ok()) return Annotate(parsed.status(), where);

  StatFilesFn stat;
  if (s3 != nullptr) {
    stat = [&](const std::vector<std::string>& files) -> absl::StatusOr<std::vector<FileReceipt>> {
      auto stored = s3->StatVersionFiles(ref.version, files);
      if (!stored.ok()) return stored.status();
      std::vector<FileReceipt> out;
      for (const StoredFile& f : *stored) out.push_back(FileReceipt{f.name, f.size, f.sha256});
      return out;
    };
  } else {
    stat = [&](const std::vector<std::string>& files) -> absl::StatusOr<std::vector<FileReceipt>> {
      std::vector<FileReceipt> out;
      for (const std::string& file : files) {
        auto digest = HashFile(dir / file);
        if (!digest.ok()) {
          return Annotate(digest.status(),
                          absl::StrCat(AbslView(where), ": rank 0 cannot see a receipted file"));
        }
        out.push_back(FileReceipt{file, digest->size, digest->sha256});
      }
      return out;
    };
  }
  auto verified = VerifyReceipts(where, ref.version, manifest, receipts, stat);
  if (!verified.ok()) return verified.status();
  if (absl::Status s = CheckReceiptTensors(where, ref.version, parsed->weight_map, *verified);
      !s.ok()) {
    return s;
  }

  absl::Status published;
  if (s3 != nullptr) {
    // Rank 0's other files (config, tokenizer) go up with the index.
    auto others = ListOtherFiles(dir, index->manifest);
    if (!others.ok()) return Annotate(others.status(), where);
    if (!others->empty()) published = s3->UploadVersionFiles(ref.version, dir, *others).status();
    if (published.ok()) published = s3->PublishIndex(ref.version, index->json);
  } else {
    published = store.PublishFiles(ref.version, dir);
  }
  if (!published.ok()) return ExplainImmutable(published, *expected, ref);
  if (*expected == ref) return true;  // already published: nothing moves
  absl::Status moved = store.AdvancePointer(expected, ref);
  if (!moved.ok() && !LostToTheSameVersion(moved, ref)) return moved;
  return !moved.ok();
}

// The kind of the version's payload files, from rank 0's index.
absl::StatusOr<PayloadFileKind> PayloadKindOf(const LoadedIndex& index, const VersionRef& ref,
                                              const fs::path& version_dir,
                                              const std::string& where) {
  auto parsed = CheckpointIndex::Parse(index.json);
  if (!parsed.ok()) return Annotate(parsed.status(), where);
  PayloadFileKind kind{index.manifest.kind, ref.version, false};
  if (auto it = parsed->metadata.find("checksum_format"); it != parsed->metadata.end()) {
    if (it->second != kChecksumFormat) {
      return absl::InvalidArgumentError(absl::StrCat(
          where, ": ", (version_dir / kIndexFileName).string(), ": unsupported checksum_format \"",
          it->second, "\": Stitch reads only \"", AbslView(kChecksumFormat), "\""));
    }
    kind.records_checksums = kind.kind == VersionKind::kFull;
  }
  return kind;
}

// Rank 0's part of the begin step: the pointer it expects to move, and what
// it tells the other ranks.
struct RankZeroBegin {
  VersionRef expected;
  std::string message;  // EncodeBegin
};

// Checks, before any upload, that the version can be published after the
// pointer (or is a retry of one that was).
absl::StatusOr<RankZeroBegin> BeginOnRankZero(Store& store, const fs::path& version_dir,
                                              const VersionRef& ref, const std::string& where) {
  if (absl::Status s = store.Refresh(); !s.ok()) return s;
  auto pointer = store.ReadPointer();
  if (!pointer.ok()) return pointer.status();
  if (!*pointer || (*pointer)->run_id != ref.run_id) {
    return NotClaimedError(where, ref.run_id, *pointer);
  }
  const bool already = **pointer == ref;
  if (already) {
    if (absl::Status s = CheckRepublish(where, store, ref); !s.ok()) return s;
  } else if (auto move = CheckPointerMove(where, *pointer, ref); !move.ok()) {
    return move.status();
  }
  auto index = RequireIndex(version_dir, ref, **pointer, where);
  if (!index.ok()) return index.status();
  if (!already) {
    if (absl::Status s = CheckDeltaBase(where, store, **pointer, index->manifest); !s.ok()) {
      return s;
    }
  }
  auto kind = PayloadKindOf(*index, ref, version_dir, where);
  if (!kind.ok()) return kind.status();
  return RankZeroBegin{**pointer, EncodeBegin(BeginMessage{*kind, already})};
}

// A host leader's part of the upload step: its files made durable in the
// store with a receipt. Returns what it tells rank 0: on S3, the name of
// the receipt it stored; on a shared filesystem, the receipt itself.
absl::StatusOr<std::string> UploadHostFiles(S3Store* s3, const fs::path& version_dir,
                                            const VersionRef& ref, const BeginMessage& began,
                                            int rank, std::vector<std::string> files,
                                            const std::string& where) {
  if (files.empty()) {
    auto found = DiscoverHostFiles(version_dir);
    if (!found.ok()) return Annotate(found.status(), where);
    files = *std::move(found);
  }
  UploadReceipt receipt{ref.version, HostReceiptName(rank), {}};
  if (s3 == nullptr) {
    auto committed = CommitSharedFiles(version_dir, files, began.kind);
    if (!committed.ok()) return Annotate(committed.status(), where);
    receipt.files = *std::move(committed);
    return ReceiptToJson(receipt);
  }
  std::vector<std::vector<std::string>> tensors;
  for (const std::string& name : files) {
    auto checked = CheckHostFile(version_dir, name, began.kind);
    if (!checked.ok()) return checked.status();
    tensors.push_back(*std::move(checked));
  }
  auto stored = s3->UploadVersionFiles(ref.version, version_dir, files);
  if (!stored.ok()) {
    return ExplainImmutable(stored.status(), PointerBefore(ref, began.already_published), ref);
  }
  for (size_t i = 0; i < stored->size(); ++i) {
    const StoredFile& f = (*stored)[i];
    receipt.files.push_back(FileReceipt{f.name, f.size, f.sha256, std::move(tensors[i])});
  }
  if (absl::Status s = s3->PutReceipt(ref.version, receipt.host, ReceiptToJson(receipt)); !s.ok()) {
    return s;
  }
  return receipt.host;
}

}  // namespace

std::string HostReceiptName(int rank) { return absl::StrFormat("rank-%06d", rank); }

absl::StatusOr<PublishOutcome> PublishFromHosts(Store& store, TrainerComms& comms,
                                                const fs::path& dir,
                                                const MultiHostPublishOptions& options) {
  const std::string where = absl::StrCat("store ", store.uri());
  const int rank = comms.rank();
  auto* s3 = dynamic_cast<S3Store*>(store.remote());
  const fs::path version_dir = VersionDirOf(dir);
  // Every rank checks the identity on its own.
  const absl::StatusOr<VersionRef> local = NamedVersion(store, dir, where);
  const VersionRef ref = local.ok() ? *local : VersionRef{};

  // 1. begin: the expected pointer, and no upload for a doomed version.
  std::optional<VersionRef> expected;
  absl::Status begin = local.status();
  std::string kind_payload;
  if (begin.ok() && rank == 0) {
    auto begun = BeginOnRankZero(store, version_dir, ref, where);
    begin = begun.status();
    if (begun.ok()) {
      expected = begun->expected;
      kind_payload = std::move(begun->message);
    }
  }
  auto step = Exchange(comms, where, begin, kind_payload);
  if (!step.ok()) return step.status();
  if (absl::Status s = FirstFailure(*step, rank, begin); !s.ok()) return s;
  auto began = DecodeBegin(where, (*step)[0].payload);
  if (!began.ok()) return began.status();

  // 2. upload: each host leader's files, durable, with a receipt.
  absl::Status upload;
  std::string payload;
  if (comms.IsHostLeader()) {
    auto uploaded = UploadHostFiles(s3, version_dir, ref, *began, rank, options.files, where);
    upload = uploaded.status();
    if (uploaded.ok()) payload = *std::move(uploaded);
  }
  step = Exchange(comms, where, upload, payload);
  if (!step.ok()) return step.status();
  if (absl::Status s = FirstFailure(*step, rank, upload); !s.ok()) return s;

  // 3. commit: rank 0 verifies, publishes and moves the pointer last.
  absl::Status outcome;
  std::string already;
  if (rank == 0) {
    auto committed = Commit(store, s3, version_dir, ref, expected, *step, where);
    outcome = committed.status();
    if (committed.ok()) {
      WakeAfterMove(options.pool, ref);
      if (*committed) already = "already_published";
    }
  }
  auto last = Exchange(comms, where, outcome, already);
  if (!last.ok()) return last.status();
  if (absl::Status s = FirstFailure(*last, rank, outcome); !s.ok()) return s;
  return PublishOutcome{ref, !(*last)[0].payload.empty()};
}

}  // namespace stitch

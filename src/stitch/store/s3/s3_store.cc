#include "stitch/store/s3_store.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <functional>
#include <random>
#include <set>
#include <system_error>
#include <thread>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/synchronization/mutex.h"
#include "spdlog/spdlog.h"
#include "stitch/core/errors.h"
#include "stitch/core/pointer.h"
#include "stitch/core/stable_hash.h"
#include "stitch/format/index.h"
#include "stitch/io/fileio.h"
#include "stitch/store/pointer_cas.h"
#include "stitch/store/s3_sha256.h"
#include "stitch/store/s3_version_cache.h"
#include "stitch/store/s3_xml.h"
#include "stitch/store/version_dir.h"

namespace stitch {
namespace fs = std::filesystem;
namespace {

constexpr std::string_view kPointerKey = "latest";
constexpr uint64_t kMinPartSize = uint64_t{5} << 20;

std::string Quoted(std::string_view name) {
  return absl::StrCat("\"", absl::CEscape(AbslView(name)), "\"");
}

bool ValidHostName(std::string_view host) {
  if (host.empty() || host.size() > 64 || host.front() == '.') return false;
  return std::all_of(host.begin(), host.end(), [](char c) {
    return absl::ascii_isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-';
  });
}

}  // namespace

S3Store::S3Store(S3Location location, std::string run_id, fs::path cache_dir,
                 std::unique_ptr<S3Client> client, S3StoreOptions options, StorePeers peers,
                 IndexBounds index_bounds)
    : location_(std::move(location)),
      run_id_(std::move(run_id)),
      cache_dir_(std::move(cache_dir)),
      client_(std::move(client)),
      options_(std::move(options)),
      where_(absl::StrCat("store ", location_.Display())),
      index_bounds_(std::move(index_bounds)),
      peers_(std::move(peers)) {}

namespace {

std::string RandomHex() {
  std::random_device entropy;
  return absl::StrFormat("%08x%08x%08x%08x", entropy(), entropy(), entropy(), entropy());
}

// The peer id of the version cache at `cache_dir`: read from
// .stitch-peer-id, which the first opener creates (written aside, then
// linked into place, so that every opener reads one id); a random id of
// this process when there is no cache or it cannot be written.
std::string CachePeerId(const fs::path& cache_dir) {
  if (cache_dir.empty()) return RandomHex();
  const fs::path path = cache_dir / ".stitch-peer-id";
  if (auto id = ReadFileToString(path); id.ok() && !id->empty()) return *id;
  std::error_code ec;
  fs::create_directories(cache_dir, ec);
  const fs::path temp = TempSiblingPath(path);
  if (WriteFileAtomically(temp, RandomHex()).ok()) {
    (void)::link(temp.c_str(), path.c_str());  // EEXIST: another opener was first
    fs::remove(temp, ec);
  }
  auto id = ReadFileToString(path);
  return id.ok() && !id->empty() ? *id : RandomHex();
}

}  // namespace

absl::StatusOr<std::unique_ptr<S3Store>> S3Store::Open(std::string_view uri,
                                                       const StoreOptions& options,
                                                       const S3Environment& env,
                                                       S3StoreOptions s3) {
  if (!options.run_id.empty()) {
    if (absl::Status s = ValidateRunId(options.run_id); !s.ok()) return s;
  }
  if (s3.part_size < kMinPartSize) {
    return absl::InvalidArgumentError("S3 store: part_size must be at least 5 MiB");
  }
  if (s3.parallelism < 1 || s3.list_page_size < 1 || s3.list_page_size > 1000) {
    return absl::InvalidArgumentError(
        "S3 store: parallelism must be positive and list_page_size in 1..1000");
  }
  auto location = ParseS3Uri(uri, env);
  if (!location.ok()) return location.status();
  fs::path cache_dir;
  if (!options.cache_dir.empty()) {
    std::error_code ec;
    cache_dir = fs::absolute(options.cache_dir, ec).lexically_normal();
    if (ec) {
      return absl::InvalidArgumentError(absl::StrCat("cache directory ", options.cache_dir.string(),
                                                     ": cannot make it absolute: ", ec.message()));
    }
  }
  auto client = S3Client::Create(*location, env, s3.client);
  if (!client.ok()) return client.status();
  StorePeers peers = options.peers;
  peers.self_id = CachePeerId(cache_dir);
  return std::unique_ptr<S3Store>(
      new S3Store(*std::move(location), options.run_id, std::move(cache_dir), *std::move(client),
                  std::move(s3), std::move(peers), options.index_bounds));
}

std::string S3Store::VersionKey(int64_t version, std::string_view name) const {
  return location_.Key(absl::StrCat("updates/", VersionDirName(version), "/", AbslView(name)));
}

absl::Status S3Store::RequireRunId(std::string_view action) const {
  if (!run_id_.empty()) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(where_, ": opened without a run id, so it cannot ",
                                                 AbslView(action), "; open it with one"));
}

absl::Status S3Store::ParallelFor(size_t n, const std::function<absl::Status(size_t)>& fn) {
  size_t workers = std::min<size_t>(n, static_cast<size_t>(options_.parallelism));
  if (workers <= 1) {
    for (size_t i = 0; i < n; ++i) {
      if (absl::Status s = fn(i); !s.ok()) return s;
    }
    return absl::OkStatus();
  }
  std::atomic<size_t> next{0};
  std::atomic<bool> failed{false};
  absl::Mutex mu;
  absl::Status first;
  auto work = [&] {
    while (!failed.load()) {
      size_t i = next.fetch_add(1);
      if (i >= n) return;
      absl::Status s = fn(i);
      if (!s.ok()) {
        absl::MutexLock lock(&mu);
        if (first.ok()) first = std::move(s);
        failed.store(true);
      }
    }
  };
  std::vector<std::thread> threads;
  threads.reserve(workers);
  for (size_t w = 0; w < workers; ++w) threads.emplace_back(work);
  for (std::thread& t : threads) t.join();
  return first;
}

absl::Status S3Store::Refresh() { return absl::OkStatus(); }

absl::StatusOr<std::optional<S3ObjectInfo>> S3Store::Head(const std::string& key) {
  S3Request r;
  r.method = "HEAD";
  r.key = key;
  r.headers = {{"x-amz-checksum-mode", "ENABLED"}};
  auto response = client_->Send(r);
  if (!response.ok()) return response.status();
  if (response->status == 404) return std::nullopt;
  if (!response->ok()) return client_->ErrorFor(*response, "inspect", key);
  auto info = S3ObjectInfo::FromResponse(*response);
  if (!info.ok()) return Annotate(info.status(), location_.DisplayKey(key));
  return std::optional<S3ObjectInfo>(*std::move(info));
}

// ---- Pointer ----

absl::StatusOr<S3Store::PointerRead> S3Store::ReadPointerWithEtag() {
  const std::string key = location_.Key(kPointerKey);
  S3Request r;
  r.key = key;
  auto response = client_->Send(r);
  if (!response.ok()) return Annotate(response.status(), where_);
  if (response->status == 404 && response->ErrorCode() != "NoSuchBucket") return PointerRead{};
  if (!response->ok())
    return Annotate(client_->ErrorFor(*response, "read the pointer", key), where_);
  auto pointer = ParsePointerText(where_, response->body);
  if (!pointer.ok()) return pointer.status();
  return PointerRead{*std::move(pointer), response->Header("etag")};
}

absl::StatusOr<std::optional<VersionRef>> S3Store::ReadPointer() {
  auto read = ReadPointerWithEtag();
  if (!read.ok()) return read.status();
  return std::move(read->pointer);
}

absl::Status S3Store::AdvancePointer(const std::optional<VersionRef>& expected,
                                     const VersionRef& proposed) {
  auto read = ReadPointerWithEtag();
  if (!read.ok()) return read.status();
  if (absl::Status s = CheckCompareAndSwap(where_, run_id_, expected, read->pointer, proposed);
      !s.ok()) {
    return s;
  }
  const std::string key = location_.Key(kPointerKey);
  S3Request r;
  r.method = "PUT";
  r.key = key;
  r.body = proposed.ToString();
  r.headers = {{"Content-Type", "text/plain"}};
  if (read->pointer.has_value()) {
    if (read->etag.empty()) {
      return absl::FailedPreconditionError(absl::StrCat(
          where_, ": the service sent no ETag for ", location_.DisplayKey(key),
          ", so the pointer cannot be moved with a compare-and-swap; use an S3 service that "
          "supports conditional writes"));
    }
    r.headers.emplace_back("If-Match", read->etag);
  } else {
    r.headers.emplace_back("If-None-Match", "*");
  }
  if (before_pointer_write_) before_pointer_write_();
  auto response = client_->Send(r);
  if (!response.ok()) return Annotate(response.status(), where_);
  if (response->ok()) return absl::OkStatus();
  // 412: the condition failed; 409: S3's ConditionalRequestConflict for a
  // concurrent conditional write; 404: the pointer we matched against was
  // deleted. Each means someone else moved it: report what is there now.
  if (response->status == 412 || response->status == 409 ||
      (response->status == 404 && read->pointer.has_value() &&
       response->ErrorCode() != "NoSuchBucket")) {
    auto again = ReadPointerWithEtag();
    if (!again.ok()) return again.status();
    return PointerConflict(where_, expected, again->pointer, proposed);
  }
  return Annotate(client_->ErrorFor(*response, "write the pointer", key), where_);
}

absl::StatusOr<std::vector<StoredFile>> S3Store::StatVersionFiles(
    int64_t version, const std::vector<std::string>& files) {
  std::vector<StoredFile> out(files.size());
  absl::Status status = ParallelFor(files.size(), [&](size_t i) -> absl::Status {
    const std::string key = VersionKey(version, files[i]);
    auto info = Head(key);
    if (!info.ok()) return Annotate(info.status(), where_);
    if (!*info) {
      return absl::NotFoundError(absl::StrCat(where_, ": version ", VersionDirName(version),
                                              " has no ", Quoted(files[i]), " (",
                                              location_.DisplayKey(key), " does not exist)"));
    }
    if ((*info)->sha256.empty() || !IsSha256Hex((*info)->sha256)) {
      return absl::DataLossError(absl::StrCat(where_, ": ", location_.DisplayKey(key),
                                              " records no valid sha256; it was not written by "
                                              "stitch: republish the version"));
    }
    out[i] = StoredFile{files[i], (*info)->size, (*info)->sha256};
    return absl::OkStatus();
  });
  if (!status.ok()) return status;
  return out;
}

absl::StatusOr<std::vector<std::string>> S3Store::ListVersionFiles(int64_t version) {
  const std::string prefix = VersionKey(version, "");
  std::vector<std::string> out;
  std::string token;
  while (true) {
    S3Request r;
    r.key = "";
    r.query = {{"list-type", "2"},
               {"prefix", prefix},
               {"max-keys", absl::StrCat(options_.list_page_size)}};
    if (!token.empty()) r.query.emplace_back("continuation-token", token);
    auto response = client_->Send(r);
    if (!response.ok()) return Annotate(response.status(), where_);
    if (!response->ok()) {
      return Annotate(client_->ErrorFor(*response, "list", prefix), where_);
    }
    auto page = ParseListObjectsV2(response->body);
    if (!page.ok()) return Annotate(page.status(), absl::StrCat(where_, ": list ", prefix));
    for (const S3ObjectSummary& object : page->objects) {
      if (!absl::StartsWith(object.key, prefix)) continue;
      std::string name = object.key.substr(prefix.size());
      // Receipts, and anything else under a name starting with '.', are not
      // part of the version (version_dir.h).
      if (name.empty() || IsHiddenVersionPath(name)) continue;
      out.push_back(std::move(name));
    }
    if (!page->truncated) break;
    token = page->next_continuation_token;
  }
  std::sort(out.begin(), out.end());
  return out;
}

absl::Status S3Store::PutReceipt(int64_t version, std::string_view host, std::string_view json) {
  if (absl::Status s = RequireRunId("publish"); !s.ok()) return s;
  if (!ValidHostName(host)) {
    return absl::InvalidArgumentError(absl::StrCat(where_, ": receipt host name ", Quoted(host),
                                                   " must be 1-64 characters of [A-Za-z0-9._-]"));
  }
  S3Request r;
  r.method = "PUT";
  r.key = VersionKey(version, absl::StrCat(AbslView(kReceiptsDir), "/", AbslView(host), ".json"));
  r.body = std::string(json);
  std::string sha = Sha256Hex(r.body);
  r.payload_sha256 = sha;
  r.headers = {{"Content-Type", "application/json"},
               {S3Response::MetaHeader(kSha256MetadataKey), sha},
               {S3Response::MetaHeader(kLegacySha256MetadataKey), sha}};
  auto response = client_->Send(r);
  if (!response.ok()) return Annotate(response.status(), where_);
  if (!response->ok())
    return Annotate(client_->ErrorFor(*response, "write receipt", r.key), where_);
  return absl::OkStatus();
}

absl::StatusOr<std::string> S3Store::GetReceipt(int64_t version, std::string_view host) {
  if (!ValidHostName(host)) {
    return absl::InvalidArgumentError(absl::StrCat(where_, ": receipt host name ", Quoted(host),
                                                   " must be 1-64 characters of [A-Za-z0-9._-]"));
  }
  return GetVerified(
      VersionKey(version, absl::StrCat(AbslView(kReceiptsDir), "/", AbslView(host), ".json")),
      "receipt");
}

// ---- Reads ----

absl::StatusOr<std::string> S3Store::GetVerified(const std::string& key, std::string_view what,
                                                 uint64_t max_bytes) {
  S3Request r;
  r.key = key;
  r.max_buffered_body = max_bytes;
  auto response = client_->Send(r);
  // "It is N bytes, above the limit": the caller names the object.
  if (absl::IsOutOfRange(response.status())) return response.status();
  if (!response.ok()) return Annotate(response.status(), where_);
  if (response->status == 404 && response->ErrorCode() != "NoSuchBucket") {
    return absl::NotFoundError(absl::StrCat(where_, ": ", AbslView(what), " ",
                                            location_.DisplayKey(key), " does not exist"));
  }
  if (!response->ok()) {
    return Annotate(client_->ErrorFor(*response, absl::StrCat("read ", AbslView(what)), key),
                    where_);
  }
  auto recorded_or = RecordedSha256(*response);
  if (!recorded_or.ok()) {
    return Annotate(recorded_or.status(), absl::StrCat(where_, ": ", location_.DisplayKey(key)));
  }
  const std::string& recorded = *recorded_or;
  if (!IsSha256Hex(recorded)) {
    return absl::DataLossError(absl::StrCat(where_, ": ", location_.DisplayKey(key),
                                            " records no valid sha256; it was not written by "
                                            "stitch: republish the version"));
  }
  std::string actual = Sha256Hex(response->body);
  if (actual != recorded) {
    return WithKind(
        absl::DataLossError(absl::StrCat(where_, ": ", location_.DisplayKey(key), " hashes to ",
                                         actual, " but records sha256 ", recorded,
                                         "; the object changed after it was published")),
        ErrorKind::kChecksumMismatch);
  }
  return std::move(response->body);
}

absl::StatusOr<std::string> S3Store::ReadIndexText(int64_t version) {
  // A larger index than the bounds allow is refused before it is held.
  auto text = GetVerified(VersionKey(version, kIndexFileName), "index", index_bounds_.max_bytes);
  if (!text.ok() && absl::IsNotFound(text.status())) {
    return absl::NotFoundError(
        absl::StrCat(where_, ": version ", VersionDirName(version), " is not published"));
  }
  if (!text.ok() && absl::IsOutOfRange(text.status())) {
    return IndexTooLarge(where_, version, text.status().message(), index_bounds_);
  }
  return text;
}

absl::StatusOr<VersionManifest> S3Store::ReadManifest(int64_t version) {
  if (absl::Status s = ValidateVersionNumber(version); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(where_, ": ", s.message()));
  }
  auto text = ReadIndexText(version);
  if (!text.ok()) return text.status();
  return ManifestFromIndex(where_, version, *text, index_bounds_);
}

// ---- Materialize ----

absl::StatusOr<std::vector<std::string>> S3Store::FilesToMaterialize(
    int64_t version, const VersionManifest& manifest) {
  // The payload, and the version's other files (config, tokenizer), which
  // an engine loading the directory needs too.
  auto listed = ListVersionFiles(version);
  if (!listed.ok()) return listed.status();
  std::vector<std::string> files = manifest.files;
  const std::set<std::string> payload(files.begin(), files.end());
  for (const std::string& name : *listed) {
    if (name != kIndexFileName && !payload.contains(name)) files.push_back(name);
  }
  return files;
}

namespace {

// `peers` in the order every replica gives them for `file` of `version`
// (rendezvous hashing, with a hash every build computes alike): the first is
// the file's owner.
std::vector<size_t> PeerOrder(const std::vector<std::string>& peers, int64_t version,
                              std::string_view file) {
  std::vector<std::pair<uint64_t, size_t>> ranked;
  for (size_t i = 0; i < peers.size(); ++i) {
    ranked.emplace_back(StableHash(absl::StrCat(peers[i], "\n", version, "/", AbslView(file))), i);
  }
  std::sort(ranked.begin(), ranked.end(), std::greater<>());
  std::vector<size_t> order;
  for (const auto& [rank, i] : ranked) order.push_back(i);
  return order;
}

}  // namespace

absl::Status S3Store::DownloadMissing(int64_t version, const fs::path& target,
                                      const std::vector<StoredFile>& stored,
                                      const std::vector<size_t>& missing, S3CacheRecord& record) {
  absl::Mutex record_mu;
  auto keep = [&](const StoredFile& want, S3CachedFile cached) {
    absl::MutexLock guard(&record_mu);
    record.files[want.name] = std::move(cached);
  };
  const std::vector<std::string> peers =
      peers_.discover && !missing.empty() ? peers_.discover() : std::vector<std::string>();
  if (peers.empty()) {
    return ParallelFor(missing.size(), [&](size_t m) -> absl::Status {
      const StoredFile& want = stored[missing[m]];
      auto cached = FetchOne(version, target, want, peers, 0, 0);
      if (!cached.ok()) return cached.status();
      keep(want, *std::move(cached));
      return absl::OkStatus();
    });
  }
  // First every file's owner is asked without waiting: a file it holds
  // arrives; a file this replica owns is then fetched from the store before
  // any wait on another owner begins, so that replicas waiting on each
  // other always have their own files under way.
  enum class Asked { kWait, kOwned, kArrived, kOwnerFailed };
  std::vector<Asked> asked_owner(missing.size(), Asked::kWait);
  absl::Status asked = ParallelFor(missing.size(), [&](size_t m) -> absl::Status {
    const StoredFile& want = stored[missing[m]];
    const size_t owner = PeerOrder(peers, version, want.name).front();
    auto fetched = FetchFromPeerToCache(peers_, peers[owner], version, want, target / want.name, 0);
    if (fetched.ok()) {
      peer_files_.fetch_add(1);
      peer_bytes_.fetch_add(want.size);
      keep(want, *std::move(fetched));
      asked_owner[m] = Asked::kArrived;
    } else if (absl::IsFailedPrecondition(fetched.status())) {
      asked_owner[m] = Asked::kOwned;
    } else if (absl::IsDataLoss(fetched.status())) {
      peer_rejected_.fetch_add(1);
      spdlog::warn("{}: {}; taking the file from elsewhere", where_,
                   std::string(fetched.status().message()));
      asked_owner[m] = Asked::kOwnerFailed;
    } else if (!absl::IsNotFound(fetched.status())) {
      asked_owner[m] = Asked::kOwnerFailed;  // it did not answer
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
  return ParallelFor(rest.size(), [&](size_t r) -> absl::Status {
    const size_t m = rest[r];
    const StoredFile& want = stored[missing[m]];
    const size_t from = asked_owner[m] == Asked::kOwned         ? peers.size()
                        : asked_owner[m] == Asked::kOwnerFailed ? 1
                                                                : 0;
    auto cached = FetchOne(version, target, want, peers, from, wait_ms);
    if (!cached.ok()) return cached.status();
    keep(want, *std::move(cached));
    return absl::OkStatus();
  });
}

absl::StatusOr<S3CachedFile> S3Store::FetchOne(int64_t version, const fs::path& target,
                                               const StoredFile& want,
                                               const std::vector<std::string>& peers, size_t from,
                                               int64_t owner_wait_ms) {
  const std::vector<size_t> order =
      from >= peers.size() ? std::vector<size_t>() : PeerOrder(peers, version, want.name);
  const size_t tries =
      std::min(order.size(), 1 + static_cast<size_t>(std::max(0, peers_.extra_tries)));
  for (size_t k = from; k < tries; ++k) {
    auto fetched = FetchFromPeerToCache(peers_, peers[order[k]], version, want, target / want.name,
                                        k == 0 ? owner_wait_ms : 0);
    if (fetched.ok()) {
      peer_files_.fetch_add(1);
      peer_bytes_.fetch_add(want.size);
      return fetched;
    }
    if (k == 0 && absl::IsFailedPrecondition(fetched.status())) break;  // the owner is this replica
    if (absl::IsDataLoss(fetched.status())) {
      // A peer can delay a replica, never poison it: its bytes are dropped.
      peer_rejected_.fetch_add(1);
      spdlog::warn("{}: {}; taking the file from elsewhere", where_,
                   std::string(fetched.status().message()));
    } else if (!absl::IsNotFound(fetched.status()) &&
               !absl::IsFailedPrecondition(fetched.status())) {
      spdlog::info("{}: {}", where_, std::string(fetched.status().message()));
    }
  }
  auto cached = DownloadToCache(*client_, location_, VersionKey(version, want.name), want,
                                target / want.name);
  if (!cached.ok()) return cached.status();
  downloaded_.fetch_add(1);
  bytes_downloaded_.fetch_add(want.size);
  return cached;
}

StoreTraffic S3Store::traffic() const {
  StoreTraffic t;
  t.files_downloaded = static_cast<uint64_t>(downloaded_.load());
  t.bytes_downloaded = bytes_downloaded_.load();
  t.peer_files = peer_files_.load();
  t.peer_bytes = peer_bytes_.load();
  t.peer_rejected = peer_rejected_.load();
  return t;
}

absl::StatusOr<Store::VerifiedFile> S3Store::OpenVerifiedFile(int64_t version,
                                                              std::string_view name) {
  if (absl::Status s = ValidateVersionNumber(version); !s.ok()) {
    return absl::InvalidArgumentError(std::string(s.message()));
  }
  const std::string file(name);
  if (absl::Status s = ValidatePayloadFileName(file); !s.ok() || file == kIndexFileName) {
    return absl::InvalidArgumentError(
        absl::StrCat("\"", absl::CEscape(file), "\" is not a file a version's index names"));
  }
  const auto not_held = [&] {
    return absl::NotFoundError(absl::StrCat(VersionDirName(version), "/", file,
                                            " is not in this replica's verified cache"));
  };
  if (cache_dir_.empty()) return not_held();
  const S3VersionCachePaths paths = S3VersionCachePaths::For(cache_dir_, location_, version);
  if (!CheckCacheFileNames(paths.target, {file}, where_).ok()) return not_held();
  const S3CacheRecord record = ReadS3CacheRecord(paths.record);
  const auto entry = record.files.find(file);
  if (entry == record.files.end()) return not_held();
  VerifiedFile out;
  out.fd = UniqueFd(::open((paths.target / file).c_str(), O_RDONLY | O_CLOEXEC));
  struct stat st;
  // What was opened must be the file the record vouches for: a later
  // download replaces it by a rename, so the open descriptor keeps one
  // whole file either way.
  if (!out.fd || ::fstat(out.fd.get(), &st) != 0 || !S_ISREG(st.st_mode) ||
      static_cast<uint64_t>(st.st_size) != entry->second.size ||
      static_cast<int64_t>(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec !=
          entry->second.mtime_ns) {
    return not_held();
  }
  out.size = entry->second.size;
  return out;
}

absl::StatusOr<fs::path> S3Store::Materialize(int64_t version) {
  if (cache_dir_.empty()) {
    return absl::FailedPreconditionError(absl::StrCat(
        where_,
        ": no cache directory to materialize into; pass --cache-dir (StoreOptions.cache_dir)"));
  }
  if (absl::Status s = ValidateVersionNumber(version); !s.ok()) {
    return absl::InvalidArgumentError(absl::StrCat(where_, ": ", s.message()));
  }
  auto index_text = ReadIndexText(version);
  if (!index_text.ok()) return index_text.status();
  auto manifest = ManifestFromIndex(where_, version, *index_text, index_bounds_);
  if (!manifest.ok()) return manifest.status();
  auto files = FilesToMaterialize(version, *manifest);
  if (!files.ok()) return files.status();

  const S3VersionCachePaths paths = S3VersionCachePaths::For(cache_dir_, location_, version);
  if (absl::Status s = CheckCacheFileNames(paths.target, *files, where_); !s.ok()) return s;
  auto lock = LockCacheVersion(paths);
  if (!lock.ok()) return Annotate(lock.status(), where_);

  auto stored = StatVersionFiles(version, *files);
  if (!stored.ok()) {
    if (absl::IsNotFound(stored.status())) {
      return absl::DataLossError(
          absl::StrCat(stored.status().message(), "; the published version is incomplete"));
    }
    return stored.status();
  }
  S3CacheRecord record = ReadS3CacheRecord(paths.record);
  const std::vector<size_t> missing = StaleCacheFiles(paths.target, *stored, record);
  if (absl::Status s = DownloadMissing(version, paths.target, *stored, missing, record); !s.ok()) {
    // Keep what did arrive: the next attempt downloads only the rest.
    (void)WriteS3CacheRecord(paths.record, record);
    return Annotate(s, where_);
  }
  const fs::path index_path = paths.target / kIndexFileName;
  // Compared in pieces: the index is not held twice.
  absl::StatusOr<bool> on_disk = FileHolds(index_path, *index_text);
  if (!on_disk.ok() || !*on_disk) {
    if (absl::Status s = WriteFileAtomically(index_path, *index_text); !s.ok()) {
      return Annotate(s, where_);
    }
  }
  if (!missing.empty()) {
    if (absl::Status s = WriteS3CacheRecord(paths.record, record); !s.ok()) {
      return Annotate(s, where_);
    }
    for (const fs::path& dir : {paths.target, paths.parent}) {
      if (absl::Status s = FsyncPath(dir); !s.ok()) return Annotate(s, where_);
    }
  }
  return paths.target;
}

}  // namespace stitch

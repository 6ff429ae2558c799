// The S3 store against a real S3 protocol server (moto, which checks every
// request's SigV4 signature and honours conditional writes).
#include <gtest/gtest.h>

#include <thread>
#include <vector>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "stitch/core/errors.h"
#include "stitch/fetch/open_store.h"
#include "stitch/format/index.h"
#include "stitch/io/fileio.h"
#include "stitch/io/sha256.h"
#include "stitch/publish/claim.h"
#include "stitch/publish/publish.h"
#include "stitch/store/materialize_chain.h"
#include "stitch/store/retention.h"
#include "stitch/store/s3/s3_store.h"
#include "tests/s3_test_base.h"
#include "tests/support/version_dirs.h"

namespace stitch::testing {
namespace {

namespace fs = std::filesystem;

VersionRef Ref(const std::string& run, int64_t v) { return VersionRef{run, v}; }

// Replaces an object's bytes behind the store's back, keeping (or setting)
// the SHA-256 it claims to hold: what a buggy or hostile writer would do.
void Overwrite(Store& store, const std::string& key, const std::string& bytes,
               const std::string& claimed_sha256) {
  S3Request r;
  r.method = "PUT";
  r.key = key;
  r.body = bytes;
  r.headers = {{S3Response::MetaHeader("sha256"), claimed_sha256}};
  auto response = S3(store).client().Send(r);
  ASSERT_TRUE(response.ok()) << response.status().message();
  ASSERT_TRUE(response->ok()) << response->status << " " << response->body;
}

std::string ReadFile(const fs::path& p) {
  auto s = ReadFileToString(p);
  EXPECT_TRUE(s.ok()) << s.status().message();
  return s.ok() ? *s : std::string();
}

// Writes a DELTA version directory (index with the delta metadata and
// `files` payload files of arbitrary bytes): the store treats payload bytes
// as opaque, so this is enough to exercise chains.
fs::path WriteDeltaVersion(const fs::path& parent, int64_t version, int files) {
  fs::path dir = parent / VersionDirName(version);
  fs::create_directories(dir);
  CheckpointIndex index;
  index.metadata = {{"version", VersionMetadataString(version)},
                    {"delta_encoding", "xor"},
                    {"compression_format", "zstd"},
                    {"checksum_format", "xxh3-128"},
                    {"base_version", VersionMetadataString(version - 1)}};
  for (int f = 0; f < files; ++f) {
    std::string name = absl::StrCat("delta-", f, ".safetensors");
    index.weight_map[absl::StrCat("layers.", f, ".w")] = name;
    EXPECT_TRUE(
        WriteFileAtomically(dir / name, absl::StrCat("delta bytes ", version, "/", f)).ok());
  }
  EXPECT_TRUE(WriteIndex(dir, index).ok());
  return dir;
}

TEST_F(S3Test, PointerRoundTripWithConditionalWrites) {
  auto store = Open("run-a");
  ASSERT_NE(store, nullptr);
  auto unset = store->ReadPointer();
  ASSERT_TRUE(unset.ok()) << unset.status().message();
  EXPECT_FALSE(unset->has_value());

  ASSERT_TRUE(store->AdvancePointer(std::nullopt, Ref("run-a", 0)).ok());
  ASSERT_TRUE(store->AdvancePointer(Ref("run-a", 0), Ref("run-a", 1)).ok());
  auto read = store->ReadPointer();
  ASSERT_TRUE(read.ok());
  EXPECT_EQ(**read, Ref("run-a", 1));

  // The object holds the identity text, like the filesystem store's file.
  S3Request get;
  get.key = S3(*store).location().Key("latest");
  auto raw = S3(*store).client().Send(get);
  ASSERT_TRUE(raw.ok());
  EXPECT_EQ(raw->body, "run-a/weight_v000001");

  // A stale expectation is a conflict that reports what is really there.
  absl::Status stale = store->AdvancePointer(Ref("run-a", 0), Ref("run-a", 2));
  EXPECT_EQ(GetErrorKind(stale), ErrorKind::kPointerConflict) << stale.message();
  ASSERT_TRUE(GetConflictDetails(stale).has_value());
  EXPECT_EQ(GetConflictDetails(stale)->actual, "run-a/weight_v000001");
  absl::Status unset_expected = store->AdvancePointer(std::nullopt, Ref("run-a", 2));
  EXPECT_EQ(GetErrorKind(unset_expected), ErrorKind::kPointerConflict);

  absl::Status rewind = store->AdvancePointer(Ref("run-a", 1), Ref("run-a", 1));
  EXPECT_EQ(GetErrorKind(rewind), ErrorKind::kPointerRewind) << rewind.message();

  // Temporary credentials (a session token) read the same pointer.
  auto session = OpenAt(Uri(), "run-a", server().SessionCredentials());
  ASSERT_NE(session, nullptr);
  auto via_session = session->ReadPointer();
  ASSERT_TRUE(via_session.ok()) << via_session.status().message();
  EXPECT_EQ(**via_session, Ref("run-a", 1));
  EXPECT_TRUE(session->AdvancePointer(Ref("run-a", 1), Ref("run-a", 2)).ok());
}

// The server decides these races (moto's conditional writes are not atomic
// under truly simultaneous requests, S3's are), so each test pins the
// interleaving: the second writer has read and checked the pointer when the
// first one moves it, and only the server's 412 can stop it.
TEST_F(S3Test, FirstPointerWritesRaceThroughIfNoneMatch) {
  auto a = Open("run-a");
  auto b = Open("run-a");
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  absl::Status ra;
  S3(*b).SetBeforePointerWriteForTesting(
      [&] { ra = a->AdvancePointer(std::nullopt, Ref("run-a", 0)); });
  absl::Status rb = b->AdvancePointer(std::nullopt, Ref("run-a", 5));
  EXPECT_TRUE(ra.ok()) << ra.message();
  EXPECT_EQ(GetErrorKind(rb), ErrorKind::kPointerConflict) << rb.message();
  auto details = GetConflictDetails(rb);
  ASSERT_TRUE(details.has_value());
  EXPECT_EQ(details->expected, "");
  EXPECT_EQ(details->actual, "run-a/weight_v000000");
  EXPECT_EQ(details->proposed, "run-a/weight_v000005");
  auto pointer = a->ReadPointer();
  ASSERT_TRUE(pointer.ok());
  EXPECT_EQ(**pointer, Ref("run-a", 0));
}

TEST_F(S3Test, TwoPublishersFromOnePredecessorMoveThePointerOnce) {
  auto a = Open("run-a");
  auto b = Open("run-a");
  ASSERT_NE(a, nullptr);
  ASSERT_NE(b, nullptr);
  ASSERT_TRUE(ClaimRun(*a, 0, nullptr).ok());
  auto v1 = WriteTestVersion(tmp() / "a", 1);
  ASSERT_TRUE(v1.ok());
  ASSERT_TRUE(PublishVersion(*a, *v1, nullptr).ok());

  // B reads v1, uploads v2 and is about to move the pointer when A, which
  // also read v1, publishes the same v2 in full.
  auto va = WriteTestVersion(tmp() / "a", 2, {.seed = 2});
  auto vb = WriteTestVersion(tmp() / "b", 2, {.seed = 2});
  ASSERT_TRUE(va.ok() && vb.ok());
  absl::StatusOr<PublishOutcome> ra = absl::UnknownError("not run");
  S3(*b).SetBeforePointerWriteForTesting([&] { ra = PublishVersion(*a, *va, nullptr); });
  auto rb = PublishVersion(*b, *vb, nullptr);
  // A moved the pointer; B lost the conditional write to the same bytes, so
  // its publish is the same one: it succeeds, saying so.
  ASSERT_TRUE(ra.ok()) << ra.status().message();
  EXPECT_EQ(ra->version, Ref("run-a", 2));
  EXPECT_FALSE(ra->already_published);
  ASSERT_TRUE(rb.ok()) << rb.status().message();
  EXPECT_TRUE(rb->already_published);

  // The pointer names the winner, and the winner is complete.
  auto pointer = b->ReadPointer();
  ASSERT_TRUE(pointer.ok());
  EXPECT_EQ(**pointer, Ref("run-a", 2));
  auto dir = b->Materialize(2);
  ASSERT_TRUE(dir.ok()) << dir.status().message();
  EXPECT_TRUE(VerifyVersionDir(*dir).ok());

  // B uploads v3 while another run claims the store: the conditional write
  // fails and B reports the conflict with what it found.
  auto other = Open("run-b");
  ASSERT_NE(other, nullptr);
  S3(*b).SetBeforePointerWriteForTesting([&] { ASSERT_TRUE(ClaimRun(*other, 0, nullptr).ok()); });
  auto v3 = WriteTestVersion(tmp() / "b", 3, {.seed = 3});
  ASSERT_TRUE(v3.ok());
  auto lost = PublishVersion(*b, *v3, nullptr);
  EXPECT_EQ(GetErrorKind(lost.status()), ErrorKind::kPointerConflict) << lost.status().message();
  auto details = GetConflictDetails(lost.status());
  ASSERT_TRUE(details.has_value());
  EXPECT_EQ(details->expected, "run-a/weight_v000002");
  EXPECT_EQ(details->actual, "run-b/weight_v000000");
}

TEST_F(S3Test, PublishersThatReadOnePredecessorHaveOneWinner) {
  auto setup = Open("run-a");
  ASSERT_NE(setup, nullptr);
  ASSERT_TRUE(setup->AdvancePointer(std::nullopt, Ref("run-a", 1)).ok());
  // Eight publishers that all read v1; the first to write wins, every later
  // one finds the pointer moved and reports the winner.
  int winners = 0;
  for (int i = 0; i < 8; ++i) {
    auto store = Open("run-a");
    ASSERT_NE(store, nullptr);
    absl::Status s = store->AdvancePointer(Ref("run-a", 1), Ref("run-a", 2 + i));
    if (s.ok()) {
      ++winners;
      continue;
    }
    EXPECT_EQ(GetErrorKind(s), ErrorKind::kPointerConflict) << s.message();
    ASSERT_TRUE(GetConflictDetails(s).has_value());
    EXPECT_EQ(GetConflictDetails(s)->actual, "run-a/weight_v000002");
  }
  EXPECT_EQ(winners, 1);
}

TEST_F(S3Test, VersionOfAnotherRunIsRefused) {
  auto a = Open("run-a");
  ASSERT_NE(a, nullptr);
  ASSERT_TRUE(ClaimRun(*a, 0, nullptr).ok());
  absl::Status other = a->AdvancePointer(Ref("run-a", 0), Ref("run-b", 1));
  EXPECT_TRUE(absl::IsInvalidArgument(other)) << other.message();
  EXPECT_TRUE(absl::StrContains(other.message(), "scoped to run \"run-a\"")) << other.message();

  // A publisher of another run finds its run unclaimed, and nothing moves.
  auto b = Open("run-b");
  auto v1 = WriteTestVersion(tmp(), 1);
  ASSERT_TRUE(v1.ok());
  auto published = PublishVersion(*b, *v1, nullptr);
  EXPECT_TRUE(absl::IsFailedPrecondition(published.status())) << published.status().message();
  auto pointer = a->ReadPointer();
  ASSERT_TRUE(pointer.ok());
  EXPECT_EQ(**pointer, Ref("run-a", 0));
}

TEST_F(S3Test, PublishManifestAndMaterializeRoundTrip) {
  auto store = Open("run-a");
  ASSERT_NE(store, nullptr);
  // Two 6 MiB shards (multipart: 5 MiB parts) in a subdirectory whose name
  // needs percent-encoding, and a version without metadata.version.
  TestVersionOptions big{.shards = 2,
                         .tensors_per_shard = 1,
                         .elements = 1600000,
                         .file_prefix = "sub dir+x/",
                         .record_version = false};
  auto v1 = WriteTestVersion(tmp() / "src", 1, big);
  ASSERT_TRUE(v1.ok());
  absl::Status published = store->PublishFiles(1, *v1);
  ASSERT_TRUE(published.ok()) << published.message();
  EXPECT_EQ(S3(*store).payload_files_uploaded(), 2);

  auto listed = S3(*store).ListVersionFiles(1);
  ASSERT_TRUE(listed.ok()) << listed.status().message();
  EXPECT_EQ(*listed, (std::vector<std::string>{"model.safetensors.index.json",
                                               TestShardName(big, 0), TestShardName(big, 1)}));
  auto manifest = store->ReadManifest(1);
  ASSERT_TRUE(manifest.ok()) << manifest.status().message();
  EXPECT_EQ(manifest->version, 1);
  EXPECT_EQ(manifest->kind, VersionKind::kFull);
  EXPECT_EQ(manifest->files,
            (std::vector<std::string>{TestShardName(big, 0), TestShardName(big, 1)}));

  auto stat = S3(*store).StatVersionFiles(1, manifest->files);
  ASSERT_TRUE(stat.ok()) << stat.status().message();
  for (const StoredFile& f : *stat) {
    auto digest = HashFile(*v1 / f.name);
    ASSERT_TRUE(digest.ok());
    EXPECT_EQ(f.size, digest->size);
    EXPECT_EQ(f.sha256, digest->sha256);
  }

  auto dir = store->Materialize(1);
  ASSERT_TRUE(dir.ok()) << dir.status().message();
  EXPECT_TRUE(VerifyVersionDir(*dir).ok());
  for (const std::string& f : manifest->files) EXPECT_EQ(ReadFile(*dir / f), ReadFile(*v1 / f));
  auto cached_index = CheckpointIndex::Parse(ReadFile(*dir / kIndexFileName));
  ASSERT_TRUE(cached_index.ok());
  EXPECT_EQ(cached_index->metadata.at("version"), "000001");

  // A small version goes up in single requests with an S3-checked checksum.
  auto v2 = WriteTestVersion(tmp() / "src", 2);
  ASSERT_TRUE(v2.ok());
  ASSERT_TRUE(store->PublishFiles(2, *v2).ok());
  S3Request head;
  head.method = "HEAD";
  head.key = S3(*store).VersionKey(2, TestShardName({}, 0));
  head.headers = {{"x-amz-checksum-mode", "ENABLED"}};
  auto answer = S3(*store).client().Send(head);
  ASSERT_TRUE(answer.ok());
  auto digest = HashFile(*v2 / TestShardName({}, 0));
  ASSERT_TRUE(digest.ok());
  EXPECT_EQ(answer->Metadata(kSha256MetadataKey), digest->sha256);
  EXPECT_EQ(answer->Header("x-amz-checksum-sha256"), Sha256HexToBase64(digest->sha256));

  // Identical bytes again: a retry that uploads nothing. Different bytes:
  // refused, versions are immutable.
  int64_t uploads = S3(*store).payload_files_uploaded();
  EXPECT_TRUE(store->PublishFiles(2, *v2).ok());
  EXPECT_EQ(S3(*store).payload_files_uploaded(), uploads);
  auto different = WriteTestVersion(tmp() / "other", 2, {.seed = 9});
  ASSERT_TRUE(different.ok());
  absl::Status refused = store->PublishFiles(2, *different);
  EXPECT_TRUE(absl::IsAlreadyExists(refused)) << refused.message();
  EXPECT_TRUE(absl::StrContains(refused.message(), "immutable")) << refused.message();
  auto more = WriteTestVersion(tmp() / "more", 2, {.shards = 3});
  ASSERT_TRUE(more.ok());
  refused = store->PublishFiles(2, *more);
  EXPECT_TRUE(absl::IsAlreadyExists(refused)) << refused.message();
}

TEST_F(S3Test, DirectoryMissingAShardIsRefusedBeforeAnyUpload) {
  auto store = Open("run-a");
  ASSERT_NE(store, nullptr);
  auto v1 = WriteTestVersion(tmp(), 1);
  ASSERT_TRUE(v1.ok());
  fs::remove(*v1 / TestShardName({}, 1));
  absl::Status s = store->PublishFiles(1, *v1);
  EXPECT_TRUE(absl::IsNotFound(s)) << s.message();
  EXPECT_TRUE(absl::StrContains(s.message(), TestShardName({}, 1))) << s.message();
  auto listed = S3(*store).ListVersionFiles(1);
  ASSERT_TRUE(listed.ok());
  EXPECT_TRUE(listed->empty());
  auto manifest = store->ReadManifest(1);
  EXPECT_TRUE(absl::IsNotFound(manifest.status()));
}

TEST_F(S3Test, ObjectChangedAfterUploadIsDetected) {
  auto store = Open("run-a");
  ASSERT_NE(store, nullptr);
  auto v1 = WriteTestVersion(tmp() / "src", 1);
  ASSERT_TRUE(v1.ok());
  ASSERT_TRUE(store->PublishFiles(1, *v1).ok());
  const std::string shard = TestShardName({}, 0);
  const std::string original = ReadFile(*v1 / shard);
  auto digest = HashFile(*v1 / shard);
  ASSERT_TRUE(digest.ok());

  // Same size, same claimed SHA-256, different bytes: only the download's
  // own hash can tell, and it does.
  std::string tampered = original;
  tampered[tampered.size() / 2] ^= 0x5a;
  Overwrite(*store, S3(*store).VersionKey(1, shard), tampered, digest->sha256);
  auto dir = store->Materialize(1);
  EXPECT_TRUE(absl::IsDataLoss(dir.status())) << dir.status().message();
  EXPECT_EQ(GetErrorKind(dir.status()), ErrorKind::kChecksumMismatch);
  EXPECT_TRUE(absl::StrContains(dir.status().message(), shard)) << dir.status().message();
  EXPECT_FALSE(
      fs::exists(tmp() / "cache" / "s3" / server().bucket() / prefix() / "weight_v000001" / shard));

  // Another size: HEAD already tells, and a republish refuses to paper over it.
  Overwrite(*store, S3(*store).VersionKey(1, shard), original + "x", digest->sha256);
  auto stat = S3(*store).StatVersionFiles(1, {shard});
  ASSERT_TRUE(stat.ok());
  EXPECT_EQ((*stat)[0].size, digest->size + 1);
  absl::Status again = store->PublishFiles(1, *v1);
  EXPECT_TRUE(absl::IsAlreadyExists(again)) << again.message();

  // A tampered index is caught by its own recorded hash.
  auto index = ReadFileToString(*v1 / kIndexFileName);
  ASSERT_TRUE(index.ok());
  Overwrite(*store, S3(*store).VersionKey(1, kIndexFileName), *index + " ", Sha256Hex(*index));
  auto manifest = store->ReadManifest(1);
  EXPECT_TRUE(absl::IsDataLoss(manifest.status())) << manifest.status().message();
}

TEST_F(S3Test, MaterializeDownloadsTheChainOnce) {
  auto store = Open("run-a");
  ASSERT_NE(store, nullptr);
  auto v1 = WriteTestVersion(tmp() / "src", 1);  // FULL, 2 shards
  ASSERT_TRUE(v1.ok());
  ASSERT_TRUE(store->PublishFiles(1, *v1).ok());
  ASSERT_TRUE(store->PublishFiles(2, WriteDeltaVersion(tmp() / "src", 2, 1)).ok());
  ASSERT_TRUE(store->PublishFiles(3, WriteDeltaVersion(tmp() / "src", 3, 0)).ok());  // empty
  ASSERT_TRUE(store->PublishFiles(4, WriteDeltaVersion(tmp() / "src", 4, 2)).ok());

  auto chain = MaterializeChain(*store, 4, std::nullopt);
  ASSERT_TRUE(chain.ok()) << chain.status().message();
  ASSERT_EQ(chain->size(), 4u);
  for (int i = 0; i < 4; ++i) EXPECT_EQ((*chain)[i].version, i + 1);
  EXPECT_TRUE((*chain)[2].manifest.is_empty_delta());
  EXPECT_EQ(store->traffic().files_downloaded, 5u);
  EXPECT_EQ(ReadFile((*chain)[3].dir / "delta-1.safetensors"), "delta bytes 4/1");

  // Again, and from another store object on the same cache: nothing moves.
  ASSERT_TRUE(MaterializeChain(*store, 4, std::nullopt).ok());
  EXPECT_EQ(store->traffic().files_downloaded, 5u);
  auto fresh = Open("");
  ASSERT_NE(fresh, nullptr);
  auto from_applied = MaterializeChain(*fresh, 4, 2);
  ASSERT_TRUE(from_applied.ok()) << from_applied.status().message();
  ASSERT_EQ(from_applied->size(), 2u);
  EXPECT_EQ((*from_applied)[0].version, 3);
  EXPECT_EQ(fresh->traffic().files_downloaded, 0u);

  // A damaged cached file is downloaded again, and only that one.
  fs::path damaged = (*chain)[0].dir / TestShardName({}, 1);
  ASSERT_TRUE(WriteFileAtomically(damaged, "garbage").ok());
  ASSERT_TRUE(MaterializeChain(*fresh, 4, std::nullopt).ok());
  EXPECT_EQ(fresh->traffic().files_downloaded, 1u);
  EXPECT_EQ(ReadFile(damaged), ReadFile(*v1 / TestShardName({}, 1)));

  // A chain with a hole is refused, naming the missing version.
  ASSERT_TRUE(store->PublishFiles(6, WriteDeltaVersion(tmp() / "src", 6, 1)).ok());
  auto holed = MaterializeChain(*store, 6, std::nullopt);
  EXPECT_TRUE(absl::IsNotFound(holed.status())) << holed.status().message();
  EXPECT_TRUE(absl::StrContains(holed.status().message(), "weight_v000005"));
}

// Replicas on one host given one --cache-dir download each version once
// between them: concurrent materializations of one chain (each store object
// as a replica process: the cache's lock is an flock, which separate opens
// contend for as separate processes do) fetch every payload file once, and
// each sees the complete version.
TEST_F(S3Test, ReplicasSharingACacheDownloadEachVersionOnceBetweenThem) {
  auto publisher = Open("run-a");
  ASSERT_NE(publisher, nullptr);
  auto v1 = WriteTestVersion(tmp() / "src", 1);  // FULL, 2 shards
  ASSERT_TRUE(v1.ok());
  ASSERT_TRUE(publisher->PublishFiles(1, *v1).ok());
  ASSERT_TRUE(publisher->PublishFiles(2, WriteDeltaVersion(tmp() / "src", 2, 2)).ok());
  constexpr int kReplicas = 8;
  std::vector<std::unique_ptr<CachedStore>> replicas;
  for (int i = 0; i < kReplicas; ++i) {
    replicas.push_back(Open("run-a"));
    ASSERT_NE(replicas.back(), nullptr);
  }
  std::vector<absl::StatusOr<std::vector<ChainLink>>> chains(kReplicas,
                                                             absl::UnknownError("not run"));
  std::vector<std::thread> threads;
  for (int i = 0; i < kReplicas; ++i) {
    threads.emplace_back([&, i] { chains[i] = MaterializeChain(*replicas[i], 2, std::nullopt); });
  }
  for (std::thread& t : threads) t.join();
  uint64_t downloaded = 0;
  uint64_t bytes = 0;
  for (int i = 0; i < kReplicas; ++i) {
    ASSERT_TRUE(chains[i].ok()) << i << ": " << chains[i].status().message();
    ASSERT_EQ(chains[i]->size(), 2u);
    EXPECT_EQ(ReadFile((*chains[i])[0].dir / TestShardName({}, 1)),
              ReadFile(*v1 / TestShardName({}, 1)));
    EXPECT_EQ(ReadFile((*chains[i])[1].dir / "delta-1.safetensors"), "delta bytes 2/1");
    downloaded += replicas[i]->traffic().files_downloaded;
    bytes += replicas[i]->traffic().bytes_downloaded;
  }
  // Two shards of v1 and two delta files of v2: once each, not 8 times.
  EXPECT_EQ(downloaded, 4u);
  uint64_t published = 0;
  for (const fs::path& f : {*v1 / TestShardName({}, 0), *v1 / TestShardName({}, 1),
                            tmp() / "src" / VersionDirName(2) / "delta-0.safetensors",
                            tmp() / "src" / VersionDirName(2) / "delta-1.safetensors"}) {
    published += fs::file_size(f);
  }
  EXPECT_EQ(bytes, published);
}

TEST_F(S3Test, UnsafeKeyIsRefused) {
  auto store = Open("run-a");
  ASSERT_NE(store, nullptr);
  // An index (written behind the store's back, with a valid recorded hash)
  // that names a file outside the version directory.
  const std::string index =
      R"({"metadata": {"version": "000005"}, "weight_map": {"w": "../../escape.safetensors"}})";
  Overwrite(*store, S3(*store).VersionKey(5, kIndexFileName), index, Sha256Hex(index));
  Overwrite(*store, S3(*store).location().Key("updates/escape.safetensors"), "bytes",
            Sha256Hex("bytes"));
  auto dir = store->Materialize(5);
  EXPECT_TRUE(absl::IsDataLoss(dir.status())) << dir.status().message();
  EXPECT_TRUE(absl::StrContains(dir.status().message(), "escape")) << dir.status().message();
  std::error_code ec;
  for (fs::recursive_directory_iterator it(tmp(), ec), end; !ec && it != end; it.increment(ec)) {
    EXPECT_NE(it->path().filename(), "escape.safetensors") << it->path();
  }

  // Uploading under such a name is refused before anything is sent.
  auto up = S3(*store).UploadVersionFiles(6, tmp(), {"../escape.safetensors"});
  EXPECT_TRUE(absl::IsInvalidArgument(up.status())) << up.status().message();
  auto index_upload = S3(*store).UploadVersionFiles(6, tmp(), {"model.safetensors.index.json"});
  EXPECT_TRUE(absl::IsInvalidArgument(index_upload.status()));
}

TEST_F(S3Test, InvalidRootOrRunIdIsRefused) {
  const StoreOptions options{"run-a", tmp() / "cache"};
  for (const std::string& bad :
       {std::string("s3://"), std::string("s3:///prefix"), std::string("s3://Bad_Bucket/p"),
        std::string("s3://bucket/a/../b"), std::string("s3://bucket/a//b"),
        std::string("s3://bucket/p?bogus=1"), std::string("s3://bucket/p?endpoint=ftp://h/"),
        std::string("s3://bucket/p?region=US%20EAST"), std::string("s3://key@bucket/p"),
        std::string("s3://bucket:9000/p"), std::string("s3://bucket/p#frag")}) {
    auto store = OpenStore(bad, options);
    EXPECT_TRUE(absl::IsInvalidArgument(store.status())) << bad << ": " << store.status().message();
    if (!store.ok()) {
      EXPECT_TRUE(absl::StrContains(store.status().message(), "s3://")) << store.status().message();
    }
  }
  auto bad_run = OpenStore(Uri(), StoreOptions{"run/a", {}});
  EXPECT_TRUE(absl::IsInvalidArgument(bad_run.status())) << bad_run.status().message();

  // Without a run id the store only reads.
  auto reader = Open("");
  ASSERT_NE(reader, nullptr);
  absl::Status advance = reader->AdvancePointer(std::nullopt, Ref("run-a", 0));
  EXPECT_TRUE(absl::IsInvalidArgument(advance)) << advance.message();
  EXPECT_TRUE(absl::StrContains(advance.message(), "without a run id"));
  auto v1 = WriteTestVersion(tmp(), 1);
  ASSERT_TRUE(v1.ok());
  absl::Status publish = reader->PublishFiles(1, *v1);
  EXPECT_TRUE(absl::IsInvalidArgument(publish)) << publish.message();
  auto pointer = reader->ReadPointer();
  EXPECT_TRUE(pointer.ok()) << pointer.status().message();
}

TEST_F(S3Test, CredentialBucketAndEndpointFailuresAreOneClearLine) {
  S3Environment wrong = server().Credentials();
  wrong.secret_access_key = "not-the-secret";
  auto denied = OpenAt(Uri(), "run-a", wrong);
  ASSERT_NE(denied, nullptr);
  auto r1 = denied->ReadPointer();
  EXPECT_TRUE(absl::IsPermissionDenied(r1.status())) << r1.status().message();
  EXPECT_TRUE(absl::StrContains(r1.status().message(), "AWS_SECRET_ACCESS_KEY"));
  EXPECT_TRUE(absl::StrContains(r1.status().message(), "s3://" + server().bucket() + "/"));

  auto no_bucket = OpenAt(absl::StrCat("s3://no-such-bucket/p?endpoint=", server().endpoint()),
                          "run-a", server().Credentials());
  ASSERT_NE(no_bucket, nullptr);
  auto r2 = no_bucket->ReadPointer();
  EXPECT_TRUE(absl::IsNotFound(r2.status())) << r2.status().message();
  EXPECT_TRUE(absl::StrContains(r2.status().message(), "bucket \"no-such-bucket\" does not exist"));

  // Nothing listens there: retried, then a clear Unavailable.
  std::string closed;
  {
    auto probe = OpenAt(absl::StrCat("s3://b-b/p?endpoint=http://127.0.0.1:1"), "run-a",
                        server().Credentials());
    ASSERT_NE(probe, nullptr);
    auto r3 = probe->ReadPointer();
    EXPECT_TRUE(absl::IsUnavailable(r3.status())) << r3.status().message();
    EXPECT_TRUE(absl::StrContains(r3.status().message(), "cannot reach http://127.0.0.1:1"));
    EXPECT_TRUE(absl::StrContains(r3.status().message(), "after 3 attempts"));
    closed = std::string(r3.status().message());
  }
  for (const std::string& m :
       {std::string(r1.status().message()), std::string(r2.status().message()), closed}) {
    EXPECT_FALSE(absl::StrContains(m, "\n")) << m;
  }
}

TEST_F(S3Test, ListingFollowsContinuationTokens) {
  S3StoreOptions options = SmallOptions();
  options.list_page_size = 1;
  auto store = Open("run-a", options);
  ASSERT_NE(store, nullptr);
  auto v1 = WriteTestVersion(tmp(), 1, {.shards = 3});
  ASSERT_TRUE(v1.ok());
  ASSERT_TRUE(store->PublishFiles(1, *v1).ok());
  ASSERT_TRUE(S3(*store).PutReceipt(1, "rank-000000", "{}").ok());
  auto listed = S3(*store).ListVersionFiles(1);
  ASSERT_TRUE(listed.ok()) << listed.status().message();
  EXPECT_EQ(listed->size(), 4u);  // index + 3 shards, never the receipt
  auto receipt = S3(*store).GetReceipt(1, "rank-000000");
  ASSERT_TRUE(receipt.ok()) << receipt.status().message();
  EXPECT_EQ(*receipt, "{}");
}

// Retention on S3: chains kept back to their anchors, a held version with
// its own chain, everything of a deleted version gone (receipts included),
// and a replica that had materialized a deleted version before it went
// keeps its verified copy while a fresh one is told it is not published.
TEST_F(S3Test, RetentionKeepsChainsAndHoldsAndDeletesTheRestWhole) {
  auto store = Open("run-a");
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->AdvancePointer(std::nullopt, {"run-a", 0}).ok());
  // 1 FULL, 2..5 DELTAs, 6 FULL, 7..8 DELTAs.
  for (int64_t v = 1; v <= 8; ++v) {
    fs::path dir = (v == 1 || v == 6) ? *WriteTestVersion(tmp() / "src", v, {.seed = int(v)})
                                      : WriteDeltaVersion(tmp() / "src", v, 1);
    ASSERT_TRUE(store->PublishFiles(v, dir).ok()) << v;
    ASSERT_TRUE(store->AdvancePointer(VersionRef{"run-a", v - 1}, {"run-a", v}).ok()) << v;
  }
  ASSERT_TRUE(S3(*store).PutReceipt(4, "host-a", "{}").ok());
  auto early = MaterializeChain(*store, 4, std::nullopt);  // a replica at v4
  ASSERT_TRUE(early.ok()) << early.status().message();

  const absl::Time now = absl::Now();
  ASSERT_TRUE(PutHold(*store, Hold{"eval", 3, now + absl::Hours(1)}, now).ok());
  auto report = ApplyRetention(*store, {.keep_last = 2}, now);
  ASSERT_TRUE(report.ok()) << report.status().message();
  EXPECT_EQ(report->deleted, (std::vector<int64_t>{4, 5}));
  EXPECT_TRUE(report->failures.empty());
  EXPECT_EQ(*store->ListVersions(), (std::vector<int64_t>{1, 2, 3, 6, 7, 8}));
  const std::string text = DescribeRetention(*report, false);
  EXPECT_TRUE(absl::StrContains(text, "weight_v000001: chain of weight_v000003")) << text;
  EXPECT_TRUE(absl::StrContains(text, "weight_v000003: held by eval")) << text;
  EXPECT_TRUE(
      absl::StrContains(text, "weight_v000006: chain of weight_v000007, chain of weight_v000008"))
      << text;
  // Nothing of v4 is left, its receipt included.
  auto left = S3(*store).ListVersionFiles(4);
  ASSERT_TRUE(left.ok());
  EXPECT_TRUE(left->empty());
  EXPECT_FALSE(S3(*store).GetReceipt(4, "host-a").ok());

  // The replica that held v4 keeps its verified files; a fresh one is told.
  EXPECT_EQ(ReadFile((*early)[3].dir / "delta-0.safetensors"), "delta bytes 4/0");
  // Once it has moved past them, its copies of what the store deleted go;
  // the held chain's stay.
  auto pruned = store->PruneLocalCopies(8);
  ASSERT_TRUE(pruned.ok()) << pruned.status().message();
  EXPECT_EQ(*pruned, 1);  // v4 (v5 was never cached)
  EXPECT_FALSE(fs::exists((*early)[3].dir));
  EXPECT_TRUE(fs::exists((*early)[2].dir / "delta-0.safetensors"));
  EXPECT_EQ(*store->PruneLocalCopies(8), 0);
  auto late = MaterializeChain(*Open(""), 5, std::nullopt);
  EXPECT_TRUE(absl::IsNotFound(late.status())) << late.status().message();
  // The held chain and the pointer's chain still materialize.
  EXPECT_TRUE(MaterializeChain(*store, 3, std::nullopt).ok());
  EXPECT_TRUE(MaterializeChain(*store, 8, std::nullopt).ok());

  // Released, the hold's chain goes at the next gc.
  ASSERT_TRUE(ReleaseHold(*store, "eval").ok());
  auto again = ApplyRetention(*store, {.keep_last = 2}, now);
  ASSERT_TRUE(again.ok()) << again.status().message();
  EXPECT_EQ(again->deleted, (std::vector<int64_t>{1, 2, 3}));
  EXPECT_EQ(*store->ListVersions(), (std::vector<int64_t>{6, 7, 8}));
}

// Anchors written after the fact live under `<prefix>/anchors`: a chain
// starts from one, downloaded into the same cache, and retention deletes
// the chain behind it; its deletions obey the store's pointer.
TEST_F(S3Test, AnAnchorShortensTheChainAndRetentionDeletesWhatIsBehindIt) {
  auto store = Open("run-a");
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->AdvancePointer(std::nullopt, {"run-a", 0}).ok());
  for (int64_t v = 1; v <= 4; ++v) {
    fs::path dir = v == 1 ? *WriteTestVersion(tmp() / "src", v, {.seed = 1})
                          : WriteDeltaVersion(tmp() / "src", v, 1);
    ASSERT_TRUE(store->PublishFiles(v, dir).ok()) << v;
    ASSERT_TRUE(store->AdvancePointer(VersionRef{"run-a", v - 1}, {"run-a", v}).ok()) << v;
  }
  Store* anchors = store->anchors();
  ASSERT_NE(anchors, nullptr);
  EXPECT_TRUE(absl::StrContains(anchors->uri(), "/anchors")) << anchors->uri();
  for (int64_t v : {3, 4}) {
    auto dir = WriteTestVersion(tmp() / "anchor" / std::to_string(v), v, {.seed = int(v) + 10});
    ASSERT_TRUE(dir.ok());
    ASSERT_TRUE(anchors->PublishFiles(v, *dir).ok());
  }
  EXPECT_EQ(*store->ListVersions(), (std::vector<int64_t>{1, 2, 3, 4}));  // apart
  EXPECT_TRUE(absl::IsFailedPrecondition(anchors->DeleteVersion(4)));

  auto chain = MaterializeChain(*Open(""), 4, std::nullopt);
  ASSERT_TRUE(chain.ok()) << chain.status().message();
  ASSERT_EQ(chain->size(), 1u);  // v4's own anchor
  chain = MaterializeChain(*store, 3, std::nullopt);
  ASSERT_TRUE(chain.ok()) << chain.status().message();
  ASSERT_EQ(chain->size(), 1u);
  EXPECT_TRUE(chain->front().anchor);
  EXPECT_EQ(chain->front().manifest.kind, VersionKind::kFull);
  EXPECT_TRUE(absl::StrContains(chain->front().dir.string(), "anchors")) << chain->front().dir;
  EXPECT_EQ(ReadFile(chain->front().dir / TestShardName({}, 0)),
            ReadFile(tmp() / "anchor" / "3" / VersionDirName(3) / TestShardName({}, 0)));

  auto report = ApplyRetention(*store, {.keep_last = 2}, absl::Now());
  ASSERT_TRUE(report.ok()) << report.status().message();
  EXPECT_EQ(report->deleted, (std::vector<int64_t>{1, 2}));
  EXPECT_TRUE(report->anchors_deleted.empty());
  EXPECT_EQ(*store->ListVersions(), (std::vector<int64_t>{3, 4}));
  auto again = ApplyRetention(*store, {.keep_last = 1}, absl::Now());
  ASSERT_TRUE(again.ok()) << again.status().message();
  EXPECT_EQ(again->deleted, (std::vector<int64_t>{3}));
  EXPECT_EQ(again->anchors_deleted, (std::vector<int64_t>{3}));
  EXPECT_EQ(*anchors->ListVersions(), (std::vector<int64_t>{4}));
  // The anchor's cached copy goes with it.
  EXPECT_EQ(*store->PruneLocalCopies(4), 1);
}

// A gc that died after deleting a version's index left its other objects:
// they still list as a version, and the next gc deletes them.
TEST_F(S3Test, RetentionFinishesAVersionAnEarlierGcLeftHalfDeleted) {
  auto store = Open("run-a");
  ASSERT_NE(store, nullptr);
  ASSERT_TRUE(store->AdvancePointer(std::nullopt, {"run-a", 0}).ok());
  for (int64_t v = 1; v <= 3; ++v) {
    ASSERT_TRUE(store->PublishFiles(v, *WriteTestVersion(tmp() / "src", v, {.seed = int(v)})).ok());
    ASSERT_TRUE(store->AdvancePointer(VersionRef{"run-a", v - 1}, {"run-a", v}).ok());
  }
  S3Request r;
  r.method = "DELETE";
  r.key = S3(*store).VersionKey(1, kIndexFileName);
  ASSERT_TRUE(S3(*store).client().Send(r).ok());
  EXPECT_EQ(*store->ListVersions(), (std::vector<int64_t>{1, 2, 3}));
  auto report = ApplyRetention(*store, {.keep_last = 1}, absl::Now());
  ASSERT_TRUE(report.ok()) << report.status().message();
  EXPECT_EQ(report->deleted, (std::vector<int64_t>{1, 2}));
  EXPECT_EQ(*store->ListVersions(), (std::vector<int64_t>{3}));
}

}  // namespace
}  // namespace stitch::testing

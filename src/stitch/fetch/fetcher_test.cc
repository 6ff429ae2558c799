// The fetcher's owner choice, waits and fallbacks, and the cache in front
// of a remote store, against a fake remote store and fake peers: no S3
// server, no HTTP. Each peer here answers as a sidecar would: it holds a
// file or not, waits for it when asked to, is this replica, lies, or is
// gone.
#include "stitch/fetch/fetcher.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <set>
#include <string>
#include <tuple>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "stitch/core/errors.h"
#include "stitch/fetch/cached_store.h"
#include "stitch/io/sha256.h"
#include "tests/support/temp_dir.h"

namespace stitch {
namespace {

namespace fs = std::filesystem;
using ::testing::ElementsAre;

// A remote store holding the files of version 1 in memory; counts reads.
class FakeRemote final : public RemoteStore {
 public:
  void Add(const std::string& name, const std::string& bytes) {
    bytes_[name] = bytes;
    files_.push_back(StoredFile{name, bytes.size(), Sha256Hex(bytes)});
  }
  const std::vector<StoredFile>& files() const { return files_; }
  const std::string& bytes(const std::string& name) const { return bytes_.at(name); }
  std::vector<std::string> reads() const {
    absl::MutexLock lock(&mu_);
    return reads_;
  }
  // Every read and every ask of a peer (FakePeers), in order.
  void Log(std::string event) {
    absl::MutexLock lock(&mu_);
    events_.push_back(std::move(event));
  }
  std::vector<std::string> events() const {
    absl::MutexLock lock(&mu_);
    return events_;
  }

  std::string uri() const override { return "fake://remote"; }
  const std::string& run_id() const override { return run_; }
  absl::Status Refresh() override { return absl::OkStatus(); }
  absl::StatusOr<std::optional<VersionRef>> ReadPointer() override {
    return std::optional<VersionRef>(VersionRef{run_, 1});
  }
  absl::Status AdvancePointer(const std::optional<VersionRef>&, const VersionRef&) override {
    return absl::PermissionDeniedError("the fake remote store is read-only");
  }
  absl::Status PublishFiles(int64_t, const fs::path&) override {
    return absl::PermissionDeniedError("the fake remote store is read-only");
  }
  absl::StatusOr<VersionManifest> ReadManifest(int64_t) override {
    VersionManifest m;
    m.version = 1;
    for (const StoredFile& f : files_) m.files.push_back(f.name);
    return m;
  }
  absl::StatusOr<RemoteVersion> DescribeVersion(int64_t version) override {
    if (version != 1) return absl::NotFoundError("not published");
    RemoteVersion out;
    out.index_text = "{\"fake\": \"index\"}";
    auto manifest = ReadManifest(version);
    out.manifest = *manifest;
    out.files = files_;
    return out;
  }
  absl::Status ReadFile(int64_t, const StoredFile& want, ByteSink& sink) override {
    {
      absl::MutexLock lock(&mu_);
      reads_.push_back(want.name);
      events_.push_back(absl::StrCat("store ", want.name));
    }
    return sink.Write(bytes_.at(want.name));
  }
  fs::path CacheSubdir() const override { return "fake/remote"; }

 private:
  const std::string run_ = "run-a";
  std::map<std::string, std::string> bytes_;
  std::vector<StoredFile> files_;
  mutable absl::Mutex mu_;
  std::vector<std::string> reads_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> events_ ABSL_GUARDED_BY(mu_);
};

// How one fake peer answers.
enum class Peer {
  kHolds,          // sends every file
  kArrivesInWait,  // holds nothing at first; a file arrives while it is waited on
  kLacks,          // never holds anything
  kSelf,           // is the asking replica
  kLies,           // sends other bytes of the right size
  kGone,           // does not answer
};

class FakePeers final : public PeerSource {
 public:
  FakePeers(FakeRemote& remote, std::map<std::string, Peer> peers)
      : remote_(remote), peers_(std::move(peers)) {}

  struct Ask {
    std::string peer;
    std::string file;
    int64_t wait_ms;
    friend bool operator==(const Ask&, const Ask&) = default;
  };
  std::vector<Ask> asks() const {
    absl::MutexLock lock(&mu_);
    return asks_;
  }

  absl::Status Fetch(const std::string& peer, int64_t, const StoredFile& want, int64_t wait_ms,
                     ByteSink& sink) override {
    {
      absl::MutexLock lock(&mu_);
      asks_.push_back(Ask{peer, want.name, wait_ms});
    }
    remote_.Log(absl::StrCat("ask ", peer, " ", want.name, " ", wait_ms));
    switch (peers_.at(peer)) {
      case Peer::kHolds:
        return sink.Write(remote_.bytes(want.name));
      case Peer::kArrivesInWait:
        if (wait_ms == 0) return absl::NotFoundError(absl::StrCat(peer, " does not hold it"));
        return sink.Write(remote_.bytes(want.name));
      case Peer::kLacks:
        return absl::NotFoundError(absl::StrCat(peer, " does not hold it"));
      case Peer::kSelf:
        return absl::FailedPreconditionError(absl::StrCat(peer, " is this replica"));
      case Peer::kLies:
        return sink.Write(std::string(want.size, 'X'));
      case Peer::kGone:
        return absl::UnavailableError(absl::StrCat(peer, " did not answer"));
    }
    return absl::InternalError("unreachable");
  }

 private:
  FakeRemote& remote_;
  const std::map<std::string, Peer> peers_;
  mutable absl::Mutex mu_;
  std::vector<Ask> asks_ ABSL_GUARDED_BY(mu_);
};

const std::vector<std::string> kPeers = {"http://a", "http://b", "http://c"};

class FetcherTest : public ::testing::Test {
 protected:
  FetcherTest() {
    remote_.Add("model.safetensors", std::string(4096, 'm'));
    peers_.discover = [] { return kPeers; };
    peers_.owner_wait = std::chrono::milliseconds(700);
    peers_.extra_tries = 1;
  }

  // The owner of `file` of version 1, and the peer every replica asks next.
  static std::string Owner(const std::string& file, size_t rank = 0) {
    return kPeers[PeerOrder(kPeers, 1, file)[rank]];
  }
  // Every peer answers `others`, but `file`'s owner, which answers `owner`.
  std::map<std::string, Peer> With(const std::string& file, Peer owner, Peer others) {
    std::map<std::string, Peer> out;
    for (const std::string& p : kPeers) out[p] = p == Owner(file) ? owner : others;
    return out;
  }

  // Fetches every file of the fake remote's version 1 into the cache.
  absl::Status FetchAll(FakePeers& source, CacheRecord& record) {
    VersionFetcher fetcher(remote_, peers_, source, /*parallelism=*/1);
    std::vector<size_t> missing;
    for (size_t i = 0; i < remote_.files().size(); ++i) missing.push_back(i);
    absl::Status s = fetcher.Fetch(1, dir_ / "v1", remote_.files(), missing, record);
    traffic_ = fetcher.traffic();
    return s;
  }
  // Whether the cache holds `file` with the store's bytes.
  bool HoldsTrueBytes(const std::string& file) const {
    auto held = ReadFileToString(dir_ / "v1" / file);
    return held.ok() && *held == remote_.bytes(file);
  }

  testing::TempDir dir_;
  FakeRemote remote_;
  StorePeers peers_;
  StoreTraffic traffic_;
};

TEST_F(FetcherTest, EveryReplicaPicksTheSameOwnerWhateverTheOrderItListsPeersIn) {
  const std::string file = "model.safetensors";
  const std::vector<std::string> reversed(kPeers.rbegin(), kPeers.rend());
  EXPECT_EQ(kPeers[PeerOrder(kPeers, 1, file)[0]], reversed[PeerOrder(reversed, 1, file)[0]]);
  // Files spread over owners rather than all landing on one peer.
  std::set<std::string> owners;
  for (int i = 0; i < 32; ++i) owners.insert(Owner(absl::StrCat("shard-", i, ".safetensors")));
  EXPECT_EQ(owners.size(), kPeers.size());
}

TEST_F(FetcherTest, AFileTheOwnerHoldsComesFromItAndNeverFromTheStore) {
  FakePeers source(remote_, With("model.safetensors", Peer::kHolds, Peer::kLacks));
  CacheRecord record;
  ASSERT_TRUE(FetchAll(source, record).ok());
  EXPECT_THAT(source.asks(),
              ElementsAre(FakePeers::Ask{Owner("model.safetensors"), "model.safetensors", 0}));
  EXPECT_TRUE(remote_.reads().empty());
  EXPECT_TRUE(HoldsTrueBytes("model.safetensors"));
  EXPECT_EQ(traffic_.peer_files, 1u);
  EXPECT_EQ(traffic_.peer_bytes, 4096u);
  EXPECT_EQ(traffic_.files_downloaded, 0u);
  ASSERT_TRUE(record.files.contains("model.safetensors"));
  EXPECT_EQ(record.files["model.safetensors"].sha256,
            Sha256Hex(remote_.bytes("model.safetensors")));
}

// A slow owner: it is fetching the file from the store itself when asked.
// The replica asks once without waiting, then waits for it (owner_wait)
// rather than go to the store too.
TEST_F(FetcherTest, ASlowOwnerIsWaitedOnOnceAndTheStoreIsLeftAlone) {
  FakePeers source(remote_, With("model.safetensors", Peer::kArrivesInWait, Peer::kLacks));
  CacheRecord record;
  ASSERT_TRUE(FetchAll(source, record).ok());
  const std::string owner = Owner("model.safetensors");
  EXPECT_THAT(source.asks(), ElementsAre(FakePeers::Ask{owner, "model.safetensors", 0},
                                         FakePeers::Ask{owner, "model.safetensors", 700}));
  EXPECT_TRUE(remote_.reads().empty());
  EXPECT_TRUE(HoldsTrueBytes("model.safetensors"));
}

// An owner that does not answer is never waited on: the next peer is asked
// without a wait, then the store.
TEST_F(FetcherTest, AnOwnerThatDoesNotAnswerIsPassedOverWithoutAWait) {
  FakePeers source(remote_, With("model.safetensors", Peer::kGone, Peer::kLacks));
  CacheRecord record;
  ASSERT_TRUE(FetchAll(source, record).ok());
  EXPECT_THAT(source.asks(),
              ElementsAre(FakePeers::Ask{Owner("model.safetensors"), "model.safetensors", 0},
                          FakePeers::Ask{Owner("model.safetensors", 1), "model.safetensors", 0}));
  EXPECT_THAT(remote_.reads(), ElementsAre("model.safetensors"));
  EXPECT_TRUE(HoldsTrueBytes("model.safetensors"));
  EXPECT_EQ(traffic_.files_downloaded, 1u);
}

// A lying peer delays the replica, never poisons it: its bytes are
// dropped and counted, and the cache holds the store's.
TEST_F(FetcherTest, ALyingPeersBytesAreDroppedAndTheFileComesFromElsewhere) {
  FakePeers source(remote_, With("model.safetensors", Peer::kLies, Peer::kLies));
  CacheRecord record;
  ASSERT_TRUE(FetchAll(source, record).ok());
  EXPECT_TRUE(HoldsTrueBytes("model.safetensors"));
  EXPECT_THAT(remote_.reads(), ElementsAre("model.safetensors"));
  // The owner, then the one extra try: both lied.
  EXPECT_EQ(traffic_.peer_rejected, 2u);
  EXPECT_EQ(traffic_.peer_files, 0u);
  // Nothing of theirs is left behind beside the file.
  std::vector<fs::path> left;
  for (const auto& entry : fs::directory_iterator(dir_ / "v1")) left.push_back(entry.path());
  EXPECT_THAT(left, ElementsAre(dir_ / "v1" / "model.safetensors"));
}

// The owner is this replica (it asked its own sidecar, which answered
// 409): the file is taken from the store at once, before this replica
// waits on any other owner, and no other peer is asked for it.
TEST_F(FetcherTest, ASelfAskTakesTheFileFromTheStoreBeforeWaitingOnOthers) {
  // A second file, owned by another peer that is slow: its wait must come
  // after this replica's own file is under way.
  std::string theirs;
  for (int i = 0; theirs.empty(); ++i) {
    const std::string name = absl::StrCat("shard-", i, ".safetensors");
    if (Owner(name) != Owner("model.safetensors")) theirs = name;
  }
  remote_.Add(theirs, std::string(2048, 't'));
  std::map<std::string, Peer> behaviour;
  for (const std::string& p : kPeers) behaviour[p] = Peer::kLacks;
  behaviour[Owner("model.safetensors")] = Peer::kSelf;
  behaviour[Owner(theirs)] = Peer::kArrivesInWait;
  FakePeers source(remote_, behaviour);
  CacheRecord record;
  ASSERT_TRUE(FetchAll(source, record).ok());
  EXPECT_THAT(remote_.reads(), ElementsAre("model.safetensors"));
  EXPECT_TRUE(HoldsTrueBytes("model.safetensors"));
  EXPECT_TRUE(HoldsTrueBytes(theirs));
  // Each owner asked once without waiting; then this replica's own file
  // from the store; only then the slow owner, with the wait.
  EXPECT_THAT(
      remote_.events(),
      ElementsAre(absl::StrCat("ask ", Owner("model.safetensors"), " model.safetensors 0"),
                  absl::StrCat("ask ", Owner(theirs), " ", theirs, " 0"), "store model.safetensors",
                  absl::StrCat("ask ", Owner(theirs), " ", theirs, " 700")));
}

TEST_F(FetcherTest, WithoutPeersEveryFileComesFromTheStore) {
  peers_.discover = nullptr;
  FakePeers source(remote_, {});
  CacheRecord record;
  ASSERT_TRUE(FetchAll(source, record).ok());
  EXPECT_TRUE(source.asks().empty());
  EXPECT_THAT(remote_.reads(), ElementsAre("model.safetensors"));
}

// The cache in front of the fake remote store: a second materialization
// fetches nothing, and what it holds is served to peers only while the
// record vouches for it.
TEST_F(FetcherTest, TheCacheFetchesAVersionOnceAndVouchesOnlyForUntouchedFiles) {
  auto remote = std::make_unique<FakeRemote>();
  remote->Add("model.safetensors", std::string(4096, 'm'));
  FakeRemote* fake = remote.get();
  auto store = CachedStore::Open(std::move(remote), dir_ / "cache", {},
                                 std::make_unique<FakePeers>(*fake, std::map<std::string, Peer>{}));
  ASSERT_TRUE(store.ok()) << store.status();
  EXPECT_FALSE((*store)->peer_id().empty());
  EXPECT_TRUE(absl::IsNotFound((*store)->OpenVerifiedFile(1, "model.safetensors").status()));
  auto dir = (*store)->Materialize(1);
  ASSERT_TRUE(dir.ok()) << dir.status();
  EXPECT_EQ(*dir, dir_ / "cache" / "fake" / "remote" / "weight_v000001");
  auto again = (*store)->Materialize(1);
  ASSERT_TRUE(again.ok()) << again.status();
  EXPECT_THAT(fake->reads(), ElementsAre("model.safetensors"));
  EXPECT_EQ((*store)->traffic().files_downloaded, 1u);
  auto index = ReadFileToString(*dir / kIndexFileName);
  ASSERT_TRUE(index.ok());
  EXPECT_EQ(*index, "{\"fake\": \"index\"}");

  auto served = (*store)->OpenVerifiedFile(1, "model.safetensors");
  ASSERT_TRUE(served.ok()) << served.status();
  EXPECT_EQ(served->size, 4096u);
  // A file touched since it was verified is not served, and is fetched again.
  ASSERT_TRUE(WriteFileAtomically(*dir / "model.safetensors", std::string(4096, 'z')).ok());
  EXPECT_TRUE(absl::IsNotFound((*store)->OpenVerifiedFile(1, "model.safetensors").status()));
  ASSERT_TRUE((*store)->Materialize(1).ok());
  EXPECT_EQ(fake->reads().size(), 2u);
  auto refetched = ReadFileToString(*dir / "model.safetensors");
  ASSERT_TRUE(refetched.ok());
  EXPECT_EQ(*refetched, fake->bytes("model.safetensors"));
  // Not a file of a version: refused, not looked up.
  EXPECT_TRUE(absl::IsInvalidArgument((*store)->OpenVerifiedFile(1, "../x").status()));
  EXPECT_TRUE(absl::IsInvalidArgument((*store)->OpenVerifiedFile(1, kIndexFileName).status()));
}

TEST_F(FetcherTest, ARemoteStoreAloneCannotBeMaterialized) {
  const absl::Status s = remote_.Materialize(1).status();
  EXPECT_TRUE(absl::IsFailedPrecondition(s)) << s;
  EXPECT_THAT(std::string(s.message()), ::testing::HasSubstr("fetch/open_store.h"));
}

}  // namespace
}  // namespace stitch

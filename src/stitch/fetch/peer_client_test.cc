// A file taken from a peer into the version cache (HttpPeerSource into
// ReceiveIntoCache) against peers on loopback that lie about the file's
// length, never stop sending, or trickle: what a replica writes and how
// long it waits are bounded by the size the store records, whatever the
// peer does.
#include "stitch/fetch/peer_client.h"

#include <sys/socket.h>
#include <unistd.h>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <functional>

#include "absl/strings/str_cat.h"
#include "stitch/core/errors.h"
#include "stitch/fetch/version_cache.h"
#include "stitch/io/sha256.h"
#include "tests/support/loopback_listener.h"
#include "tests/support/temp_dir.h"

namespace stitch {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;

// A peer that answers each connection by reading the request's head and
// then running `answer` on it, one connection at a time.
class FakePeer {
 public:
  // Sends on the connection; false once the replica has left.
  using Send = std::function<bool(std::string_view bytes)>;
  using Answer = std::function<void(const Send& send)>;

  explicit FakePeer(Answer answer)
      : answer_(std::move(answer)), listener_([this](int conn) { Serve(conn); }) {}
  std::string url() const { return listener_.url(); }

 private:
  void Serve(int conn) {
    std::string head;
    char buf[4096];
    while (head.find("\r\n\r\n") == std::string::npos && listener_.Readable(conn)) {
      const ssize_t n = ::read(conn, buf, sizeof buf);
      if (n <= 0) break;
      head.append(buf, static_cast<size_t>(n));
    }
    answer_([conn](std::string_view bytes) {
      while (!bytes.empty()) {
        const ssize_t n = ::send(conn, bytes.data(), bytes.size(), MSG_NOSIGNAL);
        if (n <= 0) return false;
        bytes.remove_prefix(static_cast<size_t>(n));
      }
      return true;
    });
  }

  const Answer answer_;
  testing::LoopbackListener listener_;  // last: it serves as soon as it is made
};

// A hostile peer stops sending at this much, so that a replica that keeps
// reading shows as a peer that sent it all.
constexpr uint64_t kHostileCap = uint64_t{64} << 20;

class PeerFetchTest : public ::testing::Test {
 protected:
  PeerFetchTest() {
    for (size_t i = 0; i < content_.size(); ++i) content_[i] = static_cast<char>('a' + i % 26);
    want_ = StoredFile{"model.safetensors", content_.size(), Sha256Hex(content_)};
  }

  absl::StatusOr<CachedFile> Fetch(const FakePeer& peer) {
    HttpPeerSource source(peers_);
    return ReceiveIntoCache(dir_ / "v1" / want_.name, want_, "the peer", [&](CacheFileSink& sink) {
      return source.Fetch(peer.url(), 1, want_, 0, sink);
    });
  }
  // Whether the version's directory holds nothing but what arrived whole.
  bool NothingLeftBehind() const {
    std::error_code ec;
    return !fs::exists(dir_ / "v1", ec) || fs::is_empty(dir_ / "v1", ec);
  }
  // Sends the file's bytes, then `x`s until the replica leaves or the cap;
  // returns the bytes the peer got to send.
  uint64_t SendEndlessly(const FakePeer::Send& send) const {
    if (!send(content_)) return 0;
    const std::string more(64 << 10, 'x');
    uint64_t sent = content_.size();
    while (sent < kHostileCap && send(more)) sent += more.size();
    return sent;
  }

  testing::TempDir dir_;
  std::string content_ = std::string(64 << 10, '\0');
  StoredFile want_;
  StorePeers peers_;
};

TEST_F(PeerFetchTest, AnHonestPeerDeliversWithOrWithoutAContentLength) {
  FakePeer sized([&](const FakePeer::Send& send) {
    (void)send(absl::StrCat("HTTP/1.1 200 OK\r\nContent-Length: ", content_.size(),
                            "\r\nConnection: close\r\n\r\n", content_));
  });
  auto got = Fetch(sized);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->size, content_.size());
  fs::remove_all(dir_ / "v1");
  // A sidecar streams its files chunked, without a Content-Length.
  FakePeer chunked([&](const FakePeer::Send& send) {
    (void)send(absl::StrCat("HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n",
                            absl::Hex(content_.size()), "\r\n", content_, "\r\n0\r\n\r\n"));
  });
  got = Fetch(chunked);
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(got->sha256, want_.sha256);
}

// A peer that sends the file and then never stops: the replica writes the
// recorded size, no more, and leaves.
TEST_F(PeerFetchTest, APeerThatNeverStopsSendingIsCutAtTheRecordedSize) {
  std::atomic<uint64_t> sent{0};
  FakePeer endless([&](const FakePeer::Send& send) {
    if (send("HTTP/1.1 200 OK\r\nConnection: close\r\n\r\n")) sent = SendEndlessly(send);
  });
  auto got = Fetch(endless);
  ASSERT_FALSE(got.ok());
  EXPECT_TRUE(absl::IsDataLoss(got.status())) << got.status();
  EXPECT_EQ(GetErrorKind(got.status()), ErrorKind::kChecksumMismatch);
  EXPECT_THAT(std::string(got.status().message()), HasSubstr("sent more than the 65536 bytes"));
  EXPECT_TRUE(NothingLeftBehind());
  // The peer is cut off long before its own cap (what socket buffers hold
  // is all it got to send past the file).
  EXPECT_LT(sent.load(), kHostileCap / 2);
}

// A peer that declares a body other than the file's size is refused before
// any of it is written.
TEST_F(PeerFetchTest, APeerDeclaringAnotherContentLengthIsRefusedBeforeItsBody) {
  std::atomic<uint64_t> sent{0};
  FakePeer huge([&](const FakePeer::Send& send) {
    if (send(absl::StrCat("HTTP/1.1 200 OK\r\nContent-Length: ", content_.size() + (1 << 30),
                          "\r\n\r\n"))) {
      sent = SendEndlessly(send);
    }
  });
  auto got = Fetch(huge);
  ASSERT_FALSE(got.ok());
  EXPECT_TRUE(absl::IsDataLoss(got.status())) << got.status();
  EXPECT_THAT(std::string(got.status().message()),
              HasSubstr(absl::StrCat("declared a body of ", content_.size() + (1 << 30),
                                     " bytes but the store records 65536")));
  EXPECT_TRUE(NothingLeftBehind());
  EXPECT_LT(sent.load(), kHostileCap / 2);
  // Short is refused too.
  FakePeer short_peer([&](const FakePeer::Send& send) {
    (void)send(absl::StrCat("HTTP/1.1 200 OK\r\nContent-Length: 10\r\n\r\n0123456789"));
  });
  got = Fetch(short_peer);
  EXPECT_TRUE(absl::IsDataLoss(got.status())) << got.status();
  EXPECT_THAT(std::string(got.status().message()), HasSubstr("declared a body of 10 bytes"));
}

// A peer that sends the right bytes, but slower than the floor rate (and
// faster than the stall limit of 1 KiB/s), is left at its deadline.
TEST_F(PeerFetchTest, APeerSlowerThanTheFloorRateIsLeftAtItsDeadline) {
  peers_.min_rate = 1 << 20;
  peers_.allowance = std::chrono::milliseconds(100);
  peers_.connect_timeout = std::chrono::milliseconds(100);
  std::atomic<uint64_t> sent{0};
  FakePeer trickle([&](const FakePeer::Send& send) {
    if (!send(absl::StrCat("HTTP/1.1 200 OK\r\nContent-Length: ", content_.size(), "\r\n\r\n"))) {
      return;
    }
    // 10 KiB/s: the whole file would take 6.4 s, its deadline is 263 ms.
    for (size_t at = 0; at < content_.size(); at += 1024) {
      if (!send(std::string_view(content_).substr(at, 1024))) return;
      sent += 1024;
      std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
  });
  auto got = Fetch(trickle);
  ASSERT_FALSE(got.ok());
  EXPECT_TRUE(absl::IsUnavailable(got.status())) << got.status();
  EXPECT_THAT(std::string(got.status().message()),
              HasSubstr("a peer has 263 ms for this 65536-byte file"));
  EXPECT_TRUE(NothingLeftBehind());
  EXPECT_LT(sent.load(), content_.size());
}

TEST(PeerTransferDeadlineTest, IsTheSizeAtTheFloorRatePlusTheFixedAllowances) {
  StorePeers peers;
  peers.min_rate = 1 << 20;
  peers.connect_timeout = std::chrono::seconds(2);
  peers.allowance = std::chrono::seconds(3);
  using std::chrono::milliseconds;
  EXPECT_EQ(PeerTransferDeadline(peers, 0, 0), milliseconds(5000));
  EXPECT_EQ(PeerTransferDeadline(peers, uint64_t{10} << 20, 0), milliseconds(15000));
  EXPECT_EQ(PeerTransferDeadline(peers, 1, 0), milliseconds(5001));  // rounded up
  EXPECT_EQ(PeerTransferDeadline(peers, uint64_t{10} << 20, 10000), milliseconds(25000));
  // A 5 GB shard at the default floor takes at most minutes, not weeks.
  EXPECT_LT(PeerTransferDeadline(StorePeers{}, uint64_t{5} << 30, 0), std::chrono::minutes(25));
  // Nothing overflows.
  EXPECT_GT(PeerTransferDeadline(peers, UINT64_MAX, INT64_MAX), milliseconds(0));
}

}  // namespace
}  // namespace stitch

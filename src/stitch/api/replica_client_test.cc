#include "stitch/api/replica_client.h"

#include <atomic>
#include <memory>
#include <string>
#include <vector>

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "stitch/api/server_info.h"
#include "stitch/net/event_loop.h"
#include "stitch/net/net_test_util.h"
#include "stitch/net/server.h"

namespace stitch {
namespace {

using boost::asio::awaitable;
using ::testing::HasSubstr;

// A sidecar's two routes under a path prefix, answering as told.
class FakeSidecar {
 public:
  explicit FakeSidecar(EventLoop& loop) : loop_(loop) {
    HttpRouter router;
    router.Add("GET", "/r/server_info", [this](HttpExchange& ex) { return Info(ex); });
    router.Add("POST", "/r/wake", [this](HttpExchange& ex) { return Wake(ex); });
    auto server = HttpServer::Start(loop.executor(), ServerOptions{}, router.AsHandler());
    EXPECT_TRUE(server.ok()) << server.status();
    server_ = *std::move(server);
  }
  ~FakeSidecar() { loop_.BlockOn(server_->Shutdown()); }

  std::string url() const { return server_->url() + "/r"; }
  std::atomic<int> info_status{200};
  std::atomic<int> wake_status{200};
  std::atomic<int> wakes{0};
  std::atomic<bool> wake_body_is_json{false};

 private:
  awaitable<void> Info(HttpExchange& ex) {
    ReplicaState s;
    s.ready = true;
    s.applied = VersionRef{"run", 3};
    std::string body = info_status == 200 ? ServerInfoJson(s) : "{}";
    (void)co_await ex.Respond(JsonResponse(info_status, std::move(body)));
  }
  awaitable<void> Wake(HttpExchange& ex) {
    ++wakes;
    wake_body_is_json =
        ex.request().body == "{}" && ex.request().headers.Get("content-type") == "application/json";
    (void)co_await ex.Respond(JsonResponse(wake_status, "{}"));
  }

  EventLoop& loop_;
  std::unique_ptr<HttpServer> server_;
};

TEST(ReplicaClientTest, ServerInfoIsReadBelowTheReplicasPrefix) {
  EventLoop loop;
  FakeSidecar sidecar(loop);
  auto infos = ReadServerInfos({sidecar.url()}, ReplicaCallOptions{});
  ASSERT_EQ(infos.size(), 1u);
  ASSERT_TRUE(infos[0].ok()) << infos[0].status();
  EXPECT_TRUE(infos[0]->ready);
  EXPECT_EQ(infos[0]->applied, (VersionRef{"run", 3}));

  sidecar.info_status = 500;
  infos = ReadServerInfos({sidecar.url()}, ReplicaCallOptions{});
  EXPECT_EQ(infos[0].status().message(), "/server_info answered HTTP 500");
}

TEST(ReplicaClientTest, EachReplicaGetsItsOwnAnswerInOrder) {
  EventLoop loop;
  FakeSidecar sidecar(loop);
  const std::string dead = "http://127.0.0.1:" + std::to_string(testing::UnusedPort());
  ReplicaCallOptions options;
  options.concurrency = 2;
  auto infos = ReadServerInfos({dead, sidecar.url(), "ftp://x", sidecar.url()}, options);
  ASSERT_EQ(infos.size(), 4u);
  EXPECT_FALSE(infos[0].ok());
  EXPECT_TRUE(infos[1].ok()) << infos[1].status();
  EXPECT_FALSE(infos[2].ok());
  EXPECT_TRUE(infos[3].ok()) << infos[3].status();
}

TEST(ReplicaClientTest, AWakeIsAnEmptyJsonPostAndOnly2xxCounts) {
  EventLoop loop;
  FakeSidecar sidecar(loop);
  std::vector<absl::Status> woken = WakeEach({sidecar.url(), sidecar.url()}, ReplicaCallOptions{});
  ASSERT_EQ(woken.size(), 2u);
  EXPECT_TRUE(woken[0].ok()) << woken[0];
  EXPECT_TRUE(woken[1].ok()) << woken[1];
  EXPECT_EQ(sidecar.wakes, 2);
  EXPECT_TRUE(sidecar.wake_body_is_json);

  sidecar.wake_status = 503;
  woken = WakeEach({sidecar.url()}, ReplicaCallOptions{});
  EXPECT_EQ(woken[0].message(), "HTTP 503");
  EXPECT_TRUE(WakeEach({}, ReplicaCallOptions{}).empty());
}

}  // namespace
}  // namespace stitch

#include "tests/replica_steps.h"

#include "stitch/api/server_info.h"
#include "stitch/core/state.h"
#include "stitch/core/version.h"
#include "stitch/net/client.h"
#include "stitch/net/net_test_util.h"
#include "tests/support/cli_expect.h"

namespace stitch::testing {

void InitTinyModel(const std::string& dir, int seed) {
  ExpectOk(RunStitch({"engine", "init-model", dir, "--layers", "1", "--hidden", "32", "--heads",
                      "2", "--seed", std::to_string(seed), "--max-positions", "256"}),
           "init-model");
}

void RunOfR1::PublishFull(int64_t version, const std::string& checkpoint,
                          const std::string& wake_url) const {
  const std::string dir = (out / VersionDirName(version)).string();
  ExpectOk(RunStitch({"delta", "full", "--checkpoint", checkpoint, "--out", dir, "--version",
                      std::to_string(version), "--run-id", "r1"}),
           "delta full");
  std::vector<std::string> publish = {"publish", "--store", store, "--run-id", "r1"};
  if (!wake_url.empty()) {
    publish.push_back("--pool");
    publish.push_back("static:" + wake_url);
  }
  publish.push_back(dir);
  ExpectOk(RunStitch(publish), "publish FULL");
}

void RunOfR1::PublishDelta(int64_t version, const std::string& base,
                           const std::string& target) const {
  const std::string dir = (out / VersionDirName(version)).string();
  ExpectOk(RunStitch({"delta", "encode", "--base", base, "--target", target, "--out", dir,
                      "--version", std::to_string(version), "--base-version",
                      std::to_string(version - 1), "--run-id", "r1"}),
           "delta encode");
  ExpectOk(RunStitch({"publish", "--store", store, "--run-id", "r1", dir}), "publish DELTA");
}

bool ServesVersionOfR1(const std::string& url, int64_t version, std::chrono::milliseconds timeout) {
  return Eventually(
      [&] {
        FetchOptions options;
        options.timeout = std::chrono::seconds(30);
        auto r = HttpFetch("GET", url + "/server_info", {}, options);
        if (!r.ok() || r->status != 200) return false;
        auto s = ParseServerInfo(r->body);
        return s.ok() && s->ready && s->applied.has_value() && s->applied->version == version &&
               s->applied->run_id == "r1" && s->sync_state == SyncState::kIdle;
      },
      timeout);
}

}  // namespace stitch::testing

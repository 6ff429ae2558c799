// The chaos run's rollout client: constrained requests under load, through
// the gateway and directly to sidecars, each recorded in the history with
// the oracle's judgement of which weights produced its answer.
//
// `lanes` coroutines each send one request after another, drawn from a
// stream seeded by the run's seed: SGLang's /generate or OpenAI's
// /v1/completions, whole or streamed, with no constraint, a min_version
// (the pointer minus 0 to 2) or an exact_version (the pointer, sometimes
// the one before), some through the gateway with a session header, most 10
// tokens long and some 160 (so that more of them cross a commit). Answers are
// greedy, so the oracle can tell which weights produced them.
//
// Recovery probes run beside them: every `probe_every` one /generate with
// min_version = the pointer goes through the gateway, whether or not the
// previous one returned; the checker measures recovery with them.
//
// While "leaving" is set (the client_disconnect fault), a request's client
// goes away midway: a stream after its first bytes, a whole answer a few
// milliseconds after it was sent.
//
// Everything runs on one event loop; judging and writing the history on a
// worker thread.
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"

#include "stitch/chaos/history.h"
#include "stitch/chaos/judge.h"
#include "stitch/chaos/oracle.h"

namespace stitch {

// What came back for one request, before it is read.
struct Reply {
  int status = 0;     // 0: none (the call failed)
  std::string error;  // the call's failure
  bool timed_out = false;
  bool left = false;  // the client left before the end, on purpose
  bool stream = false;
  bool event_stream = false;        // the answer was text/event-stream
  std::string replica;              // X-Stitch-Replica: the sidecar the gateway relayed to
  std::string body;                 // a whole answer
  std::vector<std::string> events;  // a stream's data fields, in order
  bool cut = false;                 // the stream broke off (no proper end of body)
};

// Reads `reply` to a request of `record.route` into `record`: its status,
// outcome, error, stamps and output (tokens for "generate", text for
// "completions", and its token_ids when the engine gave them). Outcomes: kClientLeft when the
// client left; kRetryable for a 409, a 429, a 503, a failed call, a stream cut short or ended by an
// error event; kAnswered for a 200 whose answer (every event of a stream)
// is stamped with weight_version_start and _end, the start constant and the
// end never decreasing; kFailed for anything else, saying why.
void ReadReply(const Reply& reply, RequestRecord& record);

// Reads an answer's weight_version_spans (JSON text) stamped [start, end]:
// [offset, version] pairs whose offsets and versions both rise, every
// version within the stamps. InvalidArgument saying what is wrong.
[[nodiscard]] absl::StatusOr<VersionSpans> ParseSpans(std::string_view text, int64_t start,
                                                      int64_t end);

struct RolloutLoadOptions {
  int lanes = 4;
  uint64_t seed = 0;
  int replicas = 3;
  std::chrono::milliseconds pause{10};     // between two requests of a lane
  std::chrono::milliseconds backoff{100};  // after a request that was not answered
  std::chrono::milliseconds probe_every{250};
  int max_probes_in_flight = 32;
  // No answer within this long is a failure: every answer should come.
  std::chrono::milliseconds timeout{60000};
  std::string session_header = "X-Session-Id";
  std::string auth_token;  // sent as "Authorization: Bearer ..." when set
  // Empty: each request draws SGLang's /generate or OpenAI's
  // /v1/completions. "generate" or "completions": every request and probe
  // uses that one (a fleet with a real engine that serves only one of them).
  std::string route;
  // /v1/completions asks for the output's token ids too (vLLM's
  // return_token_ids), for the transformers judge.
  bool return_token_ids = false;
};

class RolloutLoad {
 public:
  struct Targets {
    std::function<std::string()> gateway;
    std::function<std::string(int)> sidecar;
    std::function<int64_t()> pointer;  // the pointer as the harness knows it
    std::function<double()> now;       // the run's clock, seconds
    // The answers replica `judged_replica` served (straight, or relayed by
    // the gateway) are judged by `judge` instead of the oracle: a real
    // engine's, which the reference engine's numbers do not explain.
    ExternalJudge* judge = nullptr;
    int judged_replica = -1;
  };

  // `oracle` and `history` must outlive the load.
  RolloutLoad(RolloutLoadOptions options, Oracle& oracle, HistoryWriter& history, Targets targets);
  // StopLoad(), StopProbes().
  ~RolloutLoad();
  RolloutLoad(const RolloutLoad&) = delete;
  RolloutLoad& operator=(const RolloutLoad&) = delete;

  // Starts the lanes and the probes.
  void Start();
  // No new requests; returns once every lane's request ended.
  void StopLoad();
  // No new probes; returns once every probe ended.
  void StopProbes();
  void SetLeaving(bool leaving) { leaving_.store(leaving); }

  int64_t sent() const { return next_id_.load(); }

  struct Impl;

 private:
  std::unique_ptr<Impl> impl_;
  std::atomic<bool> leaving_{false};
  std::atomic<int64_t> next_id_{0};
};

}  // namespace stitch

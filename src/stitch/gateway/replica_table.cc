#include "stitch/gateway/replica_table.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <utility>
#include <variant>
#include <vector>

#include <boost/asio/experimental/awaitable_operators.hpp>

#include "absl/strings/str_cat.h"
#include "stitch/api/replica_client.h"
#include "stitch/net/event_loop.h"
#include "stitch/net/loop_signal.h"

namespace stitch {

using boost::asio::awaitable;
using namespace boost::asio::experimental::awaitable_operators;

namespace {

// How often the stall watch looks, as a fraction of the stall timeout: a
// stall is seen between 1 and 1.2 stall timeouts after the quiet began.
constexpr int kWatchTicksPerStall = 5;

}  // namespace

// Counts a background task as ended when its coroutine ends, however it ends.
class ReplicaTable::TaskScope {
 public:
  explicit TaskScope(ReplicaTable* table) : table_(table) {}
  ~TaskScope() { table_->TaskEnded(); }
  TaskScope(const TaskScope&) = delete;
  TaskScope& operator=(const TaskScope&) = delete;

 private:
  ReplicaTable* table_;
};

// Counts a request as waiting for the fleet while it lives.
class ReplicaTable::WaitScope {
 public:
  explicit WaitScope(ReplicaTable* table) : table_(table) {
    if (++table_->waiting_ == 1) table_->poll_now_->NotifyAll();  // poll faster from now on
  }
  ~WaitScope() { --table_->waiting_; }
  WaitScope(const WaitScope&) = delete;
  WaitScope& operator=(const WaitScope&) = delete;

 private:
  ReplicaTable* table_;
};

ReplicaTable::ReplicaTable(boost::asio::any_io_executor executor, Pool& pool, WorkerPool& workers,
                           HttpClient& client, Clock& clock, ReplicaTableOptions options)
    : executor_(executor),
      pool_(pool),
      workers_(workers),
      client_(client),
      clock_(clock),
      options_(options),
      history_(clock),
      changed_(std::make_unique<LoopSignal>(executor)),
      poll_now_(std::make_unique<LoopSignal>(executor)),
      stop_(std::make_unique<LoopSignal>(executor)),
      idle_(std::make_unique<LoopSignal>(executor)) {}

ReplicaTable::~ReplicaTable() = default;

void ReplicaTable::Start() {
  StartTask(PollLoop());
  if (options_.stall_timeout > std::chrono::milliseconds::zero()) StartTask(WatchStalls());
}

void ReplicaTable::Stop() {
  stopping_ = true;
  stop_->NotifyAll();
  poll_now_->NotifyAll();
  changed_->NotifyAll();
}

awaitable<void> ReplicaTable::Stopped() {
  while (tasks_ > 0) co_await idle_->Wait();
}

void ReplicaTable::StartTask(awaitable<void> task) {
  ++tasks_;
  Spawn(executor_, std::move(task));
}

void ReplicaTable::TaskEnded() {
  if (--tasks_ == 0) idle_->NotifyAll();
}

void ReplicaTable::Changed() {
  dirty_ = true;
  changed_->NotifyAll();
}

const RoutingIndex& ReplicaTable::index() {
  if (dirty_) {
    dirty_ = false;
    index_.Rebuild(replicas_);
  }
  return index_;
}

// --- outstanding requests and progress ---------------------------------------

void ReplicaTable::Begin(ReplicaEntry& r) {
  if (r.in_flight++ == 0) {
    r.last_progress = clock_.Now();  // a busy spell begins: its quiet counts from now
    if (r.stalled) Changed();        // its one request at a time is taken
  }
}

void ReplicaTable::End(ReplicaEntry& r) {
  if (--r.in_flight == 0 && r.stalled) Changed();
}

void ReplicaTable::Progress(ReplicaEntry& r) {
  r.last_progress = clock_.Now();
  if (r.stalled) {
    r.stalled = false;
    spdlog::info("gateway: replica {} answers again; it takes new requests", r.url);
    history_.Observe(r);
    Changed();
  }
}

awaitable<void> ReplicaTable::WatchStalls() {
  const TaskScope task(this);
  const auto period = std::max<Clock::Duration>(options_.stall_timeout / kWatchTicksPerStall,
                                                std::chrono::milliseconds(1));
  Clock::TimePoint next = clock_.Now() + period;
  while (!stopping_) {
    auto sleep = clock_.SleepUntil(next);
    auto stop = stop_->Wait();
    (void)co_await (std::move(sleep) || std::move(stop));
    if (stopping_) break;
    const Clock::TimePoint now = clock_.Now();
    CheckStalls(now);
    next += period;
    if (next <= now) next = now + period;
  }
}

void ReplicaTable::CheckStalls(Clock::TimePoint now) {
  for (auto& [url, r] : replicas_) {
    if (r->in_flight == 0 || r->stalled || !r->routable()) continue;
    const Clock::Duration quiet = now - r->last_progress;
    if (quiet < options_.stall_timeout) continue;
    r->stalled = true;
    ++counters_.stalls;
    spdlog::warn(
        "gateway: replica {} sent nothing for {:.1f} s with {} requests outstanding; new "
        "requests go to other replicas until it answers",
        r->url, std::chrono::duration<double>(quiet).count(), r->in_flight);
    history_.Observe(*r);
    Changed();
  }
}

// --- learning -----------------------------------------------------------------

void ReplicaTable::MarkFailed(ReplicaEntry& r, std::string why, Reachability reach) {
  r.last_error = std::move(why);
  if (reach == Reachability::kUnreachable) r.reachable = false;
  if (r.state.ready) {
    r.state.ready = false;
    Changed();
  }
  history_.Observe(r);
}

void ReplicaTable::LearnApplied(ReplicaEntry& r, const VersionRef& applied) {
  if (r.state.applied == applied) return;
  r.state.applied = applied;
  history_.Observe(r);
  Changed();
}

void ReplicaTable::LearnVersion(ReplicaEntry& r, int64_t version) {
  if (r.state.applied.has_value() && r.state.applied->version == version) return;
  if (r.state.applied.has_value()) {
    r.state.applied->version = version;
  } else {
    r.state.applied = VersionRef{"", version};
  }
  history_.Observe(r);
  Changed();
}

// --- discovery and probing ------------------------------------------------------

awaitable<void> ReplicaTable::PollLoop() {
  const TaskScope task(this);
  while (!stopping_) {
    const Clock::TimePoint started = clock_.Now();
    co_await PollOnce();
    if (stopping_) break;
    // A replica idle in its backoff finds a version published after the
    // wait began only when woken: keep waking while anyone waits.
    if (waiting_ > 0) Wake();
    const auto interval = waiting_ == 0
                              ? options_.poll_interval
                              : std::min(options_.poll_interval, options_.waiting_poll_interval);
    // From the poll's start, so that time that passed while it ran counts.
    auto sleep = clock_.SleepUntil(started + interval);
    auto nudge = poll_now_->Wait();
    (void)co_await (std::move(sleep) || std::move(nudge));
  }
}

awaitable<void> ReplicaTable::PollOnce() {
  Pool* p = &pool_;
  absl::StatusOr<std::vector<std::string>> urls =
      co_await RunBlocking(workers_, [p] { return p->Discover(); });
  if (stopping_) co_return;
  if (!urls.ok()) {
    std::string message(urls.status().message());
    if (message != last_discover_error_) {
      spdlog::warn("gateway: discovering {}: {}; keeping the replicas known so far", pool_.spec(),
                   message);
      last_discover_error_ = message;
    }
  } else {
    last_discover_error_.clear();
    ReplicaMap next;
    for (const std::string& url : *urls) {
      auto it = replicas_.find(url);
      if (it != replicas_.end()) {
        next.emplace(url, it->second);
        continue;
      }
      absl::StatusOr<ReplicaEndpoint> endpoint = ReplicaEndpoint::Parse(url);
      if (!endpoint.ok()) {
        spdlog::warn("gateway: skipping replica {}: {}", url,
                     std::string(endpoint.status().message()));
        continue;
      }
      auto r = std::make_shared<ReplicaEntry>();
      r->url = url;
      r->endpoint = *std::move(endpoint);
      r->last_error = "not probed yet";
      next.emplace(url, std::move(r));
    }
    for (auto& [url, r] : replicas_) {
      if (!next.contains(url)) {
        r->discovered = false;
        history_.Gone(url);
      }
    }
    if (next.size() != replicas_.size() ||
        !std::equal(next.begin(), next.end(), replicas_.begin(),
                    [](const auto& a, const auto& b) { return a.first == b.first; })) {
      replicas_ = std::move(next);
      Changed();
    }
  }
  history_.Sample(replicas_);
  for (auto& [url, r] : replicas_) {
    if (r->probing) continue;
    r->probing = true;
    StartTask(Probe(r));
  }
}

awaitable<void> ReplicaTable::Probe(ReplicaPtr r) {
  const TaskScope task(this);
  const Clock::TimePoint deadline = clock_.Now() + options_.probe_timeout;
  CallOptions call;
  auto fetch = FetchServerInfo(client_, r->endpoint, call, options_.bearer_token);
  auto timeout = clock_.SleepUntil(deadline);
  auto stop = stop_->Wait();
  std::variant<absl::StatusOr<ReplicaState>, std::monostate, bool> outcome =
      co_await (std::move(fetch) || std::move(timeout) || std::move(stop));
  r->probing = false;
  if (stopping_ || outcome.index() == 2) co_return;
  absl::StatusOr<ReplicaState> state =
      outcome.index() == 0
          ? std::get<0>(std::move(outcome))
          : absl::DeadlineExceededError(absl::StrCat(
                "GET ", r->url, "/server_info: no answer within ",
                std::chrono::duration_cast<std::chrono::milliseconds>(options_.probe_timeout)
                    .count(),
                " ms"));
  if (state.ok()) {
    const bool changed = !r->reachable || r->state.ready != state->ready ||
                         r->state.applied != state->applied || r->state.pointer != state->pointer ||
                         r->state.held != state->held;
    r->reachable = true;
    r->state = *std::move(state);
    r->last_error = r->state.ready ? "" : r->state.reason;
    history_.Observe(*r);
    if (changed) Changed();
    co_return;
  }
  const bool was_routable = r->routable();
  r->reachable = false;
  r->state.ready = false;
  r->last_error = std::string(state.status().message());
  history_.Observe(*r);
  if (was_routable) Changed();
}

// --- waiting for the fleet --------------------------------------------------------

void ReplicaTable::Wake() {
  if (wake_running_ || stopping_) return;
  const Clock::TimePoint now = clock_.Now();
  if (last_wake_.has_value() && now - *last_wake_ < options_.waiting_wake_interval) return;
  last_wake_ = now;
  wake_running_ = true;
  ++counters_.wakes;
  StartTask(RunWake());
}

awaitable<void> ReplicaTable::RunWake() {
  const TaskScope task(this);
  Pool* p = &pool_;
  const int woke = co_await RunBlocking(workers_, [p] { return p->Wake(); });
  (void)woke;
  wake_running_ = false;
  // Look at the replicas now rather than at the next poll.
  if (!stopping_) poll_now_->NotifyAll();
}

awaitable<absl::Status> ReplicaTable::WaitForChange(Clock::TimePoint deadline) {
  if (stopping_) co_return absl::OkStatus();
  const WaitScope waiting(this);
  auto sleep = clock_.SleepUntil(deadline);
  auto change = changed_->Wait();
  (void)co_await (std::move(sleep) || std::move(change));
  co_return absl::OkStatus();
}

PoolState ReplicaTable::Snapshot() const {
  PoolState state;
  state.replicas.reserve(replicas_.size());
  for (const auto& [url, r] : replicas_) {
    ReplicaStatus s;
    s.url = url;
    s.reachable = r->reachable;
    s.state = r->state;
    s.in_flight = r->in_flight;
    s.stalled = r->stalled;
    s.last_error = r->stalled ? "stalled: requests outstanding and nothing received from it; "
                                "new requests go to other replicas until it answers"
                              : r->last_error;
    state.replicas.push_back(std::move(s));
  }
  return state;
}

}  // namespace stitch

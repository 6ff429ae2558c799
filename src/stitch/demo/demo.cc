#include "stitch/demo/demo.h"

#include <stdlib.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <thread>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "absl/time/time.h"
#include "stitch/core/version.h"
#include "stitch/demo/base_model.h"
#include "stitch/demo/batch.h"
#include "stitch/demo/console.h"
#include "stitch/demo/fleet.h"
#include "stitch/demo/policy_gradient.h"
#include "stitch/demo/publisher.h"
#include "stitch/demo/report.h"
#include "stitch/demo/rollout.h"
#include "stitch/demo/rollout_dispatcher.h"
#include "stitch/demo/supervisor.h"
#include "stitch/format/safetensors.h"
#include "stitch/pool/pool.h"
#include "stitch/publish/claim.h"
#include "stitch/refengine/tokenizer.h"
#include "stitch/refengine/weights.h"
#include "stitch/store/fs_store.h"

namespace stitch {
namespace {

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

constexpr int kExitFailed = 1;
constexpr int kExitInterrupted = 130;
constexpr const char* kRunId = "demo";
// Completions the report shows per sampled step (one per prompt).
constexpr size_t kSamplesPerStep = 3;
constexpr auto kConvergeTimeout = std::chrono::seconds(30);

// Prompts the policy continues; the task does not depend on them, but
// different contexts make the policy learn the target bytes rather than one
// continuation.
constexpr const char* kPrompts[] = {
    "Once upon a time", "The trainer said:", "Rollout #",       "stitch> ",
    "Version 7 of the", "hello, fleet",      "RL on a laptop:", "The replica",
    "A delta is",       "// TODO:",          "Dear reviewer,",  "42 + 17 =",
    "In the beginning", "GET /generate",     "fn main() {",     "Quick brown fox",
};

// --- output -------------------------------------------------------------------

std::string FleetText(const std::vector<ReplicaView>& views) {
  std::string s;
  for (const ReplicaView& v : views) {
    absl::StrAppend(&s, s.empty() ? "" : "  ", v.name, " ",
                    v.applied >= 0 ? absl::StrCat("v", v.applied) : "v-", " ", v.state);
  }
  return s;
}

// What runs the replicas, for the console and the report.
std::string EnginesText(const DemoOptions& options) {
  const std::string api(EngineApiName(options.engine_api));
  if (options.engine_command.empty()) {
    return absl::StrCat("stitch engine --api ", api, " (the reference engine)");
  }
  return absl::StrCat(api, " API, started by --engine-cmd ", options.engine_command);
}

// --- set-up -------------------------------------------------------------------

absl::StatusOr<fs::path> PrepareDir(const std::string& requested) {
  if (requested.empty()) {
    std::string pattern = (fs::temp_directory_path() / "stitch-demo-XXXXXX").string();
    if (::mkdtemp(pattern.data()) == nullptr) {
      return absl::InternalError(absl::StrCat("demo: cannot create a directory under ",
                                              fs::temp_directory_path().string(),
                                              "; give one with --dir"));
    }
    return fs::path(pattern);
  }
  std::error_code ec;
  fs::path dir = fs::absolute(requested, ec);
  fs::create_directories(dir, ec);
  if (ec) {
    return absl::InvalidArgumentError(
        absl::StrCat("demo: cannot create --dir ", requested, ": ", ec.message()));
  }
  if (!fs::is_empty(dir, ec) || ec) {
    return absl::InvalidArgumentError(
        absl::StrCat("demo: --dir ", requested, " is not empty; give a new or empty directory"));
  }
  return dir;
}

std::vector<TensorView> ViewsOf(const std::vector<HostTensor>& tensors) {
  std::vector<TensorView> out;
  for (const HostTensor& t : tensors) out.push_back(t.view());
  return out;
}

std::vector<HostTensor> CopyTensors(std::span<const TensorView> views) {
  std::vector<HostTensor> out;
  for (const TensorView& t : views) {
    HostTensor copy;
    copy.name = std::string(t.name);
    copy.dtype = t.dtype;
    copy.shape.assign(t.shape.begin(), t.shape.end());
    copy.data.assign(t.data.begin(), t.data.end());
    out.push_back(std::move(copy));
  }
  return out;
}

std::string Decode(const std::vector<int32_t>& ids) {
  std::string bytes;
  for (int32_t id : ids) {
    if (id >= 0 && id < 256) bytes += static_cast<char>(id);
  }
  return PrintableBytes(bytes);
}

int Fail(const absl::Status& status) {
  std::cerr << "stitch: " << status.message() << std::endl;
  return kExitFailed;
}

// --- the run ------------------------------------------------------------------

class Demo {
 public:
  Demo(const DemoOptions& options, const std::atomic<bool>& stop)
      : options_(options), stop_(stop), epoch_(Clock::now()) {}

  int Run();

 private:
  double Now() const { return std::chrono::duration<double>(Clock::now() - epoch_).count(); }
  absl::Status SetUp();
  absl::Status StartFleet(const fs::path& base);
  absl::Status Train();
  // The steps of one training step: what the ticker shows, the replica that
  // joins or is killed at its step, learning from the batch, publishing.
  void SetPhase(int64_t step, std::string what, std::shared_ptr<PendingBatch> batch);
  absl::Status JoinOrKill(int64_t step);
  absl::Status AwaitJoined();
  absl::StatusOr<BatchStats> Learn(int64_t step, const PendingBatch& pending,
                                   const std::vector<GeneratedRollout>& generated);
  absl::Status Publish(int64_t step, StepPublisher& publisher,
                       const std::vector<GeneratedRollout>& generated, const BatchStats& stats,
                       int64_t min_version);
  std::vector<RolloutRequest> Requests(int64_t step, int64_t latest);
  void Ticker();
  void NoteTransitions();
  int Finish();
  void Keep();

  const DemoOptions& options_;
  const std::atomic<bool>& stop_;
  const Clock::time_point epoch_;
  DemoConsole console_;
  fs::path dir_;
  ProcessSupervisor supervisor_;
  std::unique_ptr<FsStore> store_;
  std::unique_ptr<LocalFleet> fleet_;
  std::unique_ptr<Pool> wake_pool_;
  std::unique_ptr<LmHeadTrainer> trainer_;
  std::unique_ptr<RolloutDispatcher> dispatcher_;
  std::vector<HostTensor> previous_;  // the latest published version's tensors
  DemoRecord record_;
  ByteSet targets_;
  std::map<std::string, bool> seen_ready_;
  double join_started_at_ = 0;

  // What the ticker shows for the step in progress.
  absl::Mutex progress_mu_;
  int64_t progress_step_ ABSL_GUARDED_BY(progress_mu_) = 0;
  std::string progress_phase_ ABSL_GUARDED_BY(progress_mu_);
  std::shared_ptr<PendingBatch> progress_batch_ ABSL_GUARDED_BY(progress_mu_);
  double last_reward_ ABSL_GUARDED_BY(progress_mu_) = -1;
  std::atomic<bool> ticker_stop_{false};
};

absl::Status Demo::SetUp() {
  auto dir = PrepareDir(options_.dir);
  if (!dir.ok()) return dir.status();
  dir_ = *dir;
  const fs::path logs = dir_ / "logs";
  fs::create_directories(logs);
  console_.Line(absl::StrCat("stitch demo: ", options_.replicas, " replicas, ", options_.steps,
                             " steps, lag ", options_.lag, "; working in ", dir_.string(),
                             " (process logs in logs/)"));
  console_.Line(absl::StrCat("stitch demo: engines: ", record_.engines));

  const fs::path base = dir_ / "base";
  BaseModelOptions base_options;
  base_options.hidden = options_.model_hidden;
  base_options.layers = options_.model_layers;
  base_options.seed = options_.seed;
  base_options.dtype = options_.model_dtype;
  auto loaded = MakeBaseModel(supervisor_, base_options, base, logs / "init-model.log");
  if (!loaded.ok()) return loaded.status();
  TrainerOptions trainer_options;
  trainer_options.learning_rate = options_.learning_rate;
  trainer_options.entropy_bonus = options_.entropy_bonus;
  trainer_options.entropy_floor = options_.entropy_floor;
  auto trainer = LmHeadTrainer::Create(loaded->config, loaded->tensors, trainer_options);
  if (!trainer.ok()) return trainer.status();
  trainer_ = *std::move(trainer);
  previous_ = std::move(loaded->tensors);

  // The trainer owns the run: it claims it at the boot version before any
  // replica starts following the store.
  auto store = FsStore::Open(dir_ / "store", kRunId);
  if (!store.ok()) return store.status();
  store_ = *std::move(store);
  auto claimed = ClaimRun(*store_, 0, nullptr);
  if (!claimed.ok()) return claimed.status();

  return StartFleet(base);
}

absl::Status Demo::StartFleet(const fs::path& base) {
  FleetOptions fleet;
  fleet.dir = dir_;
  fleet.store = (dir_ / "store").string();
  fleet.run_id = kRunId;
  fleet.base_checkpoint = base;
  fleet.api = options_.engine_api;
  fleet.engine_command = options_.engine_command;
  fleet.ready_timeout =
      std::chrono::milliseconds(static_cast<int64_t>(options_.engine_start_timeout_s * 1000));
  fleet_ = std::make_unique<LocalFleet>(supervisor_, fleet, epoch_, &stop_);
  for (int i = 0; i < options_.replicas; ++i) {
    auto name = fleet_->StartReplica(false);
    if (!name.ok()) return name.status();
  }
  if (absl::Status s = fleet_->StartGateway(); !s.ok()) return s;
  console_.Line(absl::StrCat("stitch demo: gateway ", fleet_->gateway_url(),
                             " over file:", fleet_->pool_file().string()));
  console_.Line(absl::StrCat("stitch demo: dashboard ", fleet_->gateway_url(),
                             "/ui (open it in a browser while the demo runs; --keep keeps it up)"));
  if (!options_.engine_command.empty()) {
    console_.Line(absl::StrFormat(
        "stitch demo: waiting up to %.0f s for the engines to start and the replicas to catch up "
        "(logs/engine-r*.log)",
        options_.engine_start_timeout_s));
  }
  if (absl::Status s = fleet_->WaitReady(options_.replicas); !s.ok()) return s;
  for (const ReplicaView& v : fleet_->Views()) seen_ready_[v.name] = v.ready;
  console_.Line(absl::StrFormat("stitch demo: %d replicas ready at v%d after %.1f s: %s",
                                options_.replicas, 0, Now(), FleetText(fleet_->Views())));
  auto pool = MakePool(absl::StrCat("file:", fleet_->pool_file().string()));
  if (!pool.ok()) return pool.status();
  wake_pool_ = *std::move(pool);
  return absl::OkStatus();
}

std::vector<RolloutRequest> Demo::Requests(int64_t step, int64_t latest) {
  std::vector<RolloutRequest> out;
  const int64_t min_version = std::max<int64_t>(0, latest - options_.lag);
  constexpr int kPromptCount = sizeof(kPrompts) / sizeof(kPrompts[0]);
  for (int p = 0; p < options_.prompts_per_step; ++p) {
    const char* text = kPrompts[(step * options_.prompts_per_step + p) % kPromptCount];
    for (int g = 0; g < options_.group_size; ++g) {
      RolloutRequest r;
      r.prompt = EncodeText(text, BosMode::kPrepend);
      r.max_new_tokens = options_.max_new_tokens;
      r.temperature = 1.0;
      r.seed = options_.seed * 1000003 + static_cast<uint64_t>(step) * 1009 +
               static_cast<uint64_t>(p * options_.group_size + g);
      r.min_version = min_version;
      out.push_back(std::move(r));
    }
  }
  return out;
}

void Demo::NoteTransitions() {
  for (const ReplicaView& v : fleet_->Views()) {
    bool& seen = seen_ready_[v.name];
    if (v.ready && !seen) {
      seen = true;
      console_.Line(
          absl::StrFormat("stitch demo: join: %s caught up to v%d in %.1f s and entered rotation",
                          v.name, v.applied, Now() - join_started_at_));
    }
  }
}

void Demo::Ticker() {
  while (!ticker_stop_.load()) {
    std::string line;
    {
      absl::MutexLock lock(&progress_mu_);
      int done = 0;
      int total = 0;
      if (PendingBatch* batch = progress_batch_.get(); batch != nullptr) {
        absl::MutexLock batch_lock(&batch->mu);
        total = static_cast<int>(batch->results.size());
        done = total - batch->remaining;
      }
      line = absl::StrFormat("step %d/%d  %s", progress_step_, options_.steps, progress_phase_);
      if (total > 0) absl::StrAppendFormat(&line, " %d/%d", done, total);
      if (last_reward_ >= 0) absl::StrAppendFormat(&line, "  reward %.3f", last_reward_);
    }
    console_.Live(absl::StrCat(line, " | ", FleetText(fleet_->Views())));
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  }
}

void Demo::SetPhase(int64_t step, std::string what, std::shared_ptr<PendingBatch> batch) {
  absl::MutexLock lock(&progress_mu_);
  progress_step_ = step;
  progress_phase_ = std::move(what);
  progress_batch_ = std::move(batch);
}

absl::Status Demo::AwaitJoined() {
  // The fleet never shrinks below its starting size: the kill waits for the
  // joining replica to be in rotation. A reference engine joins within a
  // step or two; a real engine takes a minute or more to start.
  const std::string joiner = absl::StrCat("r", options_.replicas);
  for (const ReplicaView& v : fleet_->Views()) {
    if (v.name == joiner && v.ready) return absl::OkStatus();
  }
  console_.Line(absl::StrFormat(
      "stitch demo: kill: waiting for %s to enter rotation first (the fleet keeps %d replicas)",
      joiner, options_.replicas));
  {
    absl::MutexLock lock(&progress_mu_);
    progress_phase_ = absl::StrCat("waiting for ", joiner);
  }
  if (absl::Status s = fleet_->WaitJoinedReady(); !s.ok()) return s;
  NoteTransitions();
  return absl::OkStatus();
}

absl::Status Demo::JoinOrKill(int64_t step) {
  const int64_t steps = options_.steps;
  const int64_t join_step = std::max<int64_t>(1, steps / 3);
  const int64_t kill_step = std::max<int64_t>(join_step + 1, 2 * steps / 3);
  const std::string victim = "r1";
  if (step == join_step) {
    console_.Line(absl::StrFormat(
        "stitch demo: join: starting replica r%d at step %d (it enters rotation once caught "
        "up)",
        options_.replicas, step));
    join_started_at_ = Now();
    fleet_->StartReplicaInBackground();
  }
  if (step == kill_step) {
    if (absl::Status s = AwaitJoined(); !s.ok()) return s;
    if (absl::Status s = fleet_->Kill(victim); !s.ok()) return s;
    console_.Line(absl::StrFormat(
        "stitch demo: kill: SIGKILL to replica %s (its engine's and its sidecar's process "
        "groups) at step %d; traffic continues on the others",
        victim, step));
  }
  if (std::optional<absl::Status> e = fleet_->BackgroundError(); e.has_value()) return *e;
  return absl::OkStatus();
}

absl::StatusOr<BatchStats> Demo::Learn(int64_t step, const PendingBatch& pending,
                                       const std::vector<GeneratedRollout>& generated) {
  BatchStats stats;
  // A batch was launched one step before the trainer learns from it, so
  // behaviour policies up to lag + 1 versions old are expected.
  std::vector<Rollout> batch = BuildBatch(pending.prompts, generated, options_.group_size, targets_,
                                          step - 1, options_.lag + 1, &stats);
  auto trained = trainer_->Step(batch, options_.epochs);
  if (!trained.ok()) return trained.status();
  return stats;
}

absl::Status Demo::Publish(int64_t step, StepPublisher& publisher,
                           const std::vector<GeneratedRollout>& generated, const BatchStats& stats,
                           int64_t min_version) {
  const double publish_start = Now();
  auto published = publisher.Publish(step, ViewsOf(previous_), trainer_->Tensors());
  if (!published.ok()) return published.status();
  const double published_at = Now();
  wake_pool_->Wake();
  previous_ = CopyTensors(trainer_->Tensors());

  DemoStep s;
  s.step = step;
  s.version = step;
  s.full = published->kind == PublishedKind::kFull;
  s.payload_bytes = published->payload_bytes;
  s.published_at = published_at;
  s.publish_s = published_at - publish_start;
  s.mean_reward = stats.mean_reward;
  s.rollouts = static_cast<int64_t>(generated.size());
  s.dropped = stats.dropped;
  s.crossed = stats.crossed;
  s.crossed_exact = stats.crossed_exact;
  record_.steps.push_back(s);
  const int64_t steps = options_.steps;
  if (step == 1 || step == (steps + 1) / 2 || step == steps) {
    std::vector<std::string> texts;
    const auto group = static_cast<size_t>(options_.group_size);
    for (size_t i = 0; i < generated.size() && texts.size() < kSamplesPerStep; i += group) {
      texts.push_back(Decode(generated[i].output_ids));
    }
    record_.samples.emplace_back(step, std::move(texts));
  }
  {
    absl::MutexLock lock(&progress_mu_);
    last_reward_ = stats.mean_reward;
  }
  NoteTransitions();
  console_.Commit(
      absl::StrFormat("step %2d/%d  published v%d %-5s %8s  reward %.3f  min_version %d | %s", step,
                      steps, step, s.full ? "FULL" : "DELTA",
                      absl::StrFormat("%.1fKiB", static_cast<double>(s.payload_bytes) / 1024),
                      s.mean_reward, min_version, FleetText(fleet_->Views())));
  return absl::OkStatus();
}

absl::Status Demo::Train() {
  // Owned by the demo, not this function: on an interrupt its threads may
  // still wait on requests, which end only once the fleet is stopped.
  dispatcher_ = std::make_unique<RolloutDispatcher>(
      fleet_->gateway_url(), options_.engine_api, [this] { return Now(); }, &stop_);
  RolloutDispatcher& dispatcher = *dispatcher_;
  const int64_t steps = options_.steps;
  StepPublisher publisher(*store_, dir_ / "publish", options_.anchor_every);
  int64_t latest = 0;

  std::thread ticker;
  if (console_.tty()) ticker = std::thread([this] { Ticker(); });
  struct StopTicker {
    Demo* demo;
    std::thread* thread;
    ~StopTicker() {
      demo->ticker_stop_.store(true);
      if (thread->joinable()) thread->join();
    }
  } stop_ticker{this, &ticker};

  std::shared_ptr<PendingBatch> pending = dispatcher.Launch(Requests(1, latest));
  for (int64_t step = 1; step <= steps; ++step) {
    SetPhase(step, "rollouts", pending);
    auto outcomes = dispatcher.Wait(*pending);
    if (!outcomes.ok()) return outcomes.status();
    // The next step's rollouts go out now, on whatever the fleet serves,
    // while this step trains and publishes: one step off-policy.
    std::shared_ptr<PendingBatch> next;
    if (step < steps) next = dispatcher.Launch(Requests(step + 1, latest));
    if (absl::Status s = JoinOrKill(step); !s.ok()) return s;

    SetPhase(step, "training", next);
    std::vector<GeneratedRollout> generated;
    for (RolloutOutcome& o : *outcomes) {
      record_.responses.push_back(o.response);
      generated.push_back(std::move(o.generated));
    }
    absl::StatusOr<BatchStats> stats = Learn(step, *pending, generated);
    if (!stats.ok()) return stats.status();

    SetPhase(step, "publishing", next);
    if (absl::Status s = Publish(step, publisher, generated, *stats, pending->min_version);
        !s.ok()) {
      return s;
    }
    latest = step;
    if (stop_.load()) return absl::CancelledError("demo: interrupted");
    pending = std::move(next);
  }
  return absl::OkStatus();
}

int Demo::Finish() {
  const int64_t final_version = record_.final_version();
  if (!fleet_->WaitConverged(final_version, kConvergeTimeout)) {
    console_.Line(absl::StrFormat(
        "stitch demo: not every replica reached v%d within %d s", final_version,
        std::chrono::duration_cast<std::chrono::seconds>(kConvergeTimeout).count()));
  }
  NoteTransitions();
  record_.gateway_retries = fleet_->GatewayRetries();
  record_.client_retries = dispatcher_->retries();
  record_.replicas = fleet_->Finish();
  record_.wall_s = Now();

  std::set<int64_t> store_versions;
  for (const DemoStep& s : record_.steps) {
    if (store_->ReadManifest(s.version).ok()) store_versions.insert(s.version);
  }
  DemoSummary summary = Summarize(record_);
  std::vector<std::string> failures =
      CheckDemo(record_, summary, store_versions, options_.min_improvement);
  auto pointer = store_->ReadPointer();
  if (!pointer.ok() || !pointer->has_value() || (*pointer)->version != final_version) {
    failures.push_back(
        absl::StrCat("the store's pointer is not at the final version v", final_version));
  }
  console_.Line(FormatSummary(record_, summary, failures));
  const fs::path report = dir_ / "report.html";
  {
    std::ofstream out(report, std::ios::trunc);
    out << RenderHtmlReport(record_, summary, failures);
    if (!out) failures.push_back(absl::StrCat("cannot write ", report.string()));
  }
  console_.Line(absl::StrCat("report: ", report.string()));
  if (!failures.empty()) {
    std::cerr << "stitch: demo: " << failures.size() << " check(s) failed: " << failures.front()
              << std::endl;
  }
  return failures.empty() ? 0 : kExitFailed;
}

void Demo::Keep() {
  const std::string gateway = fleet_->gateway_url();
  const bool vllm = options_.engine_api == EngineApi::kVllm;
  const std::string sample_latest = absl::StrCat(
      vllm ? "/v1/completions -d '{\"prompt\": \"Once upon a time\", \"max_tokens\": 16"
           : "/generate -d '{\"text\": \"Once upon a time\", \"sampling_params\": "
             "{\"max_new_tokens\": 16}",
      ", \"weight_version\": {\"min_version\": ", record_.final_version(), "}}'");
  const std::string sample_pinned = absl::StrCat(
      vllm ? "/v1/completions -d '{\"prompt\": \"hi\"" : "/generate -d '{\"text\": \"hi\"",
      ", \"weight_version\": {\"exact_version\": 0}}'");
  std::error_code ec;
  fs::path self = fs::read_symlink("/proc/self/exe", ec);
  if (ec) self = "stitch";
  console_.Line(absl::StrCat(
      "\nThe fleet keeps running (--keep); Ctrl-C stops it.\n  gateway    ", gateway,
      "\n  dashboard  ", gateway, "/ui\n  store      ", (dir_ / "store").string(),
      "\n\nTry:\n  curl -s ", gateway, "/replicas\n  curl -s ", gateway, sample_latest,
      "\n  curl -s ", gateway, sample_pinned,
      "\n"
      "      # a 409 after the gateway's ",
      FleetOptions{}.gateway_admission_wait_s,
      " s admission wait: no replica serves v0 any more\n  curl -s ", gateway, "/metrics\n  ",
      self.string(), " status --gateway ", gateway, " --store ", (dir_ / "store").string(),
      "\n\nA PyTorch trainer can take over from here (examples/train_loop.py; needs torch):\n"
      "  python examples/train_loop.py --store ",
      (dir_ / "store").string(), " --gateway ", gateway,
      " --pool file:", fleet_->pool_file().string(), " --model ", (dir_ / "base").string()));
  while (!stop_.load()) std::this_thread::sleep_for(std::chrono::milliseconds(100));
}

int Demo::Run() {
  targets_ = MakeByteSet(options_.targets);
  record_.run_id = kRunId;
  record_.targets = options_.targets;
  record_.lag = options_.lag;
  record_.engines = EnginesText(options_);
  absl::Status status = SetUp();
  if (status.ok()) status = Train();
  int exit_code = 0;
  if (status.ok()) {
    exit_code = Finish();
    if (options_.keep && !stop_.load()) Keep();
  } else if (stop_.load()) {
    console_.Line("stitch demo: interrupted");
    exit_code = kExitInterrupted;
  } else {
    exit_code = Fail(status);
  }
  console_.Line("stitch demo: stopping the fleet");
  if (fleet_ != nullptr) fleet_->Finish();
  supervisor_.StopAll(std::chrono::seconds(5));
  dispatcher_.reset();
  return exit_code;
}

}  // namespace

int RunDemo(const DemoOptions& options, const std::atomic<bool>& stop) {
  Demo demo(options, stop);
  return demo.Run();
}

}  // namespace stitch

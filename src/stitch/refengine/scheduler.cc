#include "stitch/refengine/scheduler.h"

#include <algorithm>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/time/time.h"
#include "stitch/core/errors.h"

namespace stitch {

std::string_view PauseModeName(PauseMode mode) {
  switch (mode) {
    case PauseMode::kAbort:
      return "abort";
    case PauseMode::kRetract:
      return "retract";
    case PauseMode::kInPlace:
      return "in_place";
    case PauseMode::kWait:
      return "wait";
  }
  return "in_place";
}

absl::StatusOr<PauseMode> ParsePauseMode(std::string_view name) {
  if (name == "abort") return PauseMode::kAbort;
  if (name == "retract") return PauseMode::kRetract;
  if (name == "in_place") return PauseMode::kInPlace;
  return absl::InvalidArgumentError(absl::StrCat("unknown pause mode \"", AbslView(name),
                                                 "\"; use \"abort\", \"retract\" or \"in_place\""));
}

absl::Status SchedulerOptions::Validate() const {
  if (max_running < 1) return absl::InvalidArgumentError("max_running must be at least 1");
  if (max_queued < 0) return absl::InvalidArgumentError("max_queued must be >= 0");
  if (prefill_chunk < 0) return absl::InvalidArgumentError("prefill_chunk must be >= 0");
  if (idle_tick.count() <= 0) return absl::InvalidArgumentError("idle_tick must be positive");
  if (stall_timeout.count() <= 0) {
    return absl::InvalidArgumentError("stall_timeout must be positive");
  }
  if (!clock) return absl::InvalidArgumentError("clock must be set");
  return absl::OkStatus();
}

struct Scheduler::Entry {
  Entry(uint64_t id_in, GenerationRequest request_in, GenerationSink sink_in, Sequence sequence_in)
      : id(id_in),
        request(std::move(request_in)),
        sink(std::move(sink_in)),
        sequence(std::move(sequence_in)) {
    for (const std::string& s : request.stop) {
      if (!s.empty()) holdback = std::max(holdback, s.size() - 1);
    }
  }

  uint64_t id;
  GenerationRequest request;  // its prompt moved into `sequence`
  GenerationSink sink;
  Sequence sequence;
  TokenStreamDecoder decoder;
  std::string text;     // the output text so far (cut at a matched stop string)
  size_t emitted = 0;   // bytes of `text` already sent
  size_t holdback = 0;  // bytes a stop string might still claim: longest stop - 1
  bool finished = false;
  int64_t cached_tokens = 0;        // prompt tokens seeded from the prefix cache
  uint64_t swaps_at_admission = 0;  // weight_swaps_ when its cache began
};

Scheduler::Scheduler(std::shared_ptr<const ModelWeights> weights, VersionRef version,
                     SchedulerOptions options)
    : config_(weights->config()),
      options_(std::move(options)),
      version_(version),
      fingerprint_(weights->fingerprint()),
      heartbeat_(options_.clock()),
      weights_(std::move(weights)),
      serving_version_(std::move(version)) {
  thread_ = std::thread([this] { Run(); });
}

Scheduler::~Scheduler() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (options_.on_stopping) options_.on_stopping();
  thread_.join();
  // The thread is gone: this thread may now do its work. Commands posted
  // but not run still get their answers.
  std::vector<Command> commands;
  {
    absl::MutexLock lock(&mu_);
    commands.swap(commands_);
  }
  for (Command& c : commands) std::move(c)();
  AbortWhere([](const Entry&) { return true; }, "the engine is shutting down");
  if (drain_done_) std::exchange(drain_done_, nullptr)(drain_affected_);
}

absl::StatusOr<uint64_t> Scheduler::Submit(GenerationRequest request, GenerationSink sink) {
  absl::StatusOr<Sequence> sequence =
      Sequence::Create(config_, std::move(request.prompt), request.sampling);
  if (!sequence.ok()) return sequence.status();
  request.prompt.clear();
  if (request.max_new_tokens < 0) {
    return absl::InvalidArgumentError("max_new_tokens must be >= 0");
  }
  for (const std::string& s : request.stop) {
    if (s.empty()) return absl::InvalidArgumentError("stop strings must not be empty");
  }
  absl::MutexLock lock(&mu_);
  if (stopping_) return absl::UnavailableError("the engine is shutting down");
  const int64_t capacity = options_.max_running + options_.max_queued;
  const int64_t held = static_cast<int64_t>(waiting_.size()) + running_count_;
  if (held >= capacity) {
    return absl::UnavailableError(
        absl::StrCat("the engine is full: ", running_count_, " requests running and ",
                     waiting_.size(), " queued (--max-running ", options_.max_running,
                     ", --max-queued ", options_.max_queued, "); retry later"));
  }
  const uint64_t id = next_id_++;
  waiting_.push_back(
      std::make_unique<Entry>(id, std::move(request), std::move(sink), *std::move(sequence)));
  return id;
}

void Scheduler::Post(Command command) {
  absl::MutexLock lock(&mu_);
  commands_.push_back(std::move(command));
}

void Scheduler::Abort(uint64_t id) {
  Post([this, id] {
    AbortWhere([id](const Entry& e) { return e.id == id; }, "the client disconnected");
  });
}

void Scheduler::AbortMatching(AbortScope scope, std::string rid,
                              absl::AnyInvocable<void(int64_t) &&> done) {
  Post([this, scope, rid = std::move(rid), done = std::move(done)]() mutable {
    std::string message =
        scope == AbortScope::kAll
            ? std::string("aborted by /abort_request (abort_all)")
            : absl::StrCat("aborted by ",
                           scope == AbortScope::kRidExact ? "/abort_requests" : "/abort_request",
                           " (rid \"", rid, "\")");
    const int64_t n = AbortWhere(
        [&](const Entry& e) {
          switch (scope) {
            case AbortScope::kAll:
              return true;
            case AbortScope::kRidExact:
              return e.request.rid == rid;
            case AbortScope::kRidPrefix:
              return e.request.rid.starts_with(rid);
          }
          return false;
        },
        message);
    std::move(done)(n);
  });
}

void Scheduler::Pause(PauseMode mode, absl::AnyInvocable<void(int64_t) &&> done) {
  // A kWait pause holds back what is submitted after this call, even before
  // the scheduler thread runs the command.
  uint64_t boundary = 0;
  {
    absl::MutexLock lock(&mu_);
    boundary = next_id_;
  }
  Post([this, mode, boundary, done = std::move(done)]() mutable {
    int64_t affected = 0;
    switch (mode) {
      case PauseMode::kAbort:
        affected = AbortWhere([](const Entry&) { return true; },
                              "aborted by /pause_generation (mode abort)");
        break;
      case PauseMode::kRetract: {
        std::vector<std::unique_ptr<Entry>> retracted;
        for (std::unique_ptr<Entry>& e : running_) {
          if (e->finished) continue;
          e->sequence.DropCache();
          retracted.push_back(std::move(e));
        }
        std::erase(running_, nullptr);
        affected = static_cast<int64_t>(retracted.size());
        absl::MutexLock lock(&mu_);
        running_count_ -= affected;
        for (auto it = retracted.rbegin(); it != retracted.rend(); ++it) {
          waiting_.push_front(std::move(*it));
        }
        break;
      }
      case PauseMode::kInPlace:
        for (const std::unique_ptr<Entry>& e : running_) affected += e->finished ? 0 : 1;
        break;
      case PauseMode::kWait: {
        // Requests queued or running now end before the pause takes hold;
        // those submitted later wait behind it.
        for (const std::unique_ptr<Entry>& e : running_) affected += e->finished ? 0 : 1;
        {
          absl::MutexLock lock(&mu_);
          for (const std::unique_ptr<Entry>& e : waiting_) affected += e->id < boundary ? 1 : 0;
          paused_ = false;
          drain_before_ = boundary;
        }
        if (drain_done_) std::exchange(drain_done_, nullptr)(drain_affected_);
        drain_done_ = std::move(done);
        drain_affected_ = affected;
        return;
      }
    }
    if (drain_done_) {
      // Another mode replaces a drain still in progress.
      std::exchange(drain_done_, nullptr)(drain_affected_);
    }
    {
      absl::MutexLock lock(&mu_);
      paused_ = true;
      pause_mode_ = mode;
      drain_before_.reset();
    }
    std::move(done)(affected);
  });
}

void Scheduler::MaybeFinishDrain() {
  if (!drain_done_) return;
  for (const std::unique_ptr<Entry>& e : running_) {
    if (!e->finished) return;
  }
  {
    absl::MutexLock lock(&mu_);
    if (!waiting_.empty() && drain_before_.has_value() && waiting_.front()->id < *drain_before_) {
      return;
    }
    paused_ = true;
    pause_mode_ = PauseMode::kWait;
    drain_before_.reset();
  }
  std::exchange(drain_done_, nullptr)(drain_affected_);
}

void Scheduler::Continue(absl::AnyInvocable<void(bool) &&> done) {
  Post([this, done = std::move(done)]() mutable {
    bool was_paused = false;
    {
      absl::MutexLock lock(&mu_);
      was_paused = paused_ || drain_before_.has_value();
      paused_ = false;
      drain_before_.reset();
    }
    if (drain_done_) std::exchange(drain_done_, nullptr)(drain_affected_);
    std::move(done)(was_paused);
  });
}

void Scheduler::FlushCache(absl::AnyInvocable<void(absl::Status) &&> done) {
  Post([this, done = std::move(done)]() mutable {
    int64_t running = 0;
    for (const std::unique_ptr<Entry>& e : running_) running += e->finished ? 0 : 1;
    int64_t queued = 0;
    {
      absl::MutexLock lock(&mu_);
      queued = static_cast<int64_t>(waiting_.size());
    }
    if (running > 0 || queued > 0) {
      std::move(done)(absl::FailedPreconditionError(absl::StrCat(
          "cache not flushed: ", running, " requests are running and ", queued,
          " queued; flush when the engine is idle (abort them or wait for them to finish)")));
      return;
    }
    prefix_cache_.Clear();
    std::move(done)(absl::OkStatus());
  });
}

void Scheduler::SwapWeights(std::shared_ptr<const ModelWeights> weights, VersionRef version,
                            absl::AnyInvocable<void() &&> at_pause,
                            absl::AnyInvocable<void(absl::StatusOr<SwapResult>) &&> done) {
  Post([this, weights = std::move(weights), version = std::move(version),
        at_pause = std::move(at_pause), done = std::move(done)]() mutable {
    if (weights == nullptr || !(weights->config() == config_)) {
      std::move(done)(absl::InvalidArgumentError(
          "the new weights have another model configuration than the serving ones; an engine "
          "only swaps weights of the same architecture (restart it with --model to change)"));
      return;
    }
    const auto start = std::chrono::steady_clock::now();
    if (at_pause) std::move(at_pause)();
    SwapResult result;
    result.previous = std::exchange(weights_, std::move(weights));
    Relabel(std::move(version), start, result);
    std::move(done)(std::move(result));
  });
}

void Scheduler::PatchWeights(std::shared_ptr<const WeightPatch> patch, int64_t fail_after_tensors,
                             absl::AnyInvocable<void() &&> at_pause,
                             absl::AnyInvocable<void(absl::StatusOr<SwapResult>) &&> done) {
  Post([this, patch = std::move(patch), fail_after_tensors, at_pause = std::move(at_pause),
        done = std::move(done)]() mutable {
    if (patch == nullptr || !(patch->from == serving_version_)) {
      std::move(done)(absl::AbortedError(absl::StrCat(
          "the patch starts from ", patch ? patch->from.ToString() : std::string("nothing"),
          " but the engine serves ", serving_version_.ToString(), "; nothing was changed")));
      return;
    }
    // Only weights the scheduler alone holds change in place: no step or
    // other holder can see them half-patched.
    if (weights_.use_count() != 1) {
      std::move(done)(absl::AbortedError(
          "the serving weights are shared beyond the scheduler; nothing was changed"));
      return;
    }
    const auto start = std::chrono::steady_clock::now();
    if (at_pause) std::move(at_pause)();
    // The weights were built mutable (ModelWeights::FromTensors) and nothing
    // else holds them.
    auto& weights = const_cast<ModelWeights&>(*weights_);
    if (absl::Status applied = weights.ApplyPatch(*patch, fail_after_tensors); !applied.ok()) {
      std::move(done)(applied);
      return;
    }
    SwapResult result;
    Relabel(patch->to, start, result);
    std::move(done)(std::move(result));
  });
}

void Scheduler::Relabel(VersionRef version, std::chrono::steady_clock::time_point start,
                        SwapResult& result) {
  const Checksum128 fingerprint = weights_->fingerprint();
  result.previous_version = std::exchange(serving_version_, version);
  for (const std::unique_ptr<Entry>& e : running_) result.resident_requests += e->finished ? 0 : 1;
  result.pause_seconds =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  {
    absl::MutexLock lock(&mu_);
    version_ = std::move(version);
    fingerprint_ = fingerprint;
    last_swap_pause_seconds_ = result.pause_seconds;
  }
  weight_swaps_.fetch_add(1, std::memory_order_relaxed);
  prefix_cache_.Clear();
}

SchedulerStats Scheduler::stats() const {
  SchedulerStats s;
  s.steps = steps_.load(std::memory_order_relaxed);
  s.tokens_generated = tokens_generated_.load(std::memory_order_relaxed);
  s.requests_finished = requests_finished_.load(std::memory_order_relaxed);
  s.requests_aborted = requests_aborted_.load(std::memory_order_relaxed);
  s.weight_swaps = weight_swaps_.load(std::memory_order_relaxed);
  absl::MutexLock lock(&mu_);
  s.running = running_count_;
  s.queued = static_cast<int64_t>(waiting_.size());
  s.paused = paused_;
  s.pause_mode = pause_mode_;
  s.draining = drain_before_.has_value();
  s.weight_version = version_;
  s.weights_fingerprint = fingerprint_;
  s.pending_commands = static_cast<int64_t>(commands_.size());
  s.last_swap_pause_seconds = last_swap_pause_seconds_;
  s.heartbeat = heartbeat_;
  return s;
}

VersionRef Scheduler::weight_version() const {
  absl::MutexLock lock(&mu_);
  return version_;
}

double Scheduler::SecondsSinceHeartbeat() const {
  std::chrono::steady_clock::time_point heartbeat;
  {
    absl::MutexLock lock(&mu_);
    heartbeat = heartbeat_;
  }
  return std::chrono::duration<double>(options_.clock() - heartbeat).count();
}

bool Scheduler::Healthy() const {
  return SecondsSinceHeartbeat() <= std::chrono::duration<double>(options_.stall_timeout).count();
}

bool Scheduler::HasWork() const {
  const bool admissible =
      !waiting_.empty() && (!drain_before_.has_value() || waiting_.front()->id < *drain_before_);
  return stopping_ || !commands_.empty() || (!paused_ && admissible);
}

void Scheduler::Run() {
  for (;;) {
    if (options_.before_iteration) options_.before_iteration();
    std::vector<Command> commands;
    {
      absl::MutexLock lock(&mu_);
      heartbeat_ = options_.clock();
      if (stopping_) return;
      commands.swap(commands_);
    }
    for (Command& c : commands) std::move(c)();
    SweepFinished();
    AdmitWaiting();
    SweepFinished();
    MaybeFinishDrain();
    bool paused = false;
    {
      absl::MutexLock lock(&mu_);
      paused = paused_;
    }
    if (paused || running_.empty()) {
      absl::MutexLock lock(&mu_);
      mu_.AwaitWithTimeout(absl::Condition(this, &Scheduler::HasWork),
                           absl::FromChrono(options_.idle_tick));
      continue;
    }
    Step();
    SweepFinished();
  }
}

void Scheduler::AdmitWaiting() {
  std::vector<std::unique_ptr<Entry>> admitted;
  {
    absl::MutexLock lock(&mu_);
    if (paused_) return;
    while (running_count_ < options_.max_running && !waiting_.empty() &&
           (!drain_before_.has_value() || waiting_.front()->id < *drain_before_)) {
      admitted.push_back(std::move(waiting_.front()));
      waiting_.pop_front();
      ++running_count_;
    }
  }
  for (std::unique_ptr<Entry>& e : admitted) {
    e->swaps_at_admission = weight_swaps_.load(std::memory_order_relaxed);
    if (e->request.max_new_tokens == 0) {
      Finish(*e, FinishReason{FinishType::kLength}, {});
    } else if (e->sequence.cached_length() == 0) {
      // At least the last token is computed: its logits start the decode.
      const PrefixCache::Hit hit = prefix_cache_.Lookup(e->request.extra_key, e->sequence.tokens());
      const int64_t n = std::min(hit.length, static_cast<int64_t>(e->sequence.tokens().size()) - 1);
      if (hit.cache != nullptr && n > 0) {
        e->sequence.SeedCache(*hit.cache, n);
        e->cached_tokens = std::min(n, e->sequence.prompt_length());
      }
    }
    running_.push_back(std::move(e));
  }
}

void Scheduler::SweepFinished() {
  const size_t before = running_.size();
  std::erase_if(running_, [](const std::unique_ptr<Entry>& e) { return e->finished; });
  const int64_t removed = static_cast<int64_t>(before - running_.size());
  if (removed == 0) return;
  absl::MutexLock lock(&mu_);
  running_count_ -= removed;
}

// Long on purpose: one step of the batch (forward pass, then each
// sequence's token: prefix sharing, stop strings, what may be emitted) over
// state every part of it reads and writes; the model math is model.cc's.
void Scheduler::Step() {
  std::vector<Sequence*> sequences;
  std::vector<Entry*> entries;
  sequences.reserve(running_.size());
  entries.reserve(running_.size());
  for (const std::unique_ptr<Entry>& e : running_) {
    if (e->finished) continue;
    sequences.push_back(&e->sequence);
    entries.push_back(e.get());
  }
  if (sequences.empty()) return;
  absl::StatusOr<std::vector<std::optional<SampledToken>>> sampled =
      StepSequences(*weights_, sequences, StepOptions{options_.prefill_chunk});
  steps_.fetch_add(1, std::memory_order_relaxed);
  if (!sampled.ok()) {
    // Every sequence was checked when it was submitted and stops before the
    // context is full, so this is a bug; fail the batch rather than loop.
    for (Entry* e : entries) {
      AbortEntry(*e,
                 absl::StrCat("internal error in the forward pass: ", sampled.status().message()));
    }
    return;
  }
  for (size_t i = 0; i < entries.size(); ++i) {
    const std::optional<SampledToken>& token = (*sampled)[i];
    if (!token.has_value()) continue;  // still feeding its prompt
    tokens_generated_.fetch_add(1, std::memory_order_relaxed);
    Entry& e = *entries[i];
    const GenerationRequest& r = e.request;
    if (e.sequence.generated().size() == 1) {
      // Its prompt was just computed: requests sharing it (a group's other
      // samples) may start from it without waiting for this one to finish.
      CacheComputedPrefix(e);
    }
    std::optional<FinishReason> finish;
    bool adds_text = true;
    bool cut_by_stop_string = false;
    if (!r.ignore_eos && token->id == config_.eos_token_id) {
      finish = FinishReason{FinishType::kStop, token->id};
      adds_text = false;
    } else if (std::find(r.stop_token_ids.begin(), r.stop_token_ids.end(), token->id) !=
               r.stop_token_ids.end()) {
      finish = FinishReason{FinishType::kStop, token->id};
      adds_text = r.keep_stop_string;
    }
    if (adds_text) {
      const size_t before = e.text.size();
      e.text += e.decoder.Push(token->id);
      if (!finish && !r.stop.empty() && e.text.size() > before) {
        // A stop string not found before must end in the new bytes.
        const size_t from = before > e.holdback ? before - e.holdback : 0;
        size_t best = std::string::npos;
        const std::string* matched = nullptr;
        for (const std::string& s : r.stop) {
          const size_t at = e.text.find(s, from);
          if (at != std::string::npos && at < best) {
            best = at;
            matched = &s;
          }
        }
        if (matched != nullptr) {
          finish = FinishReason{FinishType::kStop, std::nullopt, *matched};
          e.text.resize(r.keep_stop_string ? best + matched->size() : best);
          cut_by_stop_string = true;
        }
      }
    }
    const auto generated = static_cast<int64_t>(e.sequence.generated().size());
    if (!finish && (generated >= r.max_new_tokens || !e.sequence.CanAdvance())) {
      finish = FinishReason{FinishType::kLength};
    }
    std::vector<GeneratedToken> tokens{GeneratedToken{token->id, token->logprob}};
    if (finish) {
      if (!cut_by_stop_string) e.text += e.decoder.Finish();
      Finish(e, *std::move(finish), std::move(tokens));
      continue;
    }
    // Emit what no stop string can still claim, in whole characters.
    size_t stable = e.text.size() > e.holdback ? e.text.size() - e.holdback : 0;
    while (stable > e.emitted && stable < e.text.size() &&
           (static_cast<unsigned char>(e.text[stable]) & 0xC0) == 0x80) {
      --stable;
    }
    GenerationUpdate update;
    update.tokens = std::move(tokens);
    if (stable > e.emitted) {
      update.text = e.text.substr(e.emitted, stable - e.emitted);
      e.emitted = stable;
    }
    update.weight_version = serving_version_;
    update.cached_tokens = e.cached_tokens;
    e.sink(std::move(update));
  }
}

void Scheduler::Finish(Entry& e, FinishReason reason, std::vector<GeneratedToken> tokens) {
  GenerationUpdate update;
  update.tokens = std::move(tokens);
  if (e.text.size() > e.emitted) update.text = e.text.substr(e.emitted);
  e.emitted = e.text.size();
  update.weight_version = serving_version_;
  update.cached_tokens = e.cached_tokens;
  if (reason.type == FinishType::kAbort) {
    requests_aborted_.fetch_add(1, std::memory_order_relaxed);
  } else {
    CacheComputedPrefix(e);
  }
  update.finish = std::move(reason);
  e.finished = true;
  requests_finished_.fetch_add(1, std::memory_order_relaxed);
  e.sink(std::move(update));
}

void Scheduler::CacheComputedPrefix(const Entry& e) {
  if (options_.prefix_cache_bytes == 0 || e.sequence.cached_length() == 0) return;
  // Only what the serving weights alone computed may be reused.
  if (weight_swaps_.load(std::memory_order_relaxed) != e.swaps_at_admission) return;
  prefix_cache_.Insert(e.request.extra_key, e.sequence.tokens(), e.sequence.cache());
}

void Scheduler::AbortEntry(Entry& e, std::string message) {
  if (e.finished) return;
  e.text += e.decoder.Finish();
  FinishReason reason{FinishType::kAbort};
  reason.message = std::move(message);
  Finish(e, std::move(reason), {});
}

int64_t Scheduler::AbortWhere(const std::function<bool(const Entry&)>& match,
                              std::string_view message) {
  int64_t n = 0;
  for (const std::unique_ptr<Entry>& e : running_) {
    if (e->finished || !match(*e)) continue;
    AbortEntry(*e, std::string(message));
    ++n;
  }
  std::vector<std::unique_ptr<Entry>> dropped;
  {
    absl::MutexLock lock(&mu_);
    for (auto it = waiting_.begin(); it != waiting_.end();) {
      if (match(**it)) {
        dropped.push_back(std::move(*it));
        it = waiting_.erase(it);
      } else {
        ++it;
      }
    }
  }
  for (std::unique_ptr<Entry>& e : dropped) {
    AbortEntry(*e, std::string(message));
    ++n;
  }
  return n;
}

}  // namespace stitch

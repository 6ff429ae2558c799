#include "stitch/chaos/trainer.h"

#include <signal.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "stitch/core/version.h"
#include "stitch/delta/checkpoint_image.h"
#include "stitch/delta/delta_encode.h"
#include "stitch/format/checksum.h"
#include "stitch/store/materialize_chain.h"

namespace stitch {
namespace {

namespace fs = std::filesystem;

constexpr auto kPollEvery = std::chrono::milliseconds(2);

std::vector<TensorView> Views(const std::vector<HostTensor>& tensors) {
  std::vector<TensorView> out;
  for (const HostTensor& t : tensors) out.push_back(t.view());
  return out;
}

std::string LastLine(const fs::path& path) {
  std::ifstream in(path);
  std::string line;
  std::string last;
  while (std::getline(in, line)) {
    if (!line.empty()) last = line;
  }
  return last.empty() ? std::string("(no output)") : last;
}

}  // namespace

absl::Status VerifyVersionBytes(Store& store, Oracle& oracle, const fs::path& base_checkpoint,
                                int64_t version) {
  if (version == 0) return absl::OkStatus();
  auto chain = MaterializeChain(store, version, /*have=*/0);
  if (!chain.ok()) return chain.status();
  if (chain->empty()) return absl::DataLossError("the chain to the version is empty");
  const bool anchored = chain->front().manifest.kind == VersionKind::kFull;
  CheckpointImage::LoadOptions load;
  load.run_id = store.run_id();
  load.threads = 1;
  if (!anchored) load.version = 0;
  auto image = CheckpointImage::Load(anchored ? chain->front().dir : base_checkpoint, load);
  if (!image.ok()) return image.status();
  std::vector<fs::path> deltas;
  for (size_t i = anchored ? 1 : 0; i < chain->size(); ++i) deltas.push_back((*chain)[i].dir);
  if (!deltas.empty()) {
    ApplyOptions apply;
    apply.run_id = store.run_id();
    apply.threads = 1;
    auto applied = image->ApplyDeltas(deltas, apply);
    if (!applied.ok()) return applied.status();
  }
  std::map<std::string, Checksum128, std::less<>> checksums;
  for (const auto& [name, tensor] : image->tensors()) {
    checksums[name] =
        Xxh3Checksum(std::span<const std::byte>(tensor.data.data(), tensor.data.size()));
  }
  if (WeightsFingerprint(checksums) != oracle.Fingerprint(version)) {
    return absl::DataLossError(
        absl::StrCat("the bytes of v", version, " are not the weights the trainer published"));
  }
  return absl::OkStatus();
}

// --- ChaosTrainer ----------------------------------------------------------------

ChaosTrainer::ChaosTrainer(ProcessSupervisor& supervisor, Oracle& oracle, Store& store,
                           HistoryWriter& history, ChaosTrainerOptions options,
                           std::function<double()> now)
    : supervisor_(supervisor),
      oracle_(oracle),
      store_(store),
      history_(history),
      options_(std::move(options)),
      now_(std::move(now)) {}

ChaosTrainer::~ChaosTrainer() { Stop(); }

void ChaosTrainer::Start() {
  thread_ = std::thread([this] { Loop(); });
}

void ChaosTrainer::Stop() {
  {
    absl::MutexLock lock(&mu_);
    stopping_ = true;
  }
  if (thread_.joinable()) thread_.join();
}

int64_t ChaosTrainer::published() const {
  absl::MutexLock lock(&mu_);
  return published_;
}

void ChaosTrainer::ArmKill(double fraction) {
  {
    absl::MutexLock lock(&mu_);
    kill_armed_ = true;
    publish_now_ = true;
    kill_fraction_ = fraction;
    kill_report_.reset();
  }
}

std::optional<std::string> ChaosTrainer::KillReport() {
  absl::MutexLock lock(&mu_);
  return kill_report_;
}

void ChaosTrainer::Disarm() {
  absl::MutexLock lock(&mu_);
  kill_armed_ = false;
  publish_now_ = false;
}

std::optional<int64_t> ChaosTrainer::Pointer() {
  if (!store_.Refresh().ok()) return std::nullopt;
  auto pointer = store_.ReadPointer();
  if (!pointer.ok() || !pointer->has_value()) return std::nullopt;
  if ((*pointer)->run_id != options_.run_id) return std::nullopt;
  return (*pointer)->version;
}

absl::Status ChaosTrainer::PrepareVersion(int64_t version, bool* full) {
  *full = version % options_.anchor_every == 0;
  const fs::path dir = options_.work_dir / VersionDirName(version);
  std::error_code ec;
  if (fs::exists(dir / "model.safetensors.index.json", ec)) return absl::OkStatus();
  fs::remove_all(dir, ec);
  fs::create_directories(options_.work_dir, ec);
  const std::vector<HostTensor> target = oracle_.Tensors(version);
  if (*full) {
    FullVersionOptions o;
    o.version = version;
    o.run_id = options_.run_id;
    auto written = WriteFullVersion(Views(target), dir, o);
    return written.ok() ? absl::OkStatus() : written.status();
  }
  const std::vector<HostTensor> base = oracle_.Tensors(version - 1);
  EncodeOptions o;
  o.version = version;
  o.base_version = version - 1;
  o.run_id = options_.run_id;
  o.threads = 1;
  auto written = EncodeDelta(Views(base), Views(target), dir, o);
  return written.ok() ? absl::OkStatus() : written.status();
}

// Long on purpose: the publish loop and its retries in one place; each
// outcome of a publish (moved, refused, killed, failed with the pointer
// moved anyway) decides the next step here.
void ChaosTrainer::Loop() {
  int64_t next = 1;
  int attempt = 0;
  for (;;) {
    {
      absl::MutexLock lock(&mu_);
      mu_.AwaitWithTimeout(absl::Condition(this, &ChaosTrainer::StopOrPublish),
                           absl::Seconds(options_.interval_s));
      if (stopping_) return;
      publish_now_ = false;
    }
    // A publish that was killed or failed may have moved the pointer anyway.
    if (std::optional<int64_t> pointer = Pointer(); pointer.has_value() && *pointer >= next) {
      PublishEntry late;
      late.version = next;
      late.full = next % options_.anchor_every == 0;
      late.started_s = late.done_s = now_();
      late.outcome = "published (seen on the pointer after its publish ended early)";
      history_.Write(late);
      std::error_code ec;
      fs::remove_all(options_.work_dir / VersionDirName(next), ec);
      absl::MutexLock lock(&mu_);
      published_ = next;
      next = *pointer + 1;
      attempt = 0;
      continue;
    }
    PublishEntry entry;
    entry.version = next;
    if (absl::Status s = PrepareVersion(next, &entry.full); !s.ok()) {
      entry.started_s = entry.done_s = now_();
      entry.outcome = absl::StrCat("failed: preparing the version: ", s.message());
      history_.Write(entry);
      continue;
    }
    const fs::path dir = options_.work_dir / VersionDirName(next);
    const fs::path log =
        options_.logs_dir / absl::StrCat("publish-", VersionDirName(next), ".", attempt++, ".log");
    std::vector<std::string> args = {"publish", "--store", options_.store_uri, "--run-id",
                                     options_.run_id};
    if (!options_.pool_spec.empty()) {
      args.push_back("--pool");
      args.push_back(options_.pool_spec);
    }
    args.insert(args.end(), options_.publish_args.begin(), options_.publish_args.end());
    args.push_back(dir.string());
    entry.started_s = now_();
    const auto started = std::chrono::steady_clock::now();
    auto pid = supervisor_.Start(absl::StrCat("publish v", next), args, log);
    if (!pid.ok()) {
      entry.done_s = now_();
      entry.outcome = absl::StrCat("failed: ", pid.status().message());
      history_.Write(entry);
      continue;
    }
    bool killed = false;
    bool timed_out = false;
    std::optional<int> status;
    for (;;) {
      status = supervisor_.ExitStatus(*pid);
      if (status.has_value()) break;
      const auto elapsed = std::chrono::steady_clock::now() - started;
      bool kill_now = false;
      {
        absl::MutexLock lock(&mu_);
        if (kill_armed_ &&
            elapsed >= std::chrono::duration<double>(kill_fraction_ * typical_publish_s_)) {
          kill_armed_ = false;
          kill_now = true;
        }
      }
      if (!killed && !timed_out && (kill_now || elapsed > options_.publish_timeout)) {
        supervisor_.Signal(*pid, SIGKILL);
        (kill_now ? killed : timed_out) = true;
      }
      std::this_thread::sleep_for(kPollEvery);
    }
    entry.done_s = now_();
    const double took =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    bool published = *status == 0 && !killed;
    if (!published) {
      std::optional<int64_t> pointer = Pointer();
      published = pointer.has_value() && *pointer >= next;
    }
    if (*status == 0 && !killed) {
      entry.outcome = "published";
      absl::MutexLock lock(&mu_);
      typical_publish_s_ = 0.8 * typical_publish_s_ + 0.2 * took;
    } else if (published) {
      entry.outcome = "published (seen on the pointer after its publish ended early)";
    } else if (killed) {
      entry.outcome = "killed";
    } else {
      entry.outcome = absl::StrCat("failed: ", timed_out ? "timed out: " : "", LastLine(log));
    }
    if (killed) {
      absl::MutexLock lock(&mu_);
      kill_report_ = absl::StrFormat("killed the publish of v%d after %.0f ms (%s)", next,
                                     took * 1000, published ? "it was published" : "not published");
    }
    history_.Write(entry);
    if (published) {
      std::error_code ec;
      fs::remove_all(dir, ec);
      absl::MutexLock lock(&mu_);
      published_ = next;
      ++next;
      attempt = 0;
    }
  }
}

// --- PointerWatcher --------------------------------------------------------------

PointerWatcher::PointerWatcher(Store& store, Oracle& oracle, fs::path base_checkpoint,
                               HistoryWriter& history, std::function<double()> now,
                               std::chrono::milliseconds every)
    : store_(store),
      oracle_(oracle),
      base_checkpoint_(std::move(base_checkpoint)),
      history_(history),
      now_(std::move(now)),
      every_(every) {}

PointerWatcher::~PointerWatcher() { Stop(); }

void PointerWatcher::Start() {
  thread_ = std::thread([this] { Loop(); });
}

void PointerWatcher::Stop() {
  stop_.store(true);
  if (thread_.joinable()) thread_.join();
}

void PointerWatcher::Loop() {
  // Bytes that cannot be read for a moment (a store fault between reading
  // the pointer and its version) are checked again; only a failure that
  // persists while the pointer reads fine, or corrupt bytes, count.
  constexpr int kPersistentFailures = 5;
  int64_t seen = -1;
  int64_t failing = -1;  // the version the failures below are of
  int failures = 0;
  while (!stop_.load()) {
    auto pointer =
        store_.Refresh().ok()
            ? store_.ReadPointer()
            : absl::StatusOr<std::optional<VersionRef>>(absl::UnavailableError("refresh failed"));
    if (pointer.ok() && pointer->has_value() && (*pointer)->version != seen) {
      PointerEntry entry;
      entry.at_s = now_();
      entry.version = (*pointer)->version;
      const absl::Status verified =
          VerifyVersionBytes(store_, oracle_, base_checkpoint_, entry.version);
      entry.complete = verified.ok();
      entry.detail = std::string(verified.message());
      const bool corrupt = absl::IsDataLoss(verified) || absl::IsInvalidArgument(verified);
      // A version that retention deleted as the pointer moved past it
      // (store_gc) fails once; what counts is one version failing on.
      if (failing != entry.version) failures = 0;
      failing = entry.version;
      if (verified.ok() || corrupt || ++failures >= kPersistentFailures) {
        history_.Write(entry);
        seen = entry.version;
        failures = 0;
        latest_.store(std::max(latest_.load(), entry.version));
      }
    }
    std::this_thread::sleep_for(every_);
  }
}

}  // namespace stitch

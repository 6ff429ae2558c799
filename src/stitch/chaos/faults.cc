#include "stitch/chaos/faults.h"

#include <fcntl.h>
#include <sys/mount.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/time/clock.h"
#include "stitch/store/retention.h"

namespace stitch {
namespace {

namespace fs = std::filesystem;

constexpr const char* kFillFile = "chaos-fill";
// store_gc: seconds between two retention passes.
constexpr double kGcPassEveryS = 0.25;

fs::path Away(const fs::path& root) { return fs::path(root.string() + ".away"); }

// Writes zeros into `path` until the file system is full. Returns the bytes
// written and the error that stopped it.
std::pair<uint64_t, std::string> Fill(const fs::path& path) {
  const int fd = ::open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return {0, std::strerror(errno)};
  std::vector<char> block(size_t{1} << 20, 0);
  uint64_t written = 0;
  std::string stop = "no error";
  // Large blocks first, then smaller ones, down to the last free bytes.
  for (size_t size = block.size(); size > 0; size /= 4) {
    for (;;) {
      const ssize_t n = ::write(fd, block.data(), size);
      if (n > 0) {
        written += static_cast<uint64_t>(n);
        continue;
      }
      if (n < 0 && errno == EINTR) continue;
      stop = n < 0 ? std::strerror(errno) : "short write";
      break;
    }
  }
  ::fsync(fd);
  ::close(fd);
  return {written, stop};
}

}  // namespace

absl::Status MountTmpfs(const fs::path& dir, int megabytes) {
  std::error_code ec;
  fs::create_directories(dir, ec);
  const std::string options = absl::StrCat("size=", megabytes, "m,mode=0755");
  if (::mount("tmpfs", dir.c_str(), "tmpfs", MS_NOSUID | MS_NODEV, options.c_str()) != 0) {
    return absl::FailedPreconditionError(absl::StrCat("mounting a tmpfs at ", dir.string(),
                                                      " failed (", std::strerror(errno),
                                                      "); it needs root (CAP_SYS_ADMIN)"));
  }
  return absl::OkStatus();
}

absl::Status Unmount(const fs::path& dir) {
  if (::umount2(dir.c_str(), 0) == 0) return absl::OkStatus();
  if (errno == EBUSY && ::umount2(dir.c_str(), MNT_DETACH) == 0) return absl::OkStatus();
  return absl::InternalError(absl::StrCat("unmounting ", dir.string(),
                                          " failed: ", std::strerror(errno), "; run umount on it"));
}

FaultInjector::FaultInjector(std::vector<Fault> schedule, InjectorTargets targets,
                             HistoryWriter& history, std::function<double()> now, double origin)
    : schedule_(std::move(schedule)),
      targets_(std::move(targets)),
      history_(history),
      now_(std::move(now)),
      origin_(origin) {}

FaultInjector::~FaultInjector() {
  Cancel();
  Join();
}

void FaultInjector::Start() {
  dispatcher_ = std::thread([this] { Dispatch(); });
}

void FaultInjector::Cancel() {
  {
    absl::MutexLock lock(&mu_);
    cancelled_ = true;
  }
}

void FaultInjector::Join() {
  if (dispatcher_.joinable()) dispatcher_.join();
  std::vector<std::thread> threads;
  {
    absl::MutexLock lock(&mu_);
    threads.swap(running_);
  }
  for (std::thread& t : threads) t.join();
}

std::vector<std::string> FaultInjector::Findings() {
  absl::MutexLock lock(&mu_);
  return findings_;
}

bool FaultInjector::WaitUntil(double at_s) {
  absl::MutexLock lock(&mu_);
  for (;;) {
    if (cancelled_) return false;
    const double left = at_s - now_();
    if (left <= 0) return true;
    mu_.AwaitWithTimeout(absl::Condition(&cancelled_), absl::Seconds(std::min(left, 0.5)));
  }
}

void FaultInjector::Dispatch() {
  for (const Fault& fault : schedule_) {
    if (!WaitUntil(origin_ + fault.start_s)) return;
    absl::MutexLock lock(&mu_);
    running_.emplace_back([this, fault] { Run(fault); });
  }
}

void FaultInjector::Run(const Fault& fault) {
  FaultEntry entry;
  entry.fault = fault;
  entry.applied_s = now_();
  std::string applied = Apply(fault, &entry.skipped);
  if (!entry.skipped) (void)WaitUntil(origin_ + fault.end_s());
  std::string undone = entry.skipped ? std::string() : Undo(fault);
  entry.ended_s = now_();
  entry.note = applied;
  if (!undone.empty()) absl::StrAppend(&entry.note, entry.note.empty() ? "" : "; ", undone);
  history_.Write(entry);
}

std::string FaultInjector::Apply(const Fault& fault, bool* skipped) {
  ChaosFleet& fleet = *targets_.fleet;
  auto fail = [&](const absl::Status& s) {
    *skipped = true;
    return absl::StrCat("not applied: ", s.message());
  };
  switch (fault.kind) {
    case FaultKind::kEngineKill: {
      absl::Status s = fleet.Kill(Role::kEngine, fault.replica);
      return s.ok() ? "SIGKILL" : fail(s);
    }
    case FaultKind::kSidecarKill: {
      absl::Status s = fleet.Kill(Role::kSidecar, fault.replica);
      return s.ok() ? "SIGKILL" : fail(s);
    }
    case FaultKind::kGatewayKill: {
      absl::Status s = fleet.Kill(Role::kGateway, -1);
      return s.ok() ? "SIGKILL" : fail(s);
    }
    case FaultKind::kS3Kill: {
      absl::Status s = fleet.Kill(Role::kS3, -1);
      return s.ok() ? "SIGKILL" : fail(s);
    }
    case FaultKind::kEngineStop: {
      absl::Status s = fleet.Pause(Role::kEngine, fault.replica);
      return s.ok() ? "SIGSTOP" : fail(s);
    }
    case FaultKind::kS3Stall: {
      absl::Status s = fleet.Pause(Role::kS3, -1);
      return s.ok() ? "SIGSTOP" : fail(s);
    }
    case FaultKind::kPublisherKill:
      targets_.trainer->ArmKill(fault.param);
      return "";
    case FaultKind::kClientDisconnect:
      targets_.load->SetLeaving(true);
      return "clients leave midway";
    case FaultKind::kStoreUnreadable: {
      std::error_code ec;
      fs::rename(targets_.store_root, Away(targets_.store_root), ec);
      if (ec) return fail(absl::InternalError(absl::StrCat("rename: ", ec.message())));
      return "the store's root renamed away";
    }
    case FaultKind::kStoreGc: {
      if (targets_.store == nullptr) return fail(absl::FailedPreconditionError("no store"));
      // Pass after pass until the fault ends: whatever a replica is
      // materializing below the pointer's chain goes under it.
      int passes = 0;
      size_t deleted = 0;
      std::string failed;
      do {
        auto report = ApplyRetention(*targets_.store, RetentionRule{1, 0}, absl::Now());
        ++passes;
        if (report.ok()) {
          deleted += report->deleted.size();
        } else if (failed.empty()) {
          failed = std::string(report.status().message());
        }
      } while (WaitUntil(std::min(now_() + kGcPassEveryS, origin_ + fault.end_s())) &&
               now_() < origin_ + fault.end_s());
      return absl::StrCat(passes, " gc passes deleted ", deleted, " versions",
                          failed.empty() ? "" : absl::StrCat(" (a pass failed: ", failed, ")"));
    }
    case FaultKind::kStoreFull: {
      auto [bytes, why] = Fill(targets_.store_mount / kFillFile);
      return absl::StrFormat("filled with %.1f MiB (%s)", static_cast<double>(bytes) / (1 << 20),
                             why);
    }
  }
  return "";
}

std::string FaultInjector::Undo(const Fault& fault) {
  ChaosFleet& fleet = *targets_.fleet;
  auto report = [](const absl::Status& s, std::string_view done) {
    return s.ok() ? std::string(done) : absl::StrCat("undoing it failed: ", s.message());
  };
  switch (fault.kind) {
    case FaultKind::kEngineKill:
      return report(fleet.Restart(Role::kEngine, fault.replica), "restarted on its port");
    case FaultKind::kSidecarKill:
      return report(fleet.Restart(Role::kSidecar, fault.replica), "restarted on its port");
    case FaultKind::kGatewayKill:
      return report(fleet.Restart(Role::kGateway, -1), "restarted on its port");
    case FaultKind::kS3Kill:
      return report(fleet.Restart(Role::kS3, -1), "restarted on its port with its data");
    case FaultKind::kEngineStop:
      return report(fleet.Continue(Role::kEngine, fault.replica), "SIGCONT");
    case FaultKind::kS3Stall:
      return report(fleet.Continue(Role::kS3, -1), "SIGCONT");
    case FaultKind::kPublisherKill: {
      std::optional<std::string> killed = targets_.trainer->KillReport();
      if (killed.has_value()) return *killed;
      targets_.trainer->Disarm();
      return "no publish was killed: none ran as long as its kill point while armed";
    }
    case FaultKind::kClientDisconnect:
      targets_.load->SetLeaving(false);
      return "";
    case FaultKind::kStoreUnreadable: {
      std::error_code ec;
      std::string note = "renamed back";
      if (fs::exists(targets_.store_root, ec)) {
        // Something created a new store where the old one was.
        const fs::path stray =
            fs::path(absl::StrCat(targets_.store_root.string(), ".stray-", fault.id));
        fs::rename(targets_.store_root, stray, ec);
        absl::MutexLock lock(&mu_);
        findings_.push_back(absl::StrFormat(
            "while the store's root was renamed away (fault #%d), something created a new "
            "store at its path (moved to %s)",
            fault.id, stray.string()));
        note = absl::StrCat("a new store had appeared at its path (moved aside); ", note);
      }
      fs::rename(Away(targets_.store_root), targets_.store_root, ec);
      return ec ? absl::StrCat("renaming back failed: ", ec.message()) : note;
    }
    case FaultKind::kStoreGc:
      return "";
    case FaultKind::kStoreFull: {
      std::error_code ec;
      fs::remove(targets_.store_mount / kFillFile, ec);
      return ec ? absl::StrCat("removing the filler failed: ", ec.message()) : "filler removed";
    }
  }
  return "";
}

}  // namespace stitch

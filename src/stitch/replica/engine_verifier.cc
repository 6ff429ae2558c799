#include "stitch/replica/engine_verifier.h"

#include <utility>

#include "absl/strings/str_cat.h"
#include "stitch/core/errors.h"
#include "stitch/store/materialize_chain.h"

namespace stitch {

using boost::asio::awaitable;

EngineVerifier::EngineVerifier(EngineVerifierOptions options, Store& store, Engine& engine,
                               WorkerPool& pool)
    : options_(std::move(options)), store_(store), engine_(engine), pool_(pool) {}

std::string EngineVerifier::Disagreement(const EngineReport& report, const VersionRef& label,
                                         const std::optional<Checksum128>& expected) {
  if (!report.label.empty()) {
    if (!report.held.has_value()) {
      return absl::StrCat("the engine labels its weights \"", report.label,
                          "\", which names no version, not ", label.ToString());
    }
    if (report.held->version != label.version ||
        (!report.held->run_id.empty() && report.held->run_id != label.run_id)) {
      return absl::StrCat("the engine reports weights ", report.held->ToString(), ", not ",
                          label.ToString());
    }
  }
  if (expected.has_value() && report.fingerprint.has_value() && *report.fingerprint != *expected) {
    return absl::StrCat("the engine's weights fingerprint is ", report.fingerprint->ToHex(),
                        ", not ", expected->ToHex(), " (", label.ToString(), "'s)");
  }
  return "";
}

awaitable<EngineVerdict> EngineVerifier::Verify(const EngineReport& report,
                                                const std::optional<VersionRef>& head,
                                                const std::string& run) {
  EngineVerdict out;
  if (report.label.empty()) {
    out.unverified = "the engine reports no weight label";
    co_return out;
  }
  if (!report.held.has_value()) {
    out.unverified =
        absl::StrCat("the engine's weight label \"", report.label, "\" names no version");
    co_return out;
  }
  const int64_t boot = options_.boot_version;
  VersionRef claim = *report.held;
  if (claim.run_id.empty()) claim.run_id = run;
  const bool head_run = head.has_value() && head->run_id == claim.run_id;
  if (claim.run_id != run && !head_run) {
    out.unverified = absl::StrCat("the engine holds ", claim.ToString(), ", a version of run ",
                                  claim.run_id, ", which this replica does not follow");
    co_return out;
  }
  if (claim.version < boot) {
    out.unverified =
        absl::StrCat("the engine holds ", claim.ToString(), ", older than the boot version ", boot);
    co_return out;
  }
  if (claim.version != boot) {
    if (!head_run) {
      out.unverified = absl::StrCat("the engine holds ", claim.ToString(),
                                    ", but the store's pointer names no version of that run");
      co_return out;
    }
    if (claim.version > head->version) {
      out.unverified =
          absl::StrCat("the engine holds ", claim.ToString(), ", ahead of the store's pointer ",
                       head->ToString(), ": weights that were never published");
      co_return out;
    }
    auto manifest = co_await RunBlocking(pool_, [&] { return store_.ReadManifest(claim.version); });
    if (!manifest.ok()) {
      out.unverified =
          absl::StrCat("the engine holds ", claim.ToString(), ", which the store cannot show (",
                       manifest.status().message(), ")");
      co_return out;
    }
  }
  if (report.fingerprint.has_value()) {
    reports_fingerprints_ = true;
    auto expected = co_await ExpectedFingerprint(claim.run_id, claim.version);
    if (!expected.ok()) {
      out.unverified = absl::StrCat("the fingerprint of ", claim.ToString(),
                                    " cannot be computed (", expected.status().message(), ")");
      co_return out;
    }
    if (*expected != *report.fingerprint) {
      out.unverified = absl::StrCat("the engine labels its weights ", claim.ToString(),
                                    ", but their fingerprint is ", report.fingerprint->ToHex(),
                                    ", not ", expected->ToHex());
      co_return out;
    }
  }
  out.verified = claim;
  co_return out;
}

awaitable<absl::Status> EngineVerifier::CheckLoaded(const VersionRef& label,
                                                    const std::string& run) {
  std::optional<Checksum128> expected;
  if (reports_fingerprints_ && label.run_id == run) {
    auto fingerprint = co_await ExpectedFingerprint(run, label.version);
    if (fingerprint.ok()) expected = *fingerprint;
  }
  absl::StatusOr<EngineReport> report = co_await engine_.Report(options_.report_timeout);
  if (!report.ok()) {
    co_return Annotate(report.status(), absl::StrCat("reading what the engine holds after loading ",
                                                     label.ToString()));
  }
  const std::string disagreement = Disagreement(*report, label, expected);
  if (!disagreement.empty()) {
    co_return absl::InternalError(
        absl::StrCat("after loading ", label.ToString(), ", ", disagreement));
  }
  Vouch(*report);
  co_return absl::OkStatus();
}

std::string EngineVerifier::Drift(const EngineReport& report, const VersionRef& label) {
  if (!baseline_instance_.empty() && report.instance != baseline_instance_) {
    return absl::StrCat("the engine restarted (its instance id changed from ", baseline_instance_,
                        " to ", report.instance, ")");
  }
  std::string drift = Disagreement(report, label, baseline_fingerprint_);
  if (drift.empty()) {
    if (baseline_instance_.empty()) baseline_instance_ = report.instance;
    if (!baseline_fingerprint_.has_value()) baseline_fingerprint_ = report.fingerprint;
  }
  return drift;
}

void EngineVerifier::Vouch(const EngineReport& report) {
  baseline_instance_ = report.instance;
  baseline_fingerprint_ = report.fingerprint;
  if (report.fingerprint.has_value()) reports_fingerprints_ = true;
}

absl::StatusOr<TensorChecksums> EngineVerifier::BootChecksums() {
  if (!boot_checksums_.has_value()) {
    auto hashed = AnchorChecksums(options_.base_checkpoint_dir);
    if (!hashed.ok()) {
      return Annotate(hashed.status(), "hashing the boot checkpoint for its fingerprint");
    }
    boot_checksums_ = *std::move(hashed);
  }
  return *boot_checksums_;
}

awaitable<absl::StatusOr<Checksum128>> EngineVerifier::ExpectedFingerprint(const std::string& run,
                                                                           int64_t version) {
  if (run != fingerprints_run_) {
    fingerprints_run_ = run;
    expected_fingerprints_.clear();
  }
  if (auto it = expected_fingerprints_.find(version); it != expected_fingerprints_.end()) {
    co_return it->second;
  }
  const int64_t boot = options_.boot_version;
  auto computed = co_await RunBlocking(pool_, [&, this]() -> absl::StatusOr<Checksum128> {
    if (version == boot) {
      auto checksums = BootChecksums();
      if (!checksums.ok()) return checksums.status();
      return WeightsFingerprint(*checksums);
    }
    auto chain = MaterializeChain(store_, version, boot);
    if (!chain.ok()) return chain.status();
    TensorChecksums checksums;
    size_t first = 0;
    if (!chain->empty() && chain->front().manifest.kind == VersionKind::kFull) {
      auto anchor = AnchorChecksums(chain->front().dir);
      if (!anchor.ok()) return anchor.status();
      checksums = *std::move(anchor);
      first = 1;
    } else {
      auto anchor = BootChecksums();
      if (!anchor.ok()) return anchor.status();
      checksums = *std::move(anchor);
    }
    for (size_t i = first; i < chain->size(); ++i) {
      if (absl::Status s = FoldDeltaChecksums((*chain)[i].dir, checksums); !s.ok()) return s;
    }
    return WeightsFingerprint(checksums);
  });
  if (computed.ok() && run == fingerprints_run_) expected_fingerprints_[version] = *computed;
  co_return computed;
}

}  // namespace stitch

// `stitch delta`: encode, apply, verify and write versions with the delta
// codec (delta/delta_*.h).
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <chrono>
#include <cstdint>
#include <filesystem>
#include <iostream>
#include <optional>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "stitch/cli/commands.h"
#include "stitch/cli/report.h"
#include "stitch/core/errors.h"
#include "stitch/core/version.h"
#include "stitch/delta/delta_apply.h"
#include "stitch/delta/delta_encode.h"
#include "stitch/delta/delta_verify.h"
#include "stitch/delta/weight_patch.h"
#include "stitch/format/checkpoint_reader.h"

namespace stitch {
namespace {

namespace fs = std::filesystem;

std::string HumanBytes(uint64_t n) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(n);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  return u == 0 ? absl::StrCat(n, " B") : absl::StrFormat("%.2f %s", v, units[u]);
}

// A one-line progress bar on stderr, drawn only when stderr is a terminal
// (never into logs or pipes). The codec calls it from worker threads, one
// at a time (ProgressMeter serializes the calls).
class ProgressBar {
 public:
  explicit ProgressBar(std::string label) : label_(std::move(label)), enabled_(::isatty(2) == 1) {}
  ~ProgressBar() {
    if (drawn_) std::cerr << "\r\033[K" << std::flush;
  }
  ProgressBar(const ProgressBar&) = delete;
  ProgressBar& operator=(const ProgressBar&) = delete;

  ProgressMeter::Callback callback() {
    if (!enabled_) return nullptr;
    return [this](uint64_t done, uint64_t total) { Draw(done, total); };
  }

 private:
  void Draw(uint64_t done, uint64_t total) {
    auto now = std::chrono::steady_clock::now();
    if (done < shown_) done = shown_;  // workers report out of order
    if (done < total && drawn_ && now - last_ < std::chrono::milliseconds(100)) return;
    shown_ = done;
    last_ = now;
    drawn_ = true;
    constexpr int kWidth = 30;
    const double f = total == 0 ? 1.0 : static_cast<double>(done) / static_cast<double>(total);
    const int filled = static_cast<int>(f * kWidth);
    std::cerr << "\r" << label_ << " [" << std::string(static_cast<size_t>(filled), '#')
              << std::string(static_cast<size_t>(kWidth - filled), '.') << "] "
              << absl::StrFormat("%3.0f%% ", f * 100) << HumanBytes(done) << " / "
              << HumanBytes(total) << "\033[K" << std::flush;
  }

  std::string label_;
  bool enabled_;
  bool drawn_ = false;
  uint64_t shown_ = 0;
  std::chrono::steady_clock::time_point last_;
};

std::string VersionText(const std::string& run, int64_t v) { return VersionRef{run, v}.ToString(); }

// "1 file", "3 files".
std::string Count(size_t n, std::string_view noun) {
  return absl::StrCat(n, " ", AbslView(noun), n == 1 ? "" : "s");
}

struct EncodeArgs {
  std::string base, target, out, run_id;
  int64_t version = -1;
  std::optional<int64_t> base_version;
  int level = kDefaultZstdLevel;
  uint64_t shard_bytes = kDefaultMaxShardBytes;
  int threads = 0;
};

int RunEncode(const EncodeArgs& a) {
  EncodeOptions o;
  o.version = a.version;
  o.base_version = a.base_version;
  o.level = a.level;
  o.max_shard_bytes = a.shard_bytes;
  o.run_id = a.run_id;
  o.threads = a.threads;
  ProgressBar bar("encode");
  o.progress = bar.callback();
  absl::StatusOr<EncodeResult> r = EncodeDelta(a.base, a.target, a.out, o);
  if (!r.ok()) return ReportFailure(r.status());
  const double fraction = r->checkpoint_bytes == 0 ? 0
                                                   : 100.0 * static_cast<double>(r->payload_bytes) /
                                                         static_cast<double>(r->checkpoint_bytes);
  std::cout << "wrote DELTA " << VersionText(a.run_id, r->version) << " (applies to version "
            << r->base_version
            << (a.base_version ? ", as --base-version says" : ", as the base's index records")
            << ") to " << a.out << ": ";
  if (r->changed_tensors == 0) {
    std::cout << "no tensor changed (an empty delta)\n";
  } else {
    std::cout << r->changed_tensors << " of " << r->tensors << " tensors changed, "
              << Count(r->files.size(), "payload file") << ", " << HumanBytes(r->payload_bytes)
              << absl::StrFormat(" (%.2f%% of ", fraction) << HumanBytes(r->checkpoint_bytes)
              << ")\n";
  }
  return 0;
}

struct ApplyArgs {
  std::string anchor, out, run_id;
  std::vector<std::string> deltas;
  std::optional<int64_t> anchor_version;
  int threads = 0;
};

int RunApply(const ApplyArgs& a) {
  ApplyOptions o;
  o.run_id = a.run_id;
  o.anchor_version = a.anchor_version;
  o.threads = a.threads;
  ProgressBar bar("apply");
  o.progress = bar.callback();
  std::vector<fs::path> deltas(a.deltas.begin(), a.deltas.end());
  absl::StatusOr<MaterializeResult> r = MaterializeCheckpoint(a.anchor, deltas, a.out, o);
  if (!r.ok()) return ReportFailure(r.status());
  if (r->deltas_applied == 0 && !r->reseeded) {
    std::cout << a.out << " already holds " << r->version.ToString() << "\n";
    return 0;
  }
  std::cout << a.out << " now holds " << r->version.ToString() << ": applied "
            << Count(r->deltas_applied, "delta") << " on version " << r->applied_on
            << (r->reseeded ? " (from the anchor)" : " (held by the destination)") << ", "
            << Count(r->tensors_changed, "tensor") << " changed, "
            << Count(r->files_written, "file") << " written, " << r->files_linked << " linked, "
            << r->files_copied << " copied\n";
  return 0;
}

struct VerifyArgs {
  std::string dir;
  std::optional<std::string> base;
  int threads = 0;
};

int RunVerify(const VerifyArgs& a) {
  VerifyOptions o;
  o.threads = a.threads;
  ProgressBar bar("verify");
  o.progress = bar.callback();
  std::optional<fs::path> base;
  if (a.base) base = fs::path(*a.base);
  absl::StatusOr<VerifyReport> r = VerifyVersion(a.dir, base, o);
  if (!r.ok()) return ReportFailure(r.status());
  std::string version = r->version ? VersionDirName(*r->version) : std::string("(no version)");
  if (r->kind == VersionKind::kFull) {
    std::cout << "OK: " << a.dir << " is a complete checkpoint " << version << ": "
              << Count(r->tensors, "tensor") << " in " << Count(r->files, "file") << ", "
              << HumanBytes(r->bytes)
              << (r->checksums_verified ? "; every tensor matches its recorded checksum\n"
                                        : "; it records no checksums to check\n");
    return 0;
  }
  std::cout << "OK: " << a.dir << " is DELTA " << version << " (applies to version "
            << *r->base_version << "): " << Count(r->tensors, "changed tensor") << " in "
            << Count(r->files, "file") << ", " << HumanBytes(r->payload_bytes)
            << "; every frame decodes to " << HumanBytes(r->bytes);
  if (r->checksums_verified) {
    std::cout << "; checksums verified against " << *a.base << "\n";
  } else {
    std::cout << "; checksums not checked (pass --base to check them)\n";
  }
  return 0;
}

struct FullArgs {
  std::string checkpoint, out, run_id;
  int64_t version = -1;
};

int RunFull(const FullArgs& a) {
  FullVersionOptions o;
  o.version = a.version;
  o.run_id = a.run_id;
  absl::StatusOr<FullVersionResult> r = WriteFullVersion(a.checkpoint, a.out, o);
  if (!r.ok()) return ReportFailure(r.status());
  std::cout << "wrote FULL " << VersionText(a.run_id, r->version) << " to " << a.out << ": "
            << Count(r->tensors, "tensor") << " in " << Count(r->files.size(), "file") << ", "
            << HumanBytes(r->checkpoint_bytes) << "\n";
  return 0;
}

struct PatchArgs {
  std::string target, out, run_id;
  int64_t from = -1;
  double max_density = 0.3;
  std::vector<std::string> deltas;
};

int RunPatch(const PatchArgs& a) {
  std::vector<fs::path> deltas(a.deltas.begin(), a.deltas.end());
  auto held = ReadHeldVersion(a.target);
  if (!held.ok()) return ReportFailure(held.status());
  if (!held->has_value()) {
    return ReportFailure(absl::InvalidArgumentError(
        absl::StrCat(a.target, " is not a checkpoint `stitch delta apply` materialized")));
  }
  WeightPatchOptions o;
  o.to = **held;
  if (!a.run_id.empty()) o.to.run_id = a.run_id;
  o.from = VersionRef{o.to.run_id, a.from};
  o.max_density = a.max_density;
  absl::StatusOr<WeightPatchStats> r = WriteWeightPatch(deltas, a.target, a.out, o);
  if (!r.ok()) return ReportFailure(r.status());
  std::cout << "wrote the patch " << o.from.ToString() << " -> " << o.to.ToString() << " to "
            << a.out << ": " << r->values_changed << " of " << r->values_total << " values ("
            << absl::StrFormat("%.4f%%", r->density() * 100) << ") in "
            << Count(r->tensors, "tensor") << ", " << HumanBytes(r->file_bytes) << "\n";
  return 0;
}

}  // namespace

void AddDeltaCommand(CLI::App& app, int* exit_code) {
  CLI::App* delta =
      app.add_subcommand("delta", "Encode, apply and verify versions in the XOR+zstd delta format");
  delta->require_subcommand(1);

  static EncodeArgs enc;
  CLI::App* encode = delta->add_subcommand(
      "encode", "Write the DELTA version that turns the base checkpoint into the target");
  encode->add_option("--base", enc.base, "Checkpoint directory of the previous version")
      ->required();
  encode->add_option("--target", enc.target, "Checkpoint directory of the new version")->required();
  encode->add_option("--out", enc.out, "Directory to create for the DELTA version")->required();
  encode->add_option("--version", enc.version, "The new version's number")
      ->required()
      ->check(CLI::NonNegativeNumber);
  encode
      ->add_option("--base-version", enc.base_version,
                   "The base's version: required when the base's index records none (a boot "
                   "checkpoint); else it must match the recorded one")
      ->check(CLI::NonNegativeNumber);
  encode
      ->add_option("--level", enc.level,
                   "zstd level: 1 and below (default 1) parse the XOR stream's zero runs, the "
                   "fastest for sparse deltas; 2..22 use zstd's match finders")
      ->check(CLI::Range(-7, 22));
  encode->add_option("--shard-size", enc.shard_bytes, "Largest payload file, in bytes")
      ->check(CLI::PositiveNumber);
  encode->add_option("--run-id", enc.run_id, "Record the run in the index");
  encode->add_option("--threads", enc.threads, "Worker threads (default: one per core)")
      ->check(CLI::NonNegativeNumber);
  encode->callback([exit_code] { *exit_code = RunEncode(enc); });

  static ApplyArgs app_args;
  CLI::App* apply = delta->add_subcommand(
      "apply", "Materialize a checkpoint directory at the last delta's version");
  apply
      ->add_option("--anchor", app_args.anchor,
                   "FULL version or boot checkpoint the deltas start from")
      ->required();
  apply->add_option("--out", app_args.out, "Destination directory (updated atomically)")
      ->required();
  apply
      ->add_option("--anchor-version", app_args.anchor_version,
                   "The anchor's version when its index records none")
      ->check(CLI::NonNegativeNumber);
  apply->add_option("--run-id", app_args.run_id, "The run the versions must belong to");
  apply->add_option("--threads", app_args.threads, "Worker threads (default: one per core)")
      ->check(CLI::NonNegativeNumber);
  apply->add_option("deltas", app_args.deltas, "DELTA version directories after the anchor");
  apply->callback([exit_code] { *exit_code = RunApply(app_args); });

  static VerifyArgs ver;
  CLI::App* verify = delta->add_subcommand(
      "verify", "Check a version directory; with --base, also every checksum of a DELTA");
  verify->add_option("dir", ver.dir, "Version directory")->required();
  verify->add_option("--base", ver.base, "Complete checkpoint of the version a DELTA applies to");
  verify->add_option("--threads", ver.threads, "Worker threads (default: one per core)")
      ->check(CLI::NonNegativeNumber);
  verify->callback([exit_code] { *exit_code = RunVerify(ver); });

  static FullArgs full;
  CLI::App* f = delta->add_subcommand(
      "full", "Write a FULL version (an anchor): a copy of a checkpoint recording its version");
  f->add_option("--checkpoint", full.checkpoint, "Checkpoint directory")->required();
  f->add_option("--out", full.out, "Directory to create for the FULL version")->required();
  f->add_option("--version", full.version, "The version's number")
      ->required()
      ->check(CLI::NonNegativeNumber);
  f->add_option("--run-id", full.run_id, "Record the run in the index");
  f->callback([exit_code] { *exit_code = RunFull(full); });

  static PatchArgs patch;
  CLI::App* pt = delta->add_subcommand(
      "patch",
      "Write the in-place weight patch (changed elements, their XOR and new values) that brings "
      "an engine from --from to the version --target holds");
  pt->add_option("--target", patch.target,
                 "Checkpoint directory `stitch delta apply` materialized at the last delta")
      ->required();
  pt->add_option("--out", patch.out, "Patch file to write (safetensors)")->required();
  pt->add_option("--from", patch.from, "The version the engine holds (the first delta's base)")
      ->required()
      ->check(CLI::NonNegativeNumber);
  pt->add_option("--run-id", patch.run_id, "The run (default: the one --target holds)");
  pt->add_option("--max-density", patch.max_density,
                 "Refuse a patch changing more than this share of the values (default 0.3)")
      ->check(CLI::Range(0.0, 1.0));
  pt->add_option("deltas", patch.deltas, "DELTA version directories after --from, to --target")
      ->required();
  pt->callback([exit_code] { *exit_code = RunPatch(patch); });
}

}  // namespace stitch

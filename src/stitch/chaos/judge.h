// The chaos run's judge for the answers a real engine (vLLM, SGLang) served:
// Hugging Face transformers in a Python process of its own
// (tests/engines/chaos_judge.py, run with the engine's Python), asked one
// answer at a time over its standard input and output. It judges as the
// Oracle does (oracle.h: which versions, switching where, produced the
// answer; whether its version spans explain it), from the same weights: the
// base checkpoint on disk and each version's LM head, which this class writes
// for the judge before it asks about that version.
//
// Thread-safe: one question at a time.
#pragma once

#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <set>
#include <span>
#include <string>
#include "absl/synchronization/mutex.h"

#include "absl/base/thread_annotations.h"
#include "absl/status/statusor.h"
#include "stitch/api/response.h"
#include "stitch/chaos/oracle.h"

namespace stitch {

struct JudgeProcessOptions {
  std::filesystem::path python;  // with torch and transformers
  std::filesystem::path script;  // tests/engines/chaos_judge.py
  std::filesystem::path base_checkpoint;
  std::filesystem::path heads_dir;  // where the LM heads are written for it
  std::filesystem::path log;        // its standard error
  std::filesystem::path tmp_dir;    // its TMPDIR (torch caches compiled code there)
};

struct ExternalJudgement {
  Judgement judgement;
  // Whether the answer's spans explain it; nullopt when none were given.
  std::optional<bool> spans_explain;
};

class ExternalJudge {
 public:
  // Starts the judge and waits until it has loaded the model. `oracle`
  // (which gives every version's weights) must outlive the judge.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<ExternalJudge>> Start(
      JudgeProcessOptions options, Oracle& oracle);
  // Closes its input and waits for it to end (killing it after a while).
  ~ExternalJudge();
  ExternalJudge(const ExternalJudge&) = delete;
  ExternalJudge& operator=(const ExternalJudge&) = delete;

  // Judges an answer to `prompt` (token ids), `length` tokens asked for,
  // stamped [start, end]: its output ids `tokens` and, when given, its spans.
  // An error when the judge could not answer (it is then not a verdict).
  [[nodiscard]] absl::StatusOr<ExternalJudgement> Judge(std::span<const int32_t> prompt,
                                                        std::span<const int32_t> tokens,
                                                        int64_t length, int64_t start, int64_t end,
                                                        const VersionSpans* spans);

 private:
  ExternalJudge(JudgeProcessOptions options, Oracle& oracle)
      : options_(std::move(options)), oracle_(oracle) {}
  absl::StatusOr<std::string> ReadLine() ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);
  absl::Status WriteHead(int64_t version) ABSL_EXCLUSIVE_LOCKS_REQUIRED(mu_);

  const JudgeProcessOptions options_;
  Oracle& oracle_;
  absl::Mutex mu_;
  int pid_ ABSL_GUARDED_BY(mu_) = -1;
  int to_ ABSL_GUARDED_BY(mu_) = -1;    // its standard input
  int from_ ABSL_GUARDED_BY(mu_) = -1;  // its standard output
  std::string buffer_ ABSL_GUARDED_BY(mu_);
  std::set<int64_t> written_ ABSL_GUARDED_BY(mu_);
};

}  // namespace stitch

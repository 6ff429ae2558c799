// The chaos run's history: one JSON object per line (docs/chaos.md, "The
// history"), written while the run goes and read back by the checker.
//
// Every line has a "type": "run" (the seed, the schedule, what was left
// out), "request" (one rollout request: its constraint, what came back and
// which weights produced it), "fault" (one fault as it was applied),
// "publish" (one attempt to publish a version), "pointer" (a value of the
// store's pointer and whether it named complete bytes), "resources" (one
// process's memory and open files), "end" (what was checked after the
// fleet stopped).
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <string_view>
#include <variant>
#include <vector>
#include "absl/synchronization/mutex.h"

#include "absl/base/thread_annotations.h"
#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "stitch/chaos/schedule.h"
#include "stitch/core/constraint.h"

namespace stitch {

// How a request ended, as the figures count it.
enum class Outcome {
  kAnswered,    // 200 with a complete, stamped answer
  kRetryable,   // 409, 503, a refused or broken connection, a stream cut short
  kFailed,      // anything else: another status, a 200 without stamps, a bad body
  kClientLeft,  // the client left on purpose (client_disconnect)
};
std::string_view OutcomeName(Outcome outcome);

// Which weights produced an answer, as the oracle judged it.
enum class Verdict {
  kNone,      // nothing to judge (not answered)
  kSame,      // start == end and the output is that version's greedy output
  kCrossed,   // start < end, explained exactly by versions switching at token positions
  kUnjudged,  // start < end and the search for an explanation gave up (never a pass)
  kMismatch,  // no version the labels allow produced it: the label is wrong
};
std::string_view VerdictName(Verdict verdict);

struct RequestRecord {
  int64_t id = 0;
  std::string via;  // "gateway", or the replica ("r1") when sent to its sidecar
  // The replica that answered ("r1"): `via`, or the one the gateway named in
  // X-Stitch-Replica; empty when unknown.
  std::string served_by;
  std::string route;  // "generate" (SGLang) or "completions" (OpenAI)
  bool stream = false;
  std::string session;  // the session header's value; empty for none
  bool probe = false;   // the recovery probe: min_version = the pointer, through the gateway
  VersionConstraint constraint;
  int64_t pointer = -1;  // the store's pointer as the client knew it when sending
  double sent_s = 0;
  double done_s = 0;
  int status = 0;  // HTTP status; 0 when none arrived
  Outcome outcome = Outcome::kFailed;
  std::string error;             // why, unless answered
  std::optional<int64_t> start;  // weight_version_start
  std::optional<int64_t> end;    // weight_version_end
  int prompt = -1;
  int64_t max_tokens = 0;       // tokens asked for (greedy, ignore_eos)
  std::vector<int32_t> tokens;  // route generate: output_ids; completions: token_ids, if any
  std::string text;             // route completions: the text
  int events = 0;               // streamed events received
  Verdict verdict = Verdict::kNone;
  std::vector<int64_t> versions;   // kCrossed: the weights in order; kSame: the one
  std::vector<int> switch_at;      // kCrossed: the token at which each next version took over
  std::optional<int64_t> matches;  // kMismatch: the version whose greedy output it is, if any
  // weight_version_spans as answered (the last event's for a stream): its
  // JSON ("[[0,3],[5,4]]"), "unknown", or empty when the answer had none.
  std::string spans;
  // What the oracle made of them: "exact" (the versions they name, switching
  // where they say, produce the answer), "unknown", "wrong: <why>", or empty
  // (not checked: not answered, or no spans).
  std::string spans_check;
};

struct RunEntry {
  uint64_t seed = 0;
  double minutes = 0;
  std::string store;  // "fs" or "s3"
  int replicas = 0;
  std::string dir;
  std::string replay;  // the command that replays this run
  std::vector<Fault> schedule;
  std::vector<std::string> left_out;  // "store_full: <why>"
};

struct FaultEntry {
  Fault fault;
  double applied_s = 0;  // when it took effect
  double ended_s = 0;    // when it was undone (the process restarted, ...)
  bool skipped = false;  // could not be applied (the note says why)
  std::string note;
};

struct PublishEntry {
  int64_t version = 0;
  bool full = false;
  double started_s = 0;
  double done_s = 0;
  // "published", "killed", "failed: <why>", "published (seen after a kill)".
  std::string outcome;
};

struct PointerEntry {
  double at_s = 0;
  int64_t version = 0;
  bool complete = true;  // the version's bytes were complete and correct
  std::string detail;    // why not
};

struct ResourceEntry {
  double at_s = 0;
  std::string process;  // "engine r1", "sidecar r0", "gateway", "s3"
  int instance = 0;     // 0 for the first process of that name, 1 after a restart, ...
  int pid = 0;
  int64_t rss_kib = 0;
  int64_t open_files = 0;
};

struct EndEntry {
  double at_s = 0;
  int64_t final_pointer = -1;
  bool pointer_complete = true;
  std::string pointer_detail;
  bool converged = false;  // every replica served the final pointer, through the gateway
  std::string convergence;
  std::vector<std::string> leftover_processes;
  std::vector<std::string> leftover_temp;
  std::vector<std::string> unfinished;  // generations still running after the load stopped
  std::vector<std::string> notes;
};

using HistoryEntry = std::variant<RunEntry, RequestRecord, FaultEntry, PublishEntry, PointerEntry,
                                  ResourceEntry, EndEntry>;

// One line of JSON, without the newline.
std::string HistoryLine(const HistoryEntry& entry);

// Parses one line. InvalidArgument naming the field at fault.
[[nodiscard]] absl::StatusOr<HistoryEntry> ParseHistoryLine(std::string_view line);

// Every line of a history file. Errors name the file and the line.
[[nodiscard]] absl::StatusOr<std::vector<HistoryEntry>> ReadHistory(
    const std::filesystem::path& path);

// Appends entries to a history file, one line each, flushed as written (a
// run that dies keeps what it recorded). Thread-safe.
class HistoryWriter {
 public:
  // Creates or truncates `path`. Internal when it cannot be opened.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<HistoryWriter>> Open(
      const std::filesystem::path& path);

  void Write(const HistoryEntry& entry);
  // The first write error, if any.
  absl::Status status();

 private:
  explicit HistoryWriter(std::filesystem::path path) : path_(std::move(path)) {}

  const std::filesystem::path path_;
  absl::Mutex mu_;
  std::ofstream out_ ABSL_GUARDED_BY(mu_);
  absl::Status status_ ABSL_GUARDED_BY(mu_);
};

}  // namespace stitch

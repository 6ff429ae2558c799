#include "stitch/chaos/judge.h"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>

#include <boost/json.hpp>
#include <cerrno>
#include <chrono>
#include <thread>
#include <utility>
#include <vector>

#include "absl/strings/str_cat.h"
#include "stitch/io/fileio.h"

extern char** environ;

namespace stitch {
namespace {

namespace json = boost::json;

// Loading torch and the model, and one answer.
constexpr auto kStartTimeout = std::chrono::seconds(180);
constexpr auto kAnswerTimeout = std::chrono::seconds(120);
constexpr auto kExitGrace = std::chrono::seconds(10);

json::array Ids(std::span<const int32_t> ids) {
  json::array out;
  for (int32_t id : ids) out.emplace_back(id);
  return out;
}

std::vector<int64_t> Int64s(const json::value* v) {
  std::vector<int64_t> out;
  if (v == nullptr || !v->is_array()) return out;
  for (const json::value& x : v->get_array()) {
    if (x.is_int64()) out.push_back(x.get_int64());
  }
  return out;
}

}  // namespace

absl::StatusOr<std::unique_ptr<ExternalJudge>> ExternalJudge::Start(JudgeProcessOptions options,
                                                                    Oracle& oracle) {
  if (oracle.options().config.weight_dtype != DType::kBF16) {
    return absl::InvalidArgumentError("chaos: the transformers judge needs a bfloat16 model");
  }
  // A judge that exits makes writes to its pipe fail with EPIPE, not kill
  // the run.
  ::signal(SIGPIPE, SIG_IGN);
  std::unique_ptr<ExternalJudge> judge(new ExternalJudge(std::move(options), oracle));
  const JudgeProcessOptions& o = judge->options_;
  std::error_code ec;
  std::filesystem::create_directories(o.heads_dir, ec);
  int in[2];
  int out[2];
  if (::pipe2(in, O_CLOEXEC) != 0 || ::pipe2(out, O_CLOEXEC) != 0) {
    return absl::InternalError("chaos: cannot create the judge's pipes");
  }
  const int log = ::open(o.log.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_adddup2(&actions, in[0], STDIN_FILENO);
  posix_spawn_file_actions_adddup2(&actions, out[1], STDOUT_FILENO);
  if (log >= 0) posix_spawn_file_actions_adddup2(&actions, log, STDERR_FILENO);
  std::vector<std::string> args = {o.python.string(), o.script.string(),
                                   "--model",         o.base_checkpoint.string(),
                                   "--heads",         o.heads_dir.string()};
  std::vector<char*> argv;
  for (std::string& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  std::filesystem::create_directories(o.tmp_dir, ec);
  std::vector<std::string> env = {absl::StrCat("TMPDIR=", o.tmp_dir.string())};
  for (char** e = environ; *e != nullptr; ++e) {
    if (!std::string_view(*e).starts_with("TMPDIR=")) env.emplace_back(*e);
  }
  std::vector<char*> envp;
  for (std::string& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  int pid = -1;
  const int spawned = ::posix_spawn(&pid, argv[0], &actions, nullptr, argv.data(), envp.data());
  posix_spawn_file_actions_destroy(&actions);
  ::close(in[0]);
  ::close(out[1]);
  if (log >= 0) ::close(log);
  if (spawned != 0) {
    ::close(in[1]);
    ::close(out[0]);
    return absl::FailedPreconditionError(
        absl::StrCat("chaos: cannot start the judge ", o.python.string(), " ", o.script.string()));
  }
  absl::MutexLock lock(&judge->mu_);
  judge->pid_ = pid;
  judge->to_ = in[1];
  judge->from_ = out[0];
  const auto deadline = std::chrono::steady_clock::now() + kStartTimeout;
  for (;;) {
    absl::StatusOr<std::string> line = judge->ReadLine();
    if (line.ok() && *line == "ready") break;
    if (!line.ok() || std::chrono::steady_clock::now() >= deadline) {
      return absl::FailedPreconditionError(
          absl::StrCat("chaos: the transformers judge did not start (",
                       line.ok() ? absl::StrCat("it said \"", *line, "\"")
                                 : std::string(line.status().message()),
                       "); see ", o.log.string()));
    }
  }
  return judge;
}

ExternalJudge::~ExternalJudge() {
  absl::MutexLock lock(&mu_);
  if (to_ >= 0) ::close(to_);
  if (from_ >= 0) ::close(from_);
  if (pid_ <= 0) return;
  const auto deadline = std::chrono::steady_clock::now() + kExitGrace;
  while (::waitpid(pid_, nullptr, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() >= deadline) {
      ::kill(pid_, SIGKILL);
      ::waitpid(pid_, nullptr, 0);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
}

absl::StatusOr<std::string> ExternalJudge::ReadLine() {
  const auto deadline = std::chrono::steady_clock::now() + kAnswerTimeout;
  for (;;) {
    if (const size_t nl = buffer_.find('\n'); nl != std::string::npos) {
      std::string line = buffer_.substr(0, nl);
      buffer_.erase(0, nl + 1);
      return line;
    }
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) return absl::DeadlineExceededError("the judge did not answer");
    pollfd p{from_, POLLIN, 0};
    const int ready = ::poll(&p, 1, static_cast<int>(left.count()));
    if (ready < 0 && errno == EINTR) continue;
    if (ready <= 0) return absl::DeadlineExceededError("the judge did not answer");
    char chunk[4096];
    const ssize_t n = ::read(from_, chunk, sizeof(chunk));
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return absl::UnavailableError("the judge exited");
    buffer_.append(chunk, static_cast<size_t>(n));
  }
}

absl::Status ExternalJudge::WriteHead(int64_t version) {
  if (written_.contains(version)) return absl::OkStatus();
  for (const HostTensor& t : oracle_.Tensors(version)) {
    if (t.name != "lm_head.weight") continue;
    const std::string_view bytes(reinterpret_cast<const char*>(t.data.data()), t.data.size());
    absl::Status s =
        WriteFileAtomically(options_.heads_dir / absl::StrCat("lm_head.v", version, ".bin"), bytes);
    if (s.ok()) written_.insert(version);
    return s;
  }
  return absl::InternalError("chaos: the model has no lm_head.weight");
}

absl::StatusOr<ExternalJudgement> ExternalJudge::Judge(std::span<const int32_t> prompt,
                                                       std::span<const int32_t> tokens,
                                                       int64_t length, int64_t start, int64_t end,
                                                       const VersionSpans* spans) {
  absl::MutexLock lock(&mu_);
  for (int64_t v = std::max<int64_t>(0, start - 8); v <= end + 8; ++v) {
    if (absl::Status s = WriteHead(v); !s.ok()) return s;
  }
  json::object q;
  q["prompt"] = Ids(prompt);
  q["tokens"] = Ids(tokens);
  q["length"] = length;
  q["start"] = start;
  q["end"] = end;
  if (spans != nullptr) {
    json::array list;
    for (const VersionSpan& s : *spans) list.push_back(json::array{s.offset, s.version});
    q["spans"] = std::move(list);
  }
  std::string line = json::serialize(q) + "\n";
  for (size_t done = 0; done < line.size();) {
    const ssize_t n = ::write(to_, line.data() + done, line.size() - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return absl::UnavailableError("the judge exited");
    done += static_cast<size_t>(n);
  }
  absl::StatusOr<std::string> answer = ReadLine();
  if (!answer.ok()) return answer.status();
  boost::system::error_code ec;
  json::value doc = json::parse(*answer, ec);
  if (ec || !doc.is_object()) {
    return absl::InternalError(absl::StrCat("the judge answered \"", *answer, "\""));
  }
  const json::object& a = doc.get_object();
  if (const json::value* e = a.if_contains("error"); e != nullptr) {
    return absl::InternalError(absl::StrCat("the judge failed: ", json::serialize(*e)));
  }
  ExternalJudgement out;
  const json::value* verdict = a.if_contains("verdict");
  const std::string_view name =
      verdict != nullptr && verdict->is_string() ? std::string_view(verdict->get_string()) : "";
  if (name == "same") {
    out.judgement.verdict = Verdict::kSame;
  } else if (name == "crossed") {
    out.judgement.verdict = Verdict::kCrossed;
  } else if (name == "mismatch") {
    out.judgement.verdict = Verdict::kMismatch;
  } else {
    return absl::InternalError(absl::StrCat("the judge answered \"", *answer, "\""));
  }
  out.judgement.versions = Int64s(a.if_contains("versions"));
  for (int64_t at : Int64s(a.if_contains("switch_at"))) {
    out.judgement.switch_at.push_back(static_cast<int>(at));
  }
  if (const json::value* m = a.if_contains("matches"); m != nullptr && m->is_int64()) {
    out.judgement.matches = m->get_int64();
  }
  if (const json::value* s = a.if_contains("spans"); s != nullptr && s->is_bool()) {
    out.spans_explain = s->get_bool();
  }
  return out;
}

}  // namespace stitch

#include "stitch/chaos/history.h"

#include <memory>
#include <utility>

#include <boost/json/array.hpp>
#include <boost/json/object.hpp>
#include <boost/json/parse.hpp>
#include <boost/json/serialize.hpp>
#include <boost/json/value.hpp>

#include "absl/strings/str_cat.h"

namespace stitch {
namespace {

namespace json = boost::json;

// --- writing ------------------------------------------------------------------

json::array Strings(const std::vector<std::string>& values) {
  json::array out;
  for (const std::string& v : values) out.emplace_back(v);
  return out;
}

template <typename T>
json::array Numbers(const std::vector<T>& values) {
  json::array out;
  for (T v : values) out.emplace_back(static_cast<int64_t>(v));
  return out;
}

json::object FaultObject(const Fault& f) {
  json::object o;
  o["id"] = f.id;
  o["kind"] = std::string(FaultKindName(f.kind));
  o["start_s"] = f.start_s;
  o["duration_s"] = f.duration_s;
  o["replica"] = f.replica;
  o["param"] = f.param;
  return o;
}

json::object ConstraintObject(const VersionConstraint& c) {
  json::object o;
  if (c.exact_version.has_value()) o["exact_version"] = *c.exact_version;
  if (c.min_version.has_value()) o["min_version"] = *c.min_version;
  return o;
}

json::object ToObject(const RunEntry& e) {
  json::object o;
  o["type"] = "run";
  o["seed"] = e.seed;
  o["minutes"] = e.minutes;
  o["store"] = e.store;
  o["replicas"] = e.replicas;
  o["dir"] = e.dir;
  o["replay"] = e.replay;
  json::array schedule;
  for (const Fault& f : e.schedule) schedule.emplace_back(FaultObject(f));
  o["schedule"] = std::move(schedule);
  o["left_out"] = Strings(e.left_out);
  return o;
}

json::object ToObject(const RequestRecord& r) {
  json::object o;
  o["type"] = "request";
  o["id"] = r.id;
  o["via"] = r.via;
  if (!r.served_by.empty()) o["served_by"] = r.served_by;
  o["route"] = r.route;
  o["stream"] = r.stream;
  if (!r.session.empty()) o["session"] = r.session;
  if (r.probe) o["probe"] = true;
  o["constraint"] = ConstraintObject(r.constraint);
  o["pointer"] = r.pointer;
  o["sent_s"] = r.sent_s;
  o["done_s"] = r.done_s;
  o["status"] = r.status;
  o["outcome"] = std::string(OutcomeName(r.outcome));
  if (!r.error.empty()) o["error"] = r.error;
  if (r.start.has_value()) o["start"] = *r.start;
  if (r.end.has_value()) o["end"] = *r.end;
  o["prompt"] = r.prompt;
  o["max_tokens"] = r.max_tokens;
  if (!r.tokens.empty()) o["tokens"] = Numbers(r.tokens);
  if (!r.text.empty()) o["text"] = r.text;
  if (r.stream) o["events"] = r.events;
  o["verdict"] = std::string(VerdictName(r.verdict));
  if (!r.versions.empty()) o["versions"] = Numbers(r.versions);
  if (!r.switch_at.empty()) o["switch_at"] = Numbers(r.switch_at);
  if (r.matches.has_value()) o["matches"] = *r.matches;
  if (!r.spans.empty()) o["spans"] = r.spans;
  if (!r.spans_check.empty()) o["spans_check"] = r.spans_check;
  return o;
}

json::object ToObject(const FaultEntry& e) {
  json::object o = FaultObject(e.fault);
  o["type"] = "fault";
  o["applied_s"] = e.applied_s;
  o["ended_s"] = e.ended_s;
  if (e.skipped) o["skipped"] = true;
  if (!e.note.empty()) o["note"] = e.note;
  return o;
}

json::object ToObject(const PublishEntry& e) {
  json::object o;
  o["type"] = "publish";
  o["version"] = e.version;
  o["full"] = e.full;
  o["started_s"] = e.started_s;
  o["done_s"] = e.done_s;
  o["outcome"] = e.outcome;
  return o;
}

json::object ToObject(const PointerEntry& e) {
  json::object o;
  o["type"] = "pointer";
  o["at_s"] = e.at_s;
  o["version"] = e.version;
  o["complete"] = e.complete;
  if (!e.detail.empty()) o["detail"] = e.detail;
  return o;
}

json::object ToObject(const ResourceEntry& e) {
  json::object o;
  o["type"] = "resources";
  o["at_s"] = e.at_s;
  o["process"] = e.process;
  o["instance"] = e.instance;
  o["pid"] = e.pid;
  o["rss_kib"] = e.rss_kib;
  o["open_files"] = e.open_files;
  return o;
}

json::object ToObject(const EndEntry& e) {
  json::object o;
  o["type"] = "end";
  o["at_s"] = e.at_s;
  o["final_pointer"] = e.final_pointer;
  o["pointer_complete"] = e.pointer_complete;
  if (!e.pointer_detail.empty()) o["pointer_detail"] = e.pointer_detail;
  o["converged"] = e.converged;
  if (!e.convergence.empty()) o["convergence"] = e.convergence;
  o["leftover_processes"] = Strings(e.leftover_processes);
  o["leftover_temp"] = Strings(e.leftover_temp);
  o["unfinished"] = Strings(e.unfinished);
  o["notes"] = Strings(e.notes);
  return o;
}

// --- reading ------------------------------------------------------------------

class Reader {
 public:
  explicit Reader(const json::object& o) : o_(o) {}

  absl::Status status() const { return status_; }

  const json::value* Find(std::string_view name) {
    return o_.if_contains(json::string_view(name.data(), name.size()));
  }

  std::string String(std::string_view name, bool required = false) {
    const json::value* v = Find(name);
    if (v == nullptr) {
      if (required) Fail(name, "is missing");
      return {};
    }
    if (!v->is_string()) {
      Fail(name, "is not a string");
      return {};
    }
    return std::string(v->get_string());
  }

  int64_t Int(std::string_view name, bool required = false) {
    std::optional<int64_t> v = OptionalInt(name);
    if (!v.has_value() && required) Fail(name, "is missing");
    return v.value_or(0);
  }

  std::optional<int64_t> OptionalInt(std::string_view name) {
    const json::value* v = Find(name);
    if (v == nullptr || v->is_null()) return std::nullopt;
    if (v->is_int64()) return v->get_int64();
    if (v->is_uint64()) return static_cast<int64_t>(v->get_uint64());
    Fail(name, "is not an integer");
    return std::nullopt;
  }

  uint64_t Unsigned(std::string_view name) {
    const json::value* v = Find(name);
    if (v == nullptr) return 0;
    if (v->is_uint64()) return v->get_uint64();
    if (v->is_int64() && v->get_int64() >= 0) return static_cast<uint64_t>(v->get_int64());
    Fail(name, "is not an unsigned integer");
    return 0;
  }

  double Double(std::string_view name) {
    const json::value* v = Find(name);
    if (v == nullptr) return 0;
    if (v->is_double()) return v->get_double();
    if (v->is_int64()) return static_cast<double>(v->get_int64());
    if (v->is_uint64()) return static_cast<double>(v->get_uint64());
    Fail(name, "is not a number");
    return 0;
  }

  bool Bool(std::string_view name) {
    const json::value* v = Find(name);
    if (v == nullptr) return false;
    if (!v->is_bool()) {
      Fail(name, "is not a boolean");
      return false;
    }
    return v->get_bool();
  }

  std::vector<std::string> StringList(std::string_view name) {
    std::vector<std::string> out;
    const json::value* v = Find(name);
    if (v == nullptr) return out;
    if (!v->is_array()) {
      Fail(name, "is not an array");
      return out;
    }
    for (const json::value& item : v->get_array()) {
      if (!item.is_string()) {
        Fail(name, "holds a non-string");
        return out;
      }
      out.emplace_back(item.get_string());
    }
    return out;
  }

  template <typename T>
  std::vector<T> IntList(std::string_view name) {
    std::vector<T> out;
    const json::value* v = Find(name);
    if (v == nullptr) return out;
    if (!v->is_array()) {
      Fail(name, "is not an array");
      return out;
    }
    for (const json::value& item : v->get_array()) {
      if (!item.is_int64()) {
        Fail(name, "holds a non-integer");
        return out;
      }
      out.push_back(static_cast<T>(item.get_int64()));
    }
    return out;
  }

  void Fail(std::string_view name, std::string_view what) {
    if (status_.ok()) {
      status_ = absl::InvalidArgumentError(
          absl::StrCat("chaos history: \"", absl::string_view(name.data(), name.size()), "\" ",
                       absl::string_view(what.data(), what.size())));
    }
  }

 private:
  const json::object& o_;
  absl::Status status_;
};

Fault ReadFault(Reader& r) {
  Fault f;
  f.id = static_cast<int>(r.Int("id"));
  const std::string kind = r.String("kind", true);
  if (std::optional<FaultKind> k = ParseFaultKind(kind); k.has_value()) {
    f.kind = *k;
  } else if (!kind.empty()) {
    r.Fail("kind", absl::StrCat("names no fault kind: ", kind));
  }
  f.start_s = r.Double("start_s");
  f.duration_s = r.Double("duration_s");
  f.replica = static_cast<int>(r.Int("replica"));
  f.param = r.Double("param");
  return f;
}

absl::StatusOr<HistoryEntry> Finish(const Reader& r, HistoryEntry entry) {
  if (!r.status().ok()) return r.status();
  return entry;
}

absl::StatusOr<HistoryEntry> ReadRun(Reader& r) {
  RunEntry e;
  e.seed = r.Unsigned("seed");
  e.minutes = r.Double("minutes");
  e.store = r.String("store");
  e.replicas = static_cast<int>(r.Int("replicas"));
  e.dir = r.String("dir");
  e.replay = r.String("replay");
  if (const json::value* s = r.Find("schedule"); s != nullptr && s->is_array()) {
    for (const json::value& item : s->get_array()) {
      if (!item.is_object()) return absl::InvalidArgumentError("chaos history: bad schedule");
      Reader fr(item.get_object());
      e.schedule.push_back(ReadFault(fr));
      if (!fr.status().ok()) return fr.status();
    }
  }
  e.left_out = r.StringList("left_out");
  return Finish(r, e);
}

Outcome ReadOutcome(Reader& r) {
  const std::string outcome = r.String("outcome", true);
  for (Outcome o :
       {Outcome::kAnswered, Outcome::kRetryable, Outcome::kFailed, Outcome::kClientLeft}) {
    if (OutcomeName(o) == outcome) return o;
  }
  r.Fail("outcome", absl::StrCat("names no outcome: ", outcome));
  return RequestRecord{}.outcome;
}

Verdict ReadVerdict(Reader& r) {
  const std::string verdict = r.String("verdict");
  for (Verdict v : {Verdict::kNone, Verdict::kSame, Verdict::kCrossed, Verdict::kUnjudged,
                    Verdict::kMismatch}) {
    if (VerdictName(v) == verdict) return v;
  }
  r.Fail("verdict", absl::StrCat("names no verdict: ", verdict));
  return RequestRecord{}.verdict;
}

absl::StatusOr<HistoryEntry> ReadRequest(Reader& r) {
  RequestRecord q;
  q.id = r.Int("id", true);
  q.via = r.String("via", true);
  q.served_by = r.String("served_by");
  q.route = r.String("route", true);
  q.stream = r.Bool("stream");
  q.session = r.String("session");
  q.probe = r.Bool("probe");
  if (const json::value* c = r.Find("constraint"); c != nullptr && c->is_object()) {
    Reader cr(c->get_object());
    q.constraint.exact_version = cr.OptionalInt("exact_version");
    q.constraint.min_version = cr.OptionalInt("min_version");
    if (!cr.status().ok()) return cr.status();
  }
  q.pointer = r.Int("pointer");
  q.sent_s = r.Double("sent_s");
  q.done_s = r.Double("done_s");
  q.status = static_cast<int>(r.Int("status"));
  q.outcome = ReadOutcome(r);
  q.error = r.String("error");
  q.start = r.OptionalInt("start");
  q.end = r.OptionalInt("end");
  q.prompt = static_cast<int>(r.Int("prompt"));
  q.max_tokens = r.Int("max_tokens");
  q.tokens = r.IntList<int32_t>("tokens");
  q.text = r.String("text");
  q.events = static_cast<int>(r.Int("events"));
  q.verdict = ReadVerdict(r);
  q.versions = r.IntList<int64_t>("versions");
  q.switch_at = r.IntList<int>("switch_at");
  q.matches = r.OptionalInt("matches");
  q.spans = r.String("spans");
  q.spans_check = r.String("spans_check");
  return Finish(r, q);
}

absl::StatusOr<HistoryEntry> ReadFaultEntry(Reader& r) {
  FaultEntry e;
  e.fault = ReadFault(r);
  e.applied_s = r.Double("applied_s");
  e.ended_s = r.Double("ended_s");
  e.skipped = r.Bool("skipped");
  e.note = r.String("note");
  return Finish(r, e);
}

absl::StatusOr<HistoryEntry> ReadPublish(Reader& r) {
  PublishEntry e;
  e.version = r.Int("version", true);
  e.full = r.Bool("full");
  e.started_s = r.Double("started_s");
  e.done_s = r.Double("done_s");
  e.outcome = r.String("outcome");
  return Finish(r, e);
}

absl::StatusOr<HistoryEntry> ReadPointer(Reader& r) {
  PointerEntry e;
  e.at_s = r.Double("at_s");
  e.version = r.Int("version", true);
  e.complete = r.Bool("complete");
  e.detail = r.String("detail");
  return Finish(r, e);
}

absl::StatusOr<HistoryEntry> ReadResources(Reader& r) {
  ResourceEntry e;
  e.at_s = r.Double("at_s");
  e.process = r.String("process", true);
  e.instance = static_cast<int>(r.Int("instance"));
  e.pid = static_cast<int>(r.Int("pid"));
  e.rss_kib = r.Int("rss_kib");
  e.open_files = r.Int("open_files");
  return Finish(r, e);
}

absl::StatusOr<HistoryEntry> ReadEnd(Reader& r) {
  EndEntry e;
  e.at_s = r.Double("at_s");
  e.final_pointer = r.Int("final_pointer");
  e.pointer_complete = r.Bool("pointer_complete");
  e.pointer_detail = r.String("pointer_detail");
  e.converged = r.Bool("converged");
  e.convergence = r.String("convergence");
  e.leftover_processes = r.StringList("leftover_processes");
  e.leftover_temp = r.StringList("leftover_temp");
  e.unfinished = r.StringList("unfinished");
  e.notes = r.StringList("notes");
  return Finish(r, e);
}

}  // namespace

std::string_view OutcomeName(Outcome outcome) {
  switch (outcome) {
    case Outcome::kAnswered:
      return "answered";
    case Outcome::kRetryable:
      return "retryable";
    case Outcome::kFailed:
      return "failed";
    case Outcome::kClientLeft:
      return "client_left";
  }
  return "?";
}

std::string_view VerdictName(Verdict verdict) {
  switch (verdict) {
    case Verdict::kNone:
      return "none";
    case Verdict::kSame:
      return "same";
    case Verdict::kCrossed:
      return "crossed";
    case Verdict::kUnjudged:
      return "unjudged";
    case Verdict::kMismatch:
      return "mismatch";
  }
  return "?";
}

std::string HistoryLine(const HistoryEntry& entry) {
  return std::visit([](const auto& e) { return json::serialize(ToObject(e)); }, entry);
}

absl::StatusOr<HistoryEntry> ParseHistoryLine(std::string_view line) {
  boost::system::error_code ec;
  json::value doc = json::parse(json::string_view(line.data(), line.size()), ec);
  if (ec || !doc.is_object()) {
    return absl::InvalidArgumentError("chaos history: a line is not a JSON object");
  }
  Reader r(doc.get_object());
  const std::string type = r.String("type", true);
  using LineReader = absl::StatusOr<HistoryEntry> (*)(Reader&);
  static constexpr std::pair<std::string_view, LineReader> kReaders[] = {
      {"run", ReadRun},         {"request", ReadRequest}, {"fault", ReadFaultEntry},
      {"publish", ReadPublish}, {"pointer", ReadPointer}, {"resources", ReadResources},
      {"end", ReadEnd},
  };
  for (const auto& [name, read] : kReaders) {
    if (type == name) return read(r);
  }
  if (!r.status().ok()) return r.status();
  return absl::InvalidArgumentError(
      absl::StrCat("chaos history: unknown line type \"", type, "\""));
}

absl::StatusOr<std::vector<HistoryEntry>> ReadHistory(const std::filesystem::path& path) {
  std::ifstream in(path);
  if (!in) {
    return absl::NotFoundError(absl::StrCat("chaos: cannot read the history ", path.string()));
  }
  std::vector<HistoryEntry> out;
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    if (line.empty()) continue;
    auto entry = ParseHistoryLine(line);
    if (!entry.ok()) {
      return absl::InvalidArgumentError(
          absl::StrCat(path.string(), ":", number, ": ", entry.status().message()));
    }
    out.push_back(*std::move(entry));
  }
  return out;
}

absl::StatusOr<std::unique_ptr<HistoryWriter>> HistoryWriter::Open(
    const std::filesystem::path& path) {
  std::unique_ptr<HistoryWriter> writer(new HistoryWriter(path));
  {
    absl::MutexLock lock(&writer->mu_);
    writer->out_.open(path, std::ios::trunc);
    if (!writer->out_) {
      return absl::InternalError(absl::StrCat("chaos: cannot write the history ", path.string()));
    }
  }
  return writer;
}

void HistoryWriter::Write(const HistoryEntry& entry) {
  const std::string line = HistoryLine(entry);
  absl::MutexLock lock(&mu_);
  out_ << line << '\n';
  out_.flush();
  if (!out_ && status_.ok()) {
    status_ =
        absl::InternalError(absl::StrCat("chaos: writing the history ", path_.string(), " failed"));
  }
}

absl::Status HistoryWriter::status() {
  absl::MutexLock lock(&mu_);
  return status_;
}

}  // namespace stitch

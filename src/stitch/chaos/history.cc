#include "stitch/chaos/history.h"

#include <concepts>
#include <memory>
#include <type_traits>
#include <utility>

#include <boost/json/array.hpp>
#include <boost/json/object.hpp>
#include <boost/json/parse.hpp>
#include <boost/json/serialize.hpp>
#include <boost/json/value.hpp>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "stitch/core/errors.h"

namespace stitch {
namespace {

namespace json = boost::json;

// Each line's fields are named once, in Fields() below, for both directions:
// a JsonWriter writes them, a JsonReader reads them back.
enum class Rule {
  kKept,              // written always; read when present
  kRequired,          // written always; a line without it is refused
  kOmittedWhenEmpty,  // written only when not empty (a string, a list, an
                      // unset optional, false, 0); read when present
};

template <typename E, typename T>
concept EntryOf = std::same_as<std::remove_const_t<E>, T>;

template <typename Io, EntryOf<Fault> E>
void Fields(Io& io, E& f) {
  io("id", f.id);
  io("kind", f.kind, Rule::kRequired);
  io("start_s", f.start_s);
  io("duration_s", f.duration_s);
  io("replica", f.replica);
  io("param", f.param);
}

template <typename Io, EntryOf<RunEntry> E>
void Fields(Io& io, E& e) {
  io("seed", e.seed);
  io("minutes", e.minutes);
  io("store", e.store);
  io("replicas", e.replicas);
  io("dir", e.dir);
  io("replay", e.replay);
  io("schedule", e.schedule);
  io("left_out", e.left_out);
}

template <typename Io, EntryOf<RequestRecord> E>
void Fields(Io& io, E& r) {
  constexpr Rule kOmitted = Rule::kOmittedWhenEmpty;
  io("id", r.id, Rule::kRequired);
  io("via", r.via, Rule::kRequired);
  io("served_by", r.served_by, kOmitted);
  io("route", r.route, Rule::kRequired);
  io("stream", r.stream);
  io("session", r.session, kOmitted);
  io("probe", r.probe, kOmitted);
  io("constraint", r.constraint);
  io("pointer", r.pointer);
  io("sent_s", r.sent_s);
  io("done_s", r.done_s);
  io("status", r.status);
  io("outcome", r.outcome, Rule::kRequired);
  io("error", r.error, kOmitted);
  io("start", r.start, kOmitted);
  io("end", r.end, kOmitted);
  io("prompt", r.prompt);
  io("max_tokens", r.max_tokens);
  io("tokens", r.tokens, kOmitted);
  io("text", r.text, kOmitted);
  io("events", r.events, kOmitted);
  io("verdict", r.verdict, Rule::kRequired);
  io("versions", r.versions, kOmitted);
  io("switch_at", r.switch_at, kOmitted);
  io("matches", r.matches, kOmitted);
  io("spans", r.spans, kOmitted);
  io("spans_check", r.spans_check, kOmitted);
}

template <typename Io, EntryOf<FaultEntry> E>
void Fields(Io& io, E& e) {
  Fields(io, e.fault);  // the fault's own fields, in the same object
  io("applied_s", e.applied_s);
  io("ended_s", e.ended_s);
  io("skipped", e.skipped, Rule::kOmittedWhenEmpty);
  io("note", e.note, Rule::kOmittedWhenEmpty);
}

template <typename Io, EntryOf<PublishEntry> E>
void Fields(Io& io, E& e) {
  io("version", e.version, Rule::kRequired);
  io("full", e.full);
  io("started_s", e.started_s);
  io("done_s", e.done_s);
  io("outcome", e.outcome);
}

template <typename Io, EntryOf<PointerEntry> E>
void Fields(Io& io, E& e) {
  io("at_s", e.at_s);
  io("version", e.version, Rule::kRequired);
  io("complete", e.complete);
  io("detail", e.detail, Rule::kOmittedWhenEmpty);
}

template <typename Io, EntryOf<ResourceEntry> E>
void Fields(Io& io, E& e) {
  io("at_s", e.at_s);
  io("process", e.process, Rule::kRequired);
  io("instance", e.instance);
  io("pid", e.pid);
  io("rss_kib", e.rss_kib);
  io("open_files", e.open_files);
}

template <typename Io, EntryOf<EndEntry> E>
void Fields(Io& io, E& e) {
  io("at_s", e.at_s);
  io("final_pointer", e.final_pointer);
  io("pointer_complete", e.pointer_complete);
  io("pointer_detail", e.pointer_detail, Rule::kOmittedWhenEmpty);
  io("converged", e.converged);
  io("convergence", e.convergence, Rule::kOmittedWhenEmpty);
  io("leftover_processes", e.leftover_processes);
  io("leftover_temp", e.leftover_temp);
  io("unfinished", e.unfinished);
  io("notes", e.notes);
}

// Every line's "type", with the entry it holds.
template <typename T>
constexpr std::string_view kLineType = "";
template <>
constexpr std::string_view kLineType<RunEntry> = "run";
template <>
constexpr std::string_view kLineType<RequestRecord> = "request";
template <>
constexpr std::string_view kLineType<FaultEntry> = "fault";
template <>
constexpr std::string_view kLineType<PublishEntry> = "publish";
template <>
constexpr std::string_view kLineType<PointerEntry> = "pointer";
template <>
constexpr std::string_view kLineType<ResourceEntry> = "resources";
template <>
constexpr std::string_view kLineType<EndEntry> = "end";

absl::string_view Text(const json::string& s) { return {s.data(), s.size()}; }

// The enumerations' names, both ways.
constexpr Outcome kOutcomes[] = {Outcome::kAnswered, Outcome::kRetryable, Outcome::kFailed,
                                 Outcome::kClientLeft};
constexpr Verdict kVerdicts[] = {Verdict::kNone, Verdict::kSame, Verdict::kCrossed,
                                 Verdict::kUnjudged, Verdict::kMismatch};

// --- writing ------------------------------------------------------------------

class JsonWriter {
 public:
  explicit JsonWriter(json::object& out) : out_(out) {}

  template <typename T>
  void operator()(std::string_view name, const T& value, Rule rule = Rule::kKept) {
    if (rule == Rule::kOmittedWhenEmpty && IsEmpty(value)) return;
    out_[json::string_view(name.data(), name.size())] = ToJson(value);
  }

 private:
  template <typename T>
  static bool IsEmpty(const T& value) {
    if constexpr (requires { value.empty(); }) {
      return value.empty();
    } else if constexpr (requires { value.has_value(); }) {
      return !value.has_value();
    } else {
      return value == T{};
    }
  }

  template <typename T>
  static json::value ToJson(const T& value) {
    if constexpr (std::is_same_v<T, bool> || std::is_same_v<T, double> ||
                  std::is_same_v<T, std::string> || std::is_same_v<T, uint64_t>) {
      return json::value(value);
    } else if constexpr (std::is_integral_v<T>) {
      return json::value(static_cast<int64_t>(value));
    } else if constexpr (std::is_same_v<T, std::optional<int64_t>>) {
      return value.has_value() ? json::value(*value) : json::value(nullptr);
    } else if constexpr (std::is_same_v<T, Outcome>) {
      return json::value(std::string(OutcomeName(value)));
    } else if constexpr (std::is_same_v<T, Verdict>) {
      return json::value(std::string(VerdictName(value)));
    } else if constexpr (std::is_same_v<T, FaultKind>) {
      return json::value(std::string(FaultKindName(value)));
    } else if constexpr (std::is_same_v<T, VersionConstraint>) {
      json::object o;
      JsonWriter w(o);
      w("exact_version", value.exact_version, Rule::kOmittedWhenEmpty);
      w("min_version", value.min_version, Rule::kOmittedWhenEmpty);
      return o;
    } else if constexpr (std::is_same_v<T, std::vector<Fault>>) {
      json::array out;
      for (const Fault& f : value) {
        json::object o;
        JsonWriter w(o);
        Fields(w, f);
        out.emplace_back(std::move(o));
      }
      return out;
    } else {  // a list of strings or integers
      json::array out;
      for (const auto& item : value) out.push_back(ToJson(item));
      return out;
    }
  }

  json::object& out_;
};

template <typename Entry>
json::object ToObject(const Entry& e) {
  json::object o;
  JsonWriter w(o);
  w("type", std::string(kLineType<Entry>));
  Fields(w, e);
  return o;
}

// --- reading ------------------------------------------------------------------

class JsonReader {
 public:
  explicit JsonReader(const json::object& o) : o_(o) {}

  absl::Status status() const { return status_; }

  template <typename T>
  void operator()(std::string_view name, T& value, Rule rule = Rule::kKept) {
    const json::value* v = o_.if_contains(json::string_view(name.data(), name.size()));
    if (v == nullptr || (v->is_null() && rule != Rule::kRequired)) {
      if (rule == Rule::kRequired) Fail(name, "is missing");
      return;
    }
    if (!status_.ok()) return;
    if (absl::Status s = Read(*v, value); !s.ok()) Fail(name, s.message());
  }

 private:
  static absl::Status Wrong(std::string_view what) {
    return absl::InvalidArgumentError(absl::string_view(what.data(), what.size()));
  }

  static absl::Status Read(const json::value& v, std::string& out) {
    if (!v.is_string()) return Wrong("is not a string");
    out = std::string(v.get_string());
    return absl::OkStatus();
  }
  static absl::Status Read(const json::value& v, bool& out) {
    if (!v.is_bool()) return Wrong("is not a boolean");
    out = v.get_bool();
    return absl::OkStatus();
  }
  static absl::Status Read(const json::value& v, double& out) {
    if (!v.is_number()) return Wrong("is not a number");
    out = v.to_number<double>();
    return absl::OkStatus();
  }
  static absl::Status Read(const json::value& v, uint64_t& out) {
    if (v.is_uint64()) {
      out = v.get_uint64();
    } else if (v.is_int64() && v.get_int64() >= 0) {
      out = static_cast<uint64_t>(v.get_int64());
    } else {
      return Wrong("is not an unsigned integer");
    }
    return absl::OkStatus();
  }
  template <typename T>
  requires std::is_integral_v<T> && std::is_signed_v<T>
  static absl::Status Read(const json::value& v, T& out) {
    if (v.is_int64()) {
      out = static_cast<T>(v.get_int64());
    } else if (v.is_uint64()) {
      out = static_cast<T>(v.get_uint64());
    } else {
      return Wrong("is not an integer");
    }
    return absl::OkStatus();
  }
  static absl::Status Read(const json::value& v, std::optional<int64_t>& out) {
    int64_t value = 0;
    if (absl::Status s = Read(v, value); !s.ok()) return s;
    out = value;
    return absl::OkStatus();
  }
  template <typename Enum, size_t N>
  static absl::Status ReadName(const json::value& v, Enum& out, const Enum (&all)[N],
                               std::string_view (*name)(Enum), std::string_view what) {
    if (!v.is_string()) return Wrong("is not a string");
    for (Enum e : all) {
      if (name(e) == std::string_view(v.get_string())) {
        out = e;
        return absl::OkStatus();
      }
    }
    return Wrong(absl::StrCat("names no ", AbslView(what), ": ", Text(v.get_string())));
  }
  static absl::Status Read(const json::value& v, Outcome& out) {
    return ReadName(v, out, kOutcomes, &OutcomeName, "outcome");
  }
  static absl::Status Read(const json::value& v, Verdict& out) {
    return ReadName(v, out, kVerdicts, &VerdictName, "verdict");
  }
  static absl::Status Read(const json::value& v, FaultKind& out) {
    if (!v.is_string()) return Wrong("is not a string");
    std::optional<FaultKind> kind = ParseFaultKind(std::string_view(v.get_string()));
    if (!kind.has_value()) {
      return Wrong(absl::StrCat("names no fault kind: ", Text(v.get_string())));
    }
    out = *kind;
    return absl::OkStatus();
  }
  static absl::Status Read(const json::value& v, VersionConstraint& out) {
    if (!v.is_object()) return Wrong("is not an object");
    JsonReader r(v.get_object());
    r("exact_version", out.exact_version);
    r("min_version", out.min_version);
    return r.status();
  }
  static absl::Status Read(const json::value& v, std::vector<Fault>& out) {
    if (!v.is_array()) return Wrong("is not an array");
    for (const json::value& item : v.get_array()) {
      if (!item.is_object()) return Wrong("holds a non-object");
      JsonReader r(item.get_object());
      Fields(r, out.emplace_back());
      if (!r.status().ok()) return r.status();
    }
    return absl::OkStatus();
  }
  template <typename T>
  static absl::Status Read(const json::value& v, std::vector<T>& out) {
    if (!v.is_array()) return Wrong("is not an array");
    for (const json::value& item : v.get_array()) {
      if (absl::Status s = Read(item, out.emplace_back()); !s.ok()) {
        return Wrong(absl::StrCat("holds an item that ", s.message()));
      }
    }
    return absl::OkStatus();
  }

  void Fail(std::string_view name, absl::string_view what) {
    if (!status_.ok()) return;
    // A nested reader's message already says "chaos history: ...".
    if (absl::StartsWith(what, "chaos history: ")) {
      status_ = absl::InvalidArgumentError(what);
      return;
    }
    status_ = absl::InvalidArgumentError(absl::StrCat(
        "chaos history: \"", absl::string_view(name.data(), name.size()), "\" ", what));
  }

  const json::object& o_;
  absl::Status status_;
};

template <typename Entry>
absl::StatusOr<HistoryEntry> ReadEntry(const json::object& o) {
  Entry e;
  JsonReader r(o);
  Fields(r, e);
  if (!r.status().ok()) return r.status();
  return e;
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
  const json::object& o = doc.get_object();
  const json::value* type = o.if_contains("type");
  if (type == nullptr || !type->is_string()) {
    return absl::InvalidArgumentError("chaos history: \"type\" is missing or not a string");
  }
  using LineReader = absl::StatusOr<HistoryEntry> (*)(const json::object&);
  static constexpr std::pair<std::string_view, LineReader> kReaders[] = {
      {kLineType<RunEntry>, ReadEntry<RunEntry>},
      {kLineType<RequestRecord>, ReadEntry<RequestRecord>},
      {kLineType<FaultEntry>, ReadEntry<FaultEntry>},
      {kLineType<PublishEntry>, ReadEntry<PublishEntry>},
      {kLineType<PointerEntry>, ReadEntry<PointerEntry>},
      {kLineType<ResourceEntry>, ReadEntry<ResourceEntry>},
      {kLineType<EndEntry>, ReadEntry<EndEntry>},
  };
  const std::string_view name(type->get_string());
  for (const auto& [line_type, read] : kReaders) {
    if (name == line_type) return read(o);
  }
  return absl::InvalidArgumentError(
      absl::StrCat("chaos history: unknown line type \"", AbslView(name), "\""));
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

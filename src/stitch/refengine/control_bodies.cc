// The control routes' bodies (protocol.h): pause and abort, staging and the
// weight updates, commit results, and the status routes.
#include <utility>

#include <boost/json.hpp>

#include "absl/strings/str_cat.h"
#include "stitch/net/prometheus.h"
#include "stitch/refengine/json_fields.h"
#include "stitch/refengine/protocol.h"

namespace stitch {

// This folder's JSON reading helpers, and their `json` (boost::json).
using namespace refengine_internal;

namespace {

std::string VersionText(const VersionRef& v) { return v.ToString(); }

// An integer version or a version identity; the run it names, if any, goes to
// `run`.
std::optional<VersionRef> ReadVersion(FieldReader& r, std::string_view name) {
  const json::value* v = r.Find(name);
  if (v == nullptr) return std::nullopt;
  if (std::optional<int64_t> n = AsInteger(*v)) {
    if (absl::Status s = ValidateVersionNumber(*n); !s.ok()) {
      r.Fail(absl::StrCat("field \"", r.Path(name), "\": ", s.message()));
      return std::nullopt;
    }
    return VersionRef{"", *n};
  }
  if (v->is_string()) {
    absl::StatusOr<VersionRef> parsed = VersionRef::Parse(View(v->get_string()));
    if (!parsed.ok()) {
      r.Fail(absl::StrCat("field \"", r.Path(name), "\": ", parsed.status().message()));
      return std::nullopt;
    }
    return *parsed;
  }
  r.FailType(name, "a version number or a version identity (\"run/weight_v000007\")", *v);
  return std::nullopt;
}

// Merges the run named by a field into `run`; two different runs are an error.
void MergeRun(FieldReader& r, std::string_view field, const std::string& named, std::string* run) {
  if (named.empty()) return;
  if (!run->empty() && *run != named) {
    r.Fail(absl::StrCat("field \"", AbslView(field), "\" names run \"", named,
                        "\" but the request is for run \"", *run,
                        "\"; a staging stays within one run"));
    return;
  }
  *run = named;
}

absl::StatusOr<json::object> ParseControlBody(std::string_view body, std::string_view route) {
  if (body.find_first_not_of(" \t\r\n") == std::string_view::npos) return json::object();
  return ParseObject(body, route);
}

}  // namespace

absl::StatusOr<PauseMode> ParsePauseRequest(std::string_view body) {
  absl::StatusOr<json::object> object = ParseControlBody(body, "/pause_generation");
  if (!object.ok()) return object.status();
  FieldReader r(*object, "");
  std::optional<std::string> mode = r.String("mode");
  if (!r.ok()) return r.status();
  return ParsePauseMode(mode.value_or("abort"));
}

absl::StatusOr<AbortRequest> ParseAbortRequest(std::string_view body) {
  absl::StatusOr<json::object> object = ParseObject(body, "/abort_request");
  if (!object.ok()) return object.status();
  FieldReader r(*object, "");
  std::optional<std::string> rid = r.String("rid");
  std::optional<bool> all = r.Bool("abort_all");
  if (!r.ok()) return r.status();
  AbortRequest out;
  if (all.value_or(false)) {
    out.scope = Scheduler::AbortScope::kAll;
    return out;
  }
  if (!rid.has_value() || rid->empty()) {
    return absl::InvalidArgumentError(
        "the request needs a non-empty \"rid\" (a request id prefix) or \"abort_all\": true");
  }
  out.rid_prefix = *std::move(rid);
  return out;
}

absl::StatusOr<StageRequest> ParseStageRequest(std::string_view body) {
  absl::StatusOr<json::object> object = ParseObject(body, "/stage_weight_update");
  if (!object.ok()) return object.status();
  FieldReader r(*object, "");
  StageRequest out;
  std::optional<std::string> base_dir = r.String("base_checkpoint_dir");
  std::optional<VersionRef> base = ReadVersion(r, "base_version");
  std::optional<VersionRef> target = ReadVersion(r, "target_version");
  std::optional<std::string> destination = r.String("destination");
  std::optional<std::string> source = r.String("checkpoint_source_dir");
  std::optional<std::string> local = r.String("local_checkpoint_dir");
  std::optional<std::string> run = r.String("run_id");
  std::optional<std::string> anchor_dir = r.String("anchor_dir");
  std::optional<VersionRef> anchor = ReadVersion(r, "anchor_version");
  if (!r.ok()) return r.status();
  if (anchor_dir.has_value() != anchor.has_value()) {
    return absl::InvalidArgumentError(
        "\"anchor_dir\" and \"anchor_version\" come together, or not at all");
  }
  for (auto [name, present] :
       {std::pair<std::string_view, bool>{"base_checkpoint_dir", base_dir.has_value()},
        {"base_version", base.has_value()},
        {"target_version", target.has_value()},
        {"destination", destination.has_value()}}) {
    if (!present) {
      return absl::InvalidArgumentError(absl::StrCat("the request needs \"", AbslView(name), "\""));
    }
  }
  if (run.has_value() && !run->empty()) {
    if (absl::Status s = ValidateRunId(*run); !s.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("field \"run_id\": ", s.message()));
    }
    out.run_id = *run;
  }
  MergeRun(r, "base_version", base->run_id, &out.run_id);
  MergeRun(r, "target_version", target->run_id, &out.run_id);
  if (anchor.has_value()) MergeRun(r, "anchor_version", anchor->run_id, &out.run_id);
  if (!r.ok()) return r.status();
  absl::StatusOr<UpdateDestination> dest = ParseUpdateDestination(*destination);
  if (!dest.ok()) return Annotate(dest.status(), "field \"destination\"");
  out.destination = *dest;
  if (base_dir->empty()) {
    return absl::InvalidArgumentError("field \"base_checkpoint_dir\" is empty");
  }
  out.base_checkpoint_dir = *base_dir;
  out.base_version = base->version;
  out.target_version = target->version;
  if (source.has_value()) out.checkpoint_source_dir = std::filesystem::path(*source);
  if (anchor.has_value()) {
    if (anchor_dir->empty() || !source.has_value() || anchor->version <= base->version ||
        anchor->version > target->version) {
      return absl::InvalidArgumentError(
          "\"anchor_dir\" needs \"checkpoint_source_dir\" and an \"anchor_version\" after "
          "\"base_version\", at most \"target_version\"");
    }
    out.anchor_dir = std::filesystem::path(*anchor_dir);
    out.anchor_version = anchor->version;
  }
  if (out.destination == UpdateDestination::kDisk) {
    if (!local.has_value() || local->empty()) {
      return absl::InvalidArgumentError(
          "destination \"disk\" needs \"local_checkpoint_dir\", the directory to materialize "
          "the checkpoint into");
    }
    out.local_checkpoint_dir = *local;
  }
  return out;
}

std::string FormatStageResult(const StageResult& result) {
  json::object o;
  o["success"] = true;
  o["message"] = absl::StrCat("staged ", result.version.ToString(), " for ",
                              AbslView(UpdateDestinationName(result.destination)), " in ",
                              result.seconds, " s");
  o["destination"] = JsonView(UpdateDestinationName(result.destination));
  o["staged_version"] = result.version.version;
  o["staged_version_id"] = VersionText(result.version);
  o["anchor"] = result.anchor.string();
  o["anchor_version"] = result.anchor_version;
  o["deltas_applied"] = result.deltas_applied;
  o["reseeded"] = result.reseeded;
  o["seconds"] = result.seconds;
  if (result.destination == UpdateDestination::kCpu) {
    o["commit_path"] = result.commit_path;
    o["commit_reason"] = result.commit_reason;
    o["values_changed"] = result.values_changed;
    o["values_total"] = result.values_total;
  }
  return json::serialize(o);
}

absl::StatusOr<UpdateFromDiskRequest> ParseUpdateFromDiskRequest(std::string_view body) {
  absl::StatusOr<json::object> object = ParseObject(body, "/update_weights_from_disk");
  if (!object.ok()) return object.status();
  FieldReader r(*object, "");
  UpdateFromDiskRequest out;
  std::optional<std::string> path = r.String("model_path");
  std::optional<std::string> format = r.String("load_format");
  out.weight_version = ReadVersion(r, "weight_version");
  if (auto b = r.Bool("flush_cache")) out.flush_cache = *b;
  if (auto b = r.Bool("abort_all_requests")) out.abort_all_requests = *b;
  if (!r.ok()) return r.status();
  if (!path.has_value() || path->empty()) {
    return absl::InvalidArgumentError("the request needs \"model_path\", a checkpoint directory");
  }
  if (format.has_value() && *format != "auto" && *format != "safetensors") {
    return absl::InvalidArgumentError(absl::StrCat(
        "load_format \"", *format, "\" is not supported; use \"auto\" or \"safetensors\""));
  }
  out.model_path = *path;
  return out;
}

absl::StatusOr<UpdateFromCpuRequest> ParseUpdateFromCpuRequest(std::string_view body) {
  absl::StatusOr<json::object> object = ParseObject(body, "/update_weights_from_cpu");
  if (!object.ok()) return object.status();
  FieldReader r(*object, "");
  UpdateFromCpuRequest out;
  std::optional<VersionRef> target = ReadVersion(r, "target_version");
  if (auto b = r.Bool("flush_cache")) out.flush_cache = *b;
  if (!r.ok()) return r.status();
  if (!target.has_value()) {
    return absl::InvalidArgumentError("the request needs \"target_version\", the staged version");
  }
  out.target_version = *std::move(target);
  return out;
}

namespace {

json::object CommitObject(const CommitOutcome& c) {
  json::object o;
  o["message"] = c.message;
  o["weight_version"] = WeightVersionString(c.weight_version);
  o["weight_version_id"] = VersionText(c.weight_version);
  o["previous_weight_version"] = WeightVersionString(c.previous_version);
  o["pause_seconds"] = c.pause_seconds;
  o["seconds"] = c.seconds;
  o["resident_requests"] = c.resident_requests;
  if (!c.path.empty()) {
    o["commit_path"] = c.path;
    o["commit_reason"] = c.reason;
    o["values_changed"] = c.values_changed;
  }
  return o;
}

json::value OptionalVersion(const std::optional<VersionRef>& v) {
  if (!v.has_value()) return nullptr;
  return json::value(VersionText(*v));
}

}  // namespace

std::string FormatCommitResult(const CommitOutcome& outcome) {
  json::object o = CommitObject(outcome);
  o["success"] = true;
  o["num_paused_requests"] = 0;
  return json::serialize(o);
}

std::string UndoneJson(const absl::Status& error, const VersionRef& serving) {
  json::object o;
  o["success"] = false;
  o["undone"] = true;
  o["type"] = "Conflict";
  o["message"] = std::string(error.message());
  o["weight_version"] = WeightVersionString(serving);
  o["weight_version_id"] = VersionText(serving);
  return json::serialize(o);
}

std::string FormatServerInfo(const EngineStatus& s) {
  json::object o;
  o["engine"] = "stitch-refengine";
  o["model_path"] = s.model_path;
  o["served_model_name"] = s.served_model_name;
  o["weight_version"] = WeightVersionString(s.scheduler.weight_version);
  o["weight_version_id"] = VersionText(s.scheduler.weight_version);
  o["run_id"] = s.scheduler.weight_version.run_id;
  o["weights_fingerprint"] = s.scheduler.weights_fingerprint.ToHex();
  o["instance_id"] = s.instance_id;
  // As SGLang reports it: this engine has no overlap scheduler, its labels
  // and spans name each token's weights.
  o["disable_overlap_schedule"] = true;
  o["boot_version"] = s.boot_version;
  o["healthy"] = s.healthy;
  o["seconds_since_heartbeat"] = s.seconds_since_heartbeat;
  o["uptime_seconds"] = s.uptime_seconds;
  o["max_running_requests"] = s.scheduler_options.max_running;
  o["max_queued_requests"] = s.scheduler_options.max_queued;
  o["prefill_chunk"] = s.scheduler_options.prefill_chunk;
  o["num_running_requests"] = s.scheduler.running;
  o["num_queued_requests"] = s.scheduler.queued;
  o["paused"] = s.scheduler.paused;
  o["pause_mode"] =
      s.scheduler.paused ? json::value(JsonView(PauseModeName(s.scheduler.pause_mode))) : nullptr;
  o["pending_commands"] = s.scheduler.pending_commands;
  o["steps"] = s.scheduler.steps;
  o["tokens_generated"] = s.scheduler.tokens_generated;
  o["requests_finished"] = s.scheduler.requests_finished;
  o["requests_aborted"] = s.scheduler.requests_aborted;
  o["weight_swaps"] = s.scheduler.weight_swaps;
  o["last_swap_pause_seconds"] = s.scheduler.last_swap_pause_seconds;
  o["last_commit"] = s.last_commit ? json::value(CommitObject(*s.last_commit)) : nullptr;
  json::object staging;
  staging["in_progress"] = s.staging.staging;
  staging["cpu_prepared"] = OptionalVersion(s.staging.cpu_prepared);
  staging["cpu_image"] = OptionalVersion(s.staging.cpu_image);
  staging["disk_staged"] = OptionalVersion(s.staging.disk_staged);
  staging["disk_dir"] = s.staging.disk_dir.string();
  staging["last_error"] = s.staging.last_error;
  o["staging"] = std::move(staging);
  json::object faults;
  faults["fail_stagings"] = s.faults.fail_stagings;
  faults["fail_commits"] = s.faults.fail_commits;
  faults["hang_health_after"] = s.faults.hang_health_after;
  faults["exit_on_commit"] = s.faults.exit_on_commit;
  faults["fail_patches"] = s.faults.fail_patches;
  o["faults"] = std::move(faults);
  return json::serialize(o);
}

std::string FormatMetrics(const EngineStatus& s) {
  PrometheusText w("sglang:");
  w.One("num_running_reqs", "gauge", "Requests admitted and generating (paused ones included).",
        s.scheduler.running);
  w.One("num_queue_reqs", "gauge", "Requests waiting for admission.", s.scheduler.queued);
  w.One("generation_tokens_total", "counter", "Tokens generated.", s.scheduler.tokens_generated);
  w.One("num_requests_total", "counter", "Requests finished, aborted ones included.",
        s.scheduler.requests_finished);
  return w.Take();
}

std::string FormatModelInfo(const EngineStatus& s) {
  json::object o;
  o["model_path"] = s.model_path;
  o["tokenizer_path"] = nullptr;
  o["served_model_name"] = s.served_model_name;
  o["is_generation"] = true;
  o["architecture"] = "LlamaForCausalLM";
  o["parameters"] = s.parameters;
  o["weight_version"] = WeightVersionString(s.scheduler.weight_version);
  o["weight_version_id"] = VersionText(s.scheduler.weight_version);
  o["weights_fingerprint"] = s.scheduler.weights_fingerprint.ToHex();
  o["instance_id"] = s.instance_id;
  boost::system::error_code ec;
  json::value config = json::parse(s.config.ToJson(), ec);
  o["config"] = ec ? json::value(nullptr) : std::move(config);
  return json::serialize(o);
}

std::string FormatModelList(const EngineStatus& s) {
  json::object model;
  model["id"] = s.served_model_name;
  model["object"] = "model";
  model["owned_by"] = "stitch";
  model["max_model_len"] = s.config.max_position_embeddings;
  json::array data;
  data.emplace_back(std::move(model));
  json::object o;
  o["object"] = "list";
  o["data"] = std::move(data);
  return json::serialize(o);
}

std::string FormatHealth(const EngineStatus& s) {
  json::object o;
  o["healthy"] = true;
  o["weight_version"] = WeightVersionString(s.scheduler.weight_version);
  return json::serialize(o);
}

}  // namespace stitch

#include "stitch/engine/engine.h"

#include <boost/json/object.hpp>
#include <boost/json/parse.hpp>

#include "absl/strings/str_cat.h"
#include "stitch/core/errors.h"

namespace stitch {

std::optional<VersionRef> ParseEngineLabel(std::string_view label) {
  if (label.empty()) return std::nullopt;
  absl::StatusOr<VersionRef> ref = VersionRef::Parse(label);
  if (!ref.ok()) return std::nullopt;
  return *std::move(ref);
}

absl::StatusOr<EngineReport> ParseEngineReport(std::string_view body) {
  boost::system::error_code ec;
  boost::json::value doc = boost::json::parse(body, ec);
  if (ec || !doc.is_object()) {
    return absl::InvalidArgumentError("the engine's model info is not a JSON object");
  }
  const boost::json::object& o = doc.get_object();
  auto text = [&](std::string_view key) -> absl::StatusOr<std::optional<std::string>> {
    const boost::json::value* v = o.if_contains(key);
    if (v == nullptr || v->is_null()) return std::nullopt;
    if (v->is_string()) return std::string(v->get_string());
    if (v->is_int64()) return std::to_string(v->get_int64());
    if (v->is_uint64()) return std::to_string(v->get_uint64());
    return absl::InvalidArgumentError(absl::StrCat("the engine's model info has a ", AbslView(key),
                                                   " that is neither a string nor an integer"));
  };
  EngineReport report;
  for (std::string_view key : {"weight_version_id", "weight_version"}) {
    absl::StatusOr<std::optional<std::string>> label = text(key);
    if (!label.ok()) return label.status();
    if (label->has_value()) {
      report.label = **label;
      break;
    }
  }
  report.held = ParseEngineLabel(report.label);
  absl::StatusOr<std::optional<std::string>> instance = text("instance_id");
  if (!instance.ok()) return instance.status();
  report.instance = instance->value_or("");
  absl::StatusOr<std::optional<std::string>> fingerprint = text("weights_fingerprint");
  if (!fingerprint.ok()) return fingerprint.status();
  if (fingerprint->has_value()) {
    absl::StatusOr<Checksum128> parsed = Checksum128::FromHex(**fingerprint);
    if (!parsed.ok()) return Annotate(parsed.status(), "the engine's weights_fingerprint");
    report.fingerprint = *parsed;
  }
  absl::StatusOr<std::optional<std::string>> served = text("served_model_name");
  if (!served.ok()) return served.status();
  report.served_model_name = served->value_or("");
  return report;
}

void CommitPathCounter::Count(std::string path, std::string reason) {
  ++counts_[{std::move(path), std::move(reason)}];
}

std::vector<Engine::CommitPath> CommitPathCounter::Paths() const {
  std::vector<Engine::CommitPath> out;
  for (const auto& [key, count] : counts_) out.push_back({key.first, key.second, count});
  return out;
}

}  // namespace stitch

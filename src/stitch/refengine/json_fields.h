// Reading the reference engine's JSON request bodies (protocol.h's parsing
// rules): a field reader that keeps the first error, naming the field, and
// the helpers it rests on. No I/O. Private to this folder.
#pragma once

#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include <boost/json/object.hpp>
#include <boost/json/serialize.hpp>
#include <boost/json/string.hpp>
#include <boost/json/value.hpp>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "absl/strings/str_cat.h"
#include "stitch/core/errors.h"

namespace stitch::refengine_internal {

namespace json = boost::json;

inline std::string_view View(const json::string& s) { return {s.data(), s.size()}; }
inline json::string_view JsonView(std::string_view s) { return {s.data(), s.size()}; }

// "null", "bool", "integer", "number", "string", "array", "object".
std::string_view KindName(const json::value& v);
// A JSON integer, or a number with an integral value, as int64.
std::optional<int64_t> AsInteger(const json::value& v);
std::optional<double> AsNumber(const json::value& v);

// Reads the fields of one JSON object; the first error is kept and later
// reads return nullopt. Absent fields and JSON nulls read as absent.
class FieldReader {
 public:
  FieldReader(const json::object& object, std::string prefix)
      : object_(object), prefix_(std::move(prefix)) {}

  const json::object& object() const { return object_; }
  const absl::Status& status() const { return status_; }
  bool ok() const { return status_.ok(); }
  std::string Path(std::string_view name) const { return absl::StrCat(prefix_, AbslView(name)); }

  void Fail(std::string message) {
    if (status_.ok()) status_ = absl::InvalidArgumentError(std::move(message));
  }
  void FailType(std::string_view name, std::string_view wanted, const json::value& got) {
    Fail(absl::StrCat("field \"", Path(name), "\" must be ", AbslView(wanted), ", got ",
                      AbslView(KindName(got))));
  }

  const json::value* Find(std::string_view name) const {
    auto it = object_.find(JsonView(name));
    if (it == object_.end() || it->value().is_null()) return nullptr;
    return &it->value();
  }

  std::optional<bool> Bool(std::string_view name) {
    const json::value* v = Find(name);
    if (v == nullptr) return std::nullopt;
    if (!v->is_bool()) {
      FailType(name, "true or false", *v);
      return std::nullopt;
    }
    return v->get_bool();
  }

  std::optional<int64_t> Int(std::string_view name, int64_t min, int64_t max) {
    const json::value* v = Find(name);
    if (v == nullptr) return std::nullopt;
    std::optional<int64_t> n = AsInteger(*v);
    if (!n.has_value() || *n < min || *n > max) {
      Fail(absl::StrCat("field \"", Path(name), "\" must be an integer in [", min, ", ", max,
                        "], got ", json::serialize(*v)));
      return std::nullopt;
    }
    return n;
  }

  std::optional<double> Number(std::string_view name) {
    const json::value* v = Find(name);
    if (v == nullptr) return std::nullopt;
    std::optional<double> d = AsNumber(*v);
    if (!d.has_value() || !std::isfinite(*d)) {
      FailType(name, "a number", *v);
      return std::nullopt;
    }
    return d;
  }

  std::optional<std::string> String(std::string_view name) {
    const json::value* v = Find(name);
    if (v == nullptr) return std::nullopt;
    if (!v->is_string()) {
      FailType(name, "a string", *v);
      return std::nullopt;
    }
    return std::string(View(v->get_string()));
  }

  // A string or an array of strings (OpenAI's and SGLang's `stop`).
  std::optional<std::vector<std::string>> Strings(std::string_view name) {
    const json::value* v = Find(name);
    if (v == nullptr) return std::nullopt;
    std::vector<std::string> out;
    if (v->is_string()) {
      out.emplace_back(View(v->get_string()));
    } else if (v->is_array()) {
      for (const json::value& item : v->get_array()) {
        if (!item.is_string()) {
          FailType(name, "a string or an array of strings", item);
          return std::nullopt;
        }
        out.emplace_back(View(item.get_string()));
      }
    } else {
      FailType(name, "a string or an array of strings", *v);
      return std::nullopt;
    }
    for (const std::string& s : out) {
      if (s.empty()) {
        Fail(absl::StrCat("field \"", Path(name),
                          "\" holds an empty string; stop strings must "
                          "not be empty"));
        return std::nullopt;
      }
    }
    return out;
  }

  std::optional<std::vector<int32_t>> TokenIds(std::string_view name, int64_t vocab) {
    const json::value* v = Find(name);
    if (v == nullptr) return std::nullopt;
    if (!v->is_array()) {
      FailType(name, "an array of token ids", *v);
      return std::nullopt;
    }
    std::vector<int32_t> out;
    for (const json::value& item : v->get_array()) {
      std::optional<int64_t> id = AsInteger(item);
      if (!id.has_value() || *id < 0 || *id >= vocab) {
        Fail(absl::StrCat("field \"", Path(name), "\" must hold token ids in [0, ", vocab,
                          "), got ", json::serialize(item)));
        return std::nullopt;
      }
      out.push_back(static_cast<int32_t>(*id));
    }
    return out;
  }

  const json::object* Object(std::string_view name) {
    const json::value* v = Find(name);
    if (v == nullptr) return nullptr;
    if (!v->is_object()) {
      FailType(name, "an object", *v);
      return nullptr;
    }
    return &v->get_object();
  }

  // Refuses a parameter this engine does not implement unless it holds its
  // neutral value.
  void RefuseUnless(std::string_view name, const std::function<bool(const json::value&)>& neutral,
                    std::string_view neutral_text) {
    const json::value* v = Find(name);
    if (v == nullptr || neutral(*v)) return;
    Fail(absl::StrCat("\"", Path(name), "\" is not supported by the reference engine (only ",
                      AbslView(neutral_text), "); remove it from the request"));
  }
  void RefuseNumberUnless(std::string_view name, double neutral) {
    RefuseUnless(
        name,
        [neutral](const json::value& v) {
          std::optional<double> d = AsNumber(v);
          return d.has_value() && *d == neutral;
        },
        absl::StrCat(neutral));
  }
  void RefuseSet(std::string_view name) {
    RefuseUnless(
        name,
        [](const json::value& v) {
          return (v.is_bool() && !v.get_bool()) || (v.is_object() && v.get_object().empty()) ||
                 (v.is_array() && v.get_array().empty());
        },
        "null, false or empty");
  }

 private:
  const json::object& object_;
  std::string prefix_;
  absl::Status status_;
};

// `body` as one JSON object; InvalidArgument naming `what` (the route) when
// it is not valid JSON or not an object.
[[nodiscard]] absl::StatusOr<json::object> ParseObject(std::string_view body,
                                                       std::string_view what);

}  // namespace stitch::refengine_internal

#include "stitch/core/json.h"

#include <algorithm>
#include <cmath>
#include <exception>
#include <string>
#include <vector>

#include <boost/json/basic_parser_impl.hpp>
#include <boost/json/object.hpp>
#include <boost/json/parse.hpp>
#include <boost/json/serialize.hpp>
#include <boost/json/value_stack.hpp>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "stitch/core/errors.h"
#include "stitch/core/json_value_handler.h"
#include "stitch/core/version.h"

namespace stitch {
namespace json = boost::json;

namespace {

constexpr std::string_view kWeightVersion = "weight_version";

// What a guarded parse watches for repeats.
enum class Guard {
  kBody,        // a request body: `weight_version` and the fields of its object
  kConstraint,  // a constraint alone: the fields of the top-level object
};

// boost::json::parser's own handler (a value_stack) plus a watch on the keys
// that decide a request's version. Boost.JSON keeps one value of a repeated
// key and drops the others without a word; here the parse stops instead.
// Only those keys are looked at (a comparison per top-level key, a copy of
// the few fields of the constraint object), so the cost stays that of
// boost::json::parse.
struct GuardedHandler : JsonValueHandler {
  GuardedHandler(Guard g, unsigned char* temp, std::size_t size)
      : JsonValueHandler(temp, size), guard(g) {}

  const Guard guard;
  size_t depth = 0;                 // containers open
  bool root_object = false;         // the document is an object
  size_t guarded_depth = 0;         // depth of the constraint object being read; 0: none
  bool last_key_guarded = false;    // the last top-level key was `weight_version`
  int weight_versions = 0;          // top-level `weight_version` keys so far
  std::vector<std::string> fields;  // of the constraint object being read
  std::string key_buf;              // a key arriving in parts
  std::string repeated;             // the repeated key that stopped the parse

  // Whether the key being read at `depth` is one the guard looks at.
  bool Watching() const {
    return (depth == 1 && root_object && guard == Guard::kBody) ||
           (guarded_depth != 0 && depth == guarded_depth);
  }

  // False (and `repeated` set) when `key` repeats a guarded key.
  bool CheckKey(std::string_view key) {
    if (guarded_depth != 0 && depth == guarded_depth) {
      if (std::find(fields.begin(), fields.end(), key) != fields.end()) {
        repeated = std::string(key);
        return false;
      }
      fields.emplace_back(key);
      return true;
    }
    last_key_guarded = key == kWeightVersion;
    if (last_key_guarded && ++weight_versions > 1) {
      repeated = std::string(key);
      return false;
    }
    return true;
  }

  bool on_object_begin(json::error_code&) {
    ++depth;
    if (depth == 1) root_object = true;
    const bool constraint =
        (guard == Guard::kConstraint && depth == 1) ||
        (guard == Guard::kBody && depth == 2 && root_object && last_key_guarded);
    if (constraint) {
      guarded_depth = depth;
      fields.clear();
    }
    return true;
  }
  bool on_object_end(std::size_t n, json::error_code&) {
    if (depth == guarded_depth) guarded_depth = 0;
    --depth;
    st.push_object(n);
    return true;
  }
  bool on_array_begin(json::error_code&) {
    ++depth;
    return true;
  }
  bool on_array_end(std::size_t n, json::error_code&) {
    --depth;
    st.push_array(n);
    return true;
  }
  bool on_key_part(json::string_view s, std::size_t, json::error_code&) {
    if (Watching()) key_buf.append(s.data(), s.size());
    st.push_chars(s);
    return true;
  }
  bool on_key(json::string_view s, std::size_t, json::error_code& ec) {
    if (Watching()) {
      bool unique = true;
      if (key_buf.empty()) {
        unique = CheckKey(std::string_view(s.data(), s.size()));
      } else {
        key_buf.append(s.data(), s.size());
        unique = CheckKey(key_buf);
        key_buf.clear();
      }
      if (!unique) {
        ec = json::error::syntax;
        return false;
      }
    }
    st.push_key(s);
    return true;
  }
};

// A key for a one-line message: escaped, and cut when long.
std::string ShowKey(std::string_view key) {
  constexpr size_t kMaxShown = 64;
  std::string shown = absl::CEscape(AbslView(key.substr(0, kMaxShown)));
  if (key.size() > kMaxShown) shown += "...";
  return shown;
}

// Parses `text` as boost::json::parse does (same options), watching `guard`'s
// keys. Errors: InvalidArgument; a syntax error is "<syntax_error> (<reason>)".
absl::StatusOr<json::value> ParseGuarded(std::string_view text, Guard guard, json::storage_ptr sp,
                                         std::string_view syntax_error) {
  // The value stack allocates and may throw (bad_alloc, length_error):
  // nothing thrown crosses this function.
  try {
    unsigned char temp[BOOST_JSON_STACK_BUFFER_SIZE];
    json::basic_parser<GuardedHandler> p(json::parse_options{}, guard, temp, sizeof(temp));
    p.handler().st.reset(std::move(sp));
    json::error_code ec;
    const size_t n = p.write_some(/*more=*/false, text.data(), text.size(), ec);
    if (!ec && n < text.size()) ec = json::error::extra_data;
    if (ec) {
      const std::string& repeated = p.handler().repeated;
      if (repeated.empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat(AbslView(syntax_error), " (", ec.message(), ")"));
      }
      if (guard == Guard::kBody && p.handler().guarded_depth == 0) {
        return absl::InvalidArgumentError(
            "the request body gives weight_version twice; give it once");
      }
      return absl::InvalidArgumentError(absl::StrCat("weight_version gives \"", ShowKey(repeated),
                                                     "\" twice; give each field once"));
    }
    return p.handler().st.release();
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat(AbslView(syntax_error), " (too large to parse: ", e.what(), ")"));
  }
}

}  // namespace

absl::StatusOr<json::value> ParseVersionedBodyJson(std::string_view text, json::storage_ptr sp) {
  return ParseGuarded(text, Guard::kBody, std::move(sp), "the request body must be a JSON object");
}

absl::StatusOr<int64_t> VersionFromJsonValue(const json::value& v, std::string_view field_std) {
  absl::string_view field = AbslView(field_std);
  int64_t n = 0;
  if (v.is_int64()) {
    n = v.get_int64();
  } else if (v.is_uint64()) {
    return absl::OutOfRangeError(
        absl::StrCat(field, " ", v.get_uint64(), " is above the maximum ", kMaxVersion));
  } else {
    return absl::InvalidArgumentError(
        absl::StrCat(field, " must be a non-negative integer, got ", json::serialize(v)));
  }
  if (absl::Status s = ValidateVersionNumber(n); !s.ok()) {
    return absl::OutOfRangeError(absl::StrCat(field, ": ", s.message()));
  }
  return n;
}

namespace {

// A constraint's version as the original Python Stitch accepts it (it calls
// int() on the value): an integer, a string int() reads as a non-negative
// decimal (" 7", "+7", "1_000": ParseVersionText), or a number with no
// fraction (7.0). What int() would truncate or that names no version (7.5,
// true, -1) is refused (docs/migrating.md, "Different on purpose").
absl::StatusOr<int64_t> ConstraintVersion(const json::value& v, std::string_view field) {
  if (v.is_string()) {
    const json::string& text = v.get_string();
    absl::StatusOr<int64_t> n = ParseVersionText(std::string_view(text.data(), text.size()));
    if (absl::IsOutOfRange(n.status())) {
      return absl::OutOfRangeError(
          absl::StrCat(AbslView(field), " ", json::serialize(v), " is ", n.status().message()));
    }
    if (!n.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(
          AbslView(field), " must be a non-negative integer (or its digits as a string), got ",
          json::serialize(v)));
    }
    return *n;
  }
  if (v.is_double()) {
    const double d = v.get_double();
    if (!std::isfinite(d) || d != std::trunc(d) || d < 0 || d > static_cast<double>(kMaxVersion)) {
      return absl::InvalidArgumentError(absl::StrCat(
          AbslView(field), " must be a non-negative integer, got ", json::serialize(v)));
    }
    return VersionFromJsonValue(json::value(static_cast<int64_t>(d)), field);
  }
  return VersionFromJsonValue(v, field);
}

}  // namespace

absl::StatusOr<VersionConstraint> ConstraintFromJsonValue(const json::value& v) {
  VersionConstraint c;
  if (v.is_null()) return c;
  if (!v.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat("weight_version must be an object like {\"min_version\": N} or "
                     "{\"exact_version\": N}, got ",
                     json::serialize(v)));
  }
  for (const auto& [key, value] : v.get_object()) {
    std::optional<int64_t>* field = key == "min_version"     ? &c.min_version
                                    : key == "exact_version" ? &c.exact_version
                                    : key == "max_staleness" ? &c.max_staleness
                                                             : nullptr;
    if (field == nullptr) {
      return absl::InvalidArgumentError(
          absl::StrCat("weight_version has unknown field \"", AbslView(key),
                       "\" (expected min_version, exact_version or max_staleness)"));
    }
    if (value.is_null()) continue;
    auto n = ConstraintVersion(value, absl::StrCat("weight_version.", AbslView(key)));
    if (!n.ok()) return n.status();
    *field = *n;
  }
  // Both given: the exact version must satisfy the minimum too, or no
  // version can serve the request; neither is ever dropped in silence.
  if (c.exact_version && c.min_version && *c.exact_version < *c.min_version) {
    return absl::InvalidArgumentError(
        absl::StrCat("weight_version asks for exact_version ", *c.exact_version,
                     " and min_version ", *c.min_version,
                     ": no version is both; give one (exact_version pins one version, "
                     "min_version accepts it or newer)"));
  }
  return c;
}

absl::StatusOr<VersionConstraint> VersionConstraint::FromJson(std::string_view text) {
  absl::StatusOr<json::value> v =
      ParseGuarded(text, Guard::kConstraint, {}, "weight_version is not valid JSON");
  if (!v.ok()) return v.status();
  return ConstraintFromJsonValue(*v);
}

json::value ConstraintToJsonValue(const VersionConstraint& c) {
  json::object o;
  if (c.exact_version) {
    o["exact_version"] = *c.exact_version;
  } else if (c.min_version) {
    o["min_version"] = *c.min_version;
  }
  if (c.max_staleness) o["max_staleness"] = *c.max_staleness;
  return o;
}

}  // namespace stitch

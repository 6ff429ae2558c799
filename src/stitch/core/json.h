// Boost.JSON forms of core types, for code that builds or reads larger JSON
// documents. Kept out of the plain headers so that most translation units do
// not pay for Boost.JSON's headers.
#pragma once

#include <optional>
#include <string_view>

#include <boost/json/monotonic_resource.hpp>
#include <boost/json/storage_ptr.hpp>
#include <boost/json/value.hpp>

#include "absl/status/statusor.h"
#include "stitch/core/constraint.h"

namespace stitch {

// The JSON of a versioned request body, parsed into a value from `sp` in one
// pass, as boost::json::parse would (the value may be of any kind; the caller
// checks that it is an object). Unlike boost::json::parse, which keeps one
// value of a repeated key and drops the others silently, the keys that decide
// the serving version must each appear once: `weight_version` at the top
// level, and every field of the object it holds. Other repeats are left as
// Boost.JSON resolves them. Errors: InvalidArgument with the one-line message
// of the 400 to answer ("the request body must be a JSON object (syntax
// error)", "the request body gives weight_version twice; give it once",
// "weight_version gives \"min_version\" twice; give each field once").
[[nodiscard]] absl::StatusOr<boost::json::value> ParseVersionedBodyJson(
    std::string_view text, boost::json::storage_ptr sp);

// The constraint in `v` (null or an object); see constraint.h for the rules.
[[nodiscard]] absl::StatusOr<VersionConstraint> ConstraintFromJsonValue(
    const boost::json::value& v);
boost::json::value ConstraintToJsonValue(const VersionConstraint& c);

// A JSON integer in [0, kMaxVersion] from `v`, or an error naming `field`.
[[nodiscard]] absl::StatusOr<int64_t> VersionFromJsonValue(const boost::json::value& v,
                                                           std::string_view field);

// Memory for the JSON documents of one request: their nodes come from an
// inline buffer (then from blocks of growing size) and are freed all at
// once, instead of one allocation per key, string and container. A value
// built on storage() must not outlive the arena; declare the arena first.
class JsonArena {
 public:
  JsonArena() = default;
  JsonArena(const JsonArena&) = delete;
  JsonArena& operator=(const JsonArena&) = delete;
  boost::json::storage_ptr storage() { return &resource_; }

 private:
  // Holds a typical /generate request or answer without another block.
  static constexpr size_t kInlineBytes = 2048;
  unsigned char buffer_[kInlineBytes];
  boost::json::monotonic_resource resource_{buffer_, kInlineBytes};
};

}  // namespace stitch

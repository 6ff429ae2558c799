// Internal to format/: JSON parsing for the files Stitch reads (safetensors
// headers, checkpoint indexes). Not part of the folder's public API; include
// it only from format/*.cc so few translation units pay for Boost.JSON.
#pragma once

#include <string>
#include <string_view>

#include <boost/json/storage_ptr.hpp>
#include <boost/json/value.hpp>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace stitch {

// Parses exactly one JSON document (surrounding whitespace allowed) into a
// value allocated from `sp`, which must outlive the value. Unlike
// boost::json::parse, an object that repeats a key is an error (Boost.JSON
// would silently keep the last one), so "two tensors with the same name" can
// not hide. Errors are InvalidArgument with a one-line reason:
//   `invalid JSON at byte 17: syntax error`, `duplicate key "w"`.
// Nesting deeper than 32 levels is an error. Safe on arbitrary bytes.
[[nodiscard]] absl::StatusOr<boost::json::value> ParseJsonStrict(std::string_view text,
                                                                 boost::json::storage_ptr sp = {});

// `s` quoted for a one-line error message: C-escaped, cut after 200 bytes.
std::string QuoteForMessage(std::string_view s);

// Whether `s` is well-formed UTF-8 (no overlong forms, surrogates or code
// points above U+10FFFF): what a JSON string must hold.
bool IsValidUtf8(std::string_view s);

// "object", "array", "string", "number", "bool" or "null".
absl::string_view JsonKindName(const boost::json::value& v);

}  // namespace stitch

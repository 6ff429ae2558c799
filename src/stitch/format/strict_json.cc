#include "stitch/format/strict_json.h"

#include <algorithm>
#include <exception>
#include <string>
#include <vector>

#include <boost/json/basic_parser_impl.hpp>
#include <boost/json/value_stack.hpp>

#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "stitch/core/errors.h"
#include "stitch/core/json_value_handler.h"

namespace stitch {
namespace json = boost::json;
namespace {

// boost::json::parser's own handler plus a record of each open object's keys.
// Duplicates are detected when the object closes (sort + adjacent compare), so
// a header with thousands of tensors costs one sort, not a hash set per object.
struct StrictHandler : JsonValueHandler {
  std::vector<std::vector<std::string>> keys;  // one entry per open object, reused
  size_t depth = 0;
  std::string key_buf;
  std::string duplicate;  // set when parsing stopped on a repeated key

  bool on_object_begin(json::error_code&) {
    if (depth == keys.size()) keys.emplace_back();
    keys[depth].clear();
    ++depth;
    return true;
  }
  bool on_object_end(std::size_t n, json::error_code& ec) {
    std::vector<std::string>& k = keys[--depth];
    std::sort(k.begin(), k.end());
    if (auto it = std::adjacent_find(k.begin(), k.end()); it != k.end()) {
      duplicate = *it;
      ec = json::error::syntax;
      return false;
    }
    st.push_object(n);
    return true;
  }
  bool on_array_begin(json::error_code&) { return true; }
  bool on_array_end(std::size_t n, json::error_code&) {
    st.push_array(n);
    return true;
  }
  bool on_key_part(json::string_view s, std::size_t, json::error_code&) {
    key_buf.append(s.data(), s.size());
    st.push_chars(s);
    return true;
  }
  bool on_key(json::string_view s, std::size_t, json::error_code&) {
    key_buf.append(s.data(), s.size());
    keys[depth - 1].push_back(std::move(key_buf));
    key_buf.clear();
    st.push_key(s);
    return true;
  }
};

}  // namespace

std::string QuoteForMessage(std::string_view s) {
  constexpr size_t kMaxShown = 200;
  if (s.size() <= kMaxShown) return absl::StrCat("\"", absl::CEscape(AbslView(s)), "\"");
  return absl::StrCat("\"", absl::CEscape(AbslView(s.substr(0, kMaxShown))), "\"...");
}

bool IsValidUtf8(std::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const unsigned char* end = p + s.size();
  auto cont = [&](const unsigned char* q) { return q < end && (*q & 0xC0) == 0x80; };
  while (p < end) {
    const unsigned char c = *p;
    if (c < 0x80) {
      ++p;
    } else if (c >= 0xC2 && c <= 0xDF) {
      if (!cont(p + 1)) return false;
      p += 2;
    } else if (c >= 0xE0 && c <= 0xEF) {
      if (!cont(p + 1) || !cont(p + 2)) return false;
      if (c == 0xE0 && p[1] < 0xA0) return false;  // overlong
      if (c == 0xED && p[1] > 0x9F) return false;  // surrogate
      p += 3;
    } else if (c >= 0xF0 && c <= 0xF4) {
      if (!cont(p + 1) || !cont(p + 2) || !cont(p + 3)) return false;
      if (c == 0xF0 && p[1] < 0x90) return false;  // overlong
      if (c == 0xF4 && p[1] > 0x8F) return false;  // above U+10FFFF
      p += 4;
    } else {
      return false;
    }
  }
  return true;
}

absl::string_view JsonKindName(const json::value& v) {
  switch (v.kind()) {
    case json::kind::object:
      return "object";
    case json::kind::array:
      return "array";
    case json::kind::string:
      return "string";
    case json::kind::int64:
    case json::kind::uint64:
    case json::kind::double_:
      return "number";
    case json::kind::bool_:
      return "bool";
    case json::kind::null:
      return "null";
  }
  return "value";
}

absl::StatusOr<json::value> ParseJsonStrict(std::string_view text, json::storage_ptr sp) {
  // value_stack allocates (and may throw bad_alloc / length_error); nothing
  // thrown may cross our API.
  try {
    json::basic_parser<StrictHandler> p(json::parse_options{});
    p.handler().st.reset(std::move(sp));
    json::error_code ec;
    size_t n = p.write_some(/*more=*/false, text.data(), text.size(), ec);
    if (!ec && n < text.size()) ec = json::error::extra_data;
    if (ec) {
      if (const std::string& d = p.handler().duplicate; !d.empty()) {
        return absl::InvalidArgumentError(absl::StrCat("duplicate key ", QuoteForMessage(d)));
      }
      return absl::InvalidArgumentError(
          absl::StrCat("invalid JSON at byte ", n, ": ", ec.message()));
    }
    return p.handler().st.release();
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat("JSON too large to parse: ", e.what()));
  }
}

}  // namespace stitch

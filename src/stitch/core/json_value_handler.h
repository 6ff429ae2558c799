// Internal to core/ and format/: the part of a boost::json::basic_parser
// handler that builds the parsed value (scalars, strings, limits) on a
// value_stack. The two strict parsers (core/json.cc, format/strict_json.cc)
// derive from it and add only what they check: keys and containers.
#pragma once

#include <cstddef>
#include <cstdint>

#include <boost/json/array.hpp>
#include <boost/json/error.hpp>
#include <boost/json/object.hpp>
#include <boost/json/string.hpp>
#include <boost/json/string_view.hpp>
#include <boost/json/value_stack.hpp>

namespace stitch {

struct JsonValueHandler {
  static constexpr std::size_t max_object_size = boost::json::object::max_size();
  static constexpr std::size_t max_array_size = boost::json::array::max_size();
  static constexpr std::size_t max_key_size = boost::json::string::max_size();
  static constexpr std::size_t max_string_size = boost::json::string::max_size();

  JsonValueHandler() = default;
  JsonValueHandler(unsigned char* temp, std::size_t size)
      : st(boost::json::storage_ptr(), temp, size) {}

  boost::json::value_stack st;

  bool on_document_begin(boost::json::error_code&) { return true; }
  bool on_document_end(boost::json::error_code&) { return true; }
  bool on_string_part(boost::json::string_view s, std::size_t, boost::json::error_code&) {
    st.push_chars(s);
    return true;
  }
  bool on_string(boost::json::string_view s, std::size_t, boost::json::error_code&) {
    st.push_string(s);
    return true;
  }
  bool on_number_part(boost::json::string_view, boost::json::error_code&) { return true; }
  bool on_int64(std::int64_t i, boost::json::string_view, boost::json::error_code&) {
    st.push_int64(i);
    return true;
  }
  bool on_uint64(std::uint64_t u, boost::json::string_view, boost::json::error_code&) {
    st.push_uint64(u);
    return true;
  }
  bool on_double(double d, boost::json::string_view, boost::json::error_code&) {
    st.push_double(d);
    return true;
  }
  bool on_bool(bool b, boost::json::error_code&) {
    st.push_bool(b);
    return true;
  }
  bool on_null(boost::json::error_code&) {
    st.push_null();
    return true;
  }
  bool on_comment_part(boost::json::string_view, boost::json::error_code&) { return true; }
  bool on_comment(boost::json::string_view, boost::json::error_code&) { return true; }
};

}  // namespace stitch

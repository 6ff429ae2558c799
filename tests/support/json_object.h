// Test-only: the JSON object a body holds, for assertions on answers.
#pragma once

#include <string_view>

#include <gtest/gtest.h>
#include <boost/json/object.hpp>
#include <boost/json/parse.hpp>

namespace stitch::testing {

// The object `text` holds; a test failure, and an empty object, when it
// holds none.
inline boost::json::object ParseObject(std::string_view text) {
  boost::system::error_code ec;
  boost::json::value v = boost::json::parse(text, ec);
  EXPECT_TRUE(!ec && v.is_object()) << text;
  return v.is_object() ? v.get_object() : boost::json::object();
}

}  // namespace stitch::testing

#include "stitch/store/s3/s3_sigv4.h"

#include <boost/url/encode.hpp>
#include <boost/url/grammar/lut_chars.hpp>
#include <boost/url/rfc/unreserved_chars.hpp>

namespace stitch {

std::string SigV4Encode(std::string_view text, SlashEncoding slash) {
  namespace urls = boost::urls;
  static constexpr urls::grammar::lut_chars kWithSlash = urls::unreserved_chars + '/';
  urls::string_view in(text.data(), text.size());
  return slash == SlashEncoding::kKeep ? urls::encode(in, kWithSlash)
                                       : urls::encode(in, urls::unreserved_chars);
}

}  // namespace stitch

#include "stitch/store/s3/curl_handles.h"

namespace stitch {

void CurlGlobalInitOnce() {
  // curl_global_init is not thread-safe; a function-local static runs it
  // exactly once, before any handle exists.
  static const CURLcode init = curl_global_init(CURL_GLOBAL_DEFAULT);
  (void)init;
}

}  // namespace stitch

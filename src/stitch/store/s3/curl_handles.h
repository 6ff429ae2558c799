// libcurl handles owned by unique_ptr, for the store library's plain HTTP
// calls (credential endpoints, peers). Internal to the store library.
#pragma once

#include <curl/curl.h>

#include <memory>

#include "stitch/store/s3/s3_client.h"

namespace stitch {

struct CurlEasyDeleter {
  void operator()(CURL* c) const { curl_easy_cleanup(c); }
};
struct CurlSlistDeleter {
  void operator()(curl_slist* l) const { curl_slist_free_all(l); }
};
using CurlEasy = std::unique_ptr<CURL, CurlEasyDeleter>;
using CurlSlist = std::unique_ptr<curl_slist, CurlSlistDeleter>;

// A new easy handle, libcurl initialized first; null when none can be made.
inline CurlEasy NewCurlEasy() {
  CurlGlobalInitOnce();
  return CurlEasy(curl_easy_init());
}

}  // namespace stitch

// libcurl's global initialization and handles owned by unique_ptr, for
// every libcurl user of the S3 adapter (the S3 client, the credential
// services). Internal to store/s3.
#pragma once

#include <curl/curl.h>

#include <memory>

namespace stitch {

// libcurl's global initialization, once per process, before any handle
// (every curl user calls it first).
void CurlGlobalInitOnce();

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

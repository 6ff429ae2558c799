#include "stitch/pool/pool.h"

#include <curl/curl.h>
#include <spdlog/spdlog.h>

#include <algorithm>
#include <array>
#include <mutex>

#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "stitch/core/errors.h"
#include "stitch/pool/dns_pool.h"
#include "stitch/pool/file_pool.h"
#include "stitch/pool/static_pool.h"

namespace stitch {
namespace {

void EnsureCurlInitialized() {
  static std::once_flag once;
  std::call_once(once, [] { curl_global_init(CURL_GLOBAL_DEFAULT); });
}

struct MultiDeleter {
  void operator()(CURLM* m) const { curl_multi_cleanup(m); }
};
struct EasyDeleter {
  void operator()(CURL* e) const { curl_easy_cleanup(e); }
};
struct SlistDeleter {
  void operator()(curl_slist* l) const { curl_slist_free_all(l); }
};

size_t DiscardBody(char*, size_t size, size_t count, void*) { return size * count; }

// One wake in flight.
struct Transfer {
  std::string url;  // the full /wake URL
  std::unique_ptr<CURL, EasyDeleter> easy;
  std::array<char, CURL_ERROR_SIZE> error{};
};

}  // namespace

int WakeReplicas(const std::vector<std::string>& urls, const WakeOptions& options) {
  if (urls.empty()) return 0;
  EnsureCurlInitialized();
  std::unique_ptr<CURLM, MultiDeleter> multi(curl_multi_init());
  std::unique_ptr<curl_slist, SlistDeleter> headers(
      curl_slist_append(nullptr, "Content-Type: application/json"));
  if (headers && !options.bearer_token.empty()) {
    const std::string authorization = absl::StrCat("Authorization: Bearer ", options.bearer_token);
    curl_slist_append(headers.get(), authorization.c_str());
  }
  if (!multi || !headers) {
    spdlog::warn("wake: cannot initialize libcurl; skipping {} replica(s)", urls.size());
    return 0;
  }
  const long timeout_ms = static_cast<long>(std::max<int64_t>(1, options.timeout.count()));
  const size_t window = static_cast<size_t>(std::max(1, options.max_concurrency));

  std::vector<std::unique_ptr<Transfer>> transfers;
  transfers.reserve(urls.size());
  size_t next = 0;
  size_t in_flight = 0;
  int succeeded = 0;
  auto start_more = [&] {
    while (in_flight < window && next < urls.size()) {
      auto t = std::make_unique<Transfer>();
      t->url = absl::StrCat(urls[next++], "/wake");
      t->easy.reset(curl_easy_init());
      CURL* e = t->easy.get();
      if (e == nullptr) {
        spdlog::warn("wake {}: cannot create a libcurl handle", t->url);
        continue;
      }
      curl_easy_setopt(e, CURLOPT_URL, t->url.c_str());
      curl_easy_setopt(e, CURLOPT_PROTOCOLS_STR, "http,https");
      curl_easy_setopt(e, CURLOPT_POSTFIELDS, "{}");
      curl_easy_setopt(e, CURLOPT_HTTPHEADER, headers.get());
      curl_easy_setopt(e, CURLOPT_TIMEOUT_MS, timeout_ms);
      curl_easy_setopt(e, CURLOPT_CONNECTTIMEOUT_MS, timeout_ms);
      curl_easy_setopt(e, CURLOPT_NOSIGNAL, 1L);
      // Replicas sit on the pool's own network; an environment proxy would
      // only add a hop that may not reach them.
      curl_easy_setopt(e, CURLOPT_PROXY, "");
      curl_easy_setopt(e, CURLOPT_WRITEFUNCTION, DiscardBody);
      curl_easy_setopt(e, CURLOPT_ERRORBUFFER, t->error.data());
      curl_easy_setopt(e, CURLOPT_PRIVATE, t.get());
      if (curl_multi_add_handle(multi.get(), e) != CURLM_OK) {
        spdlog::warn("wake {}: cannot start the request", t->url);
        continue;
      }
      ++in_flight;
      transfers.push_back(std::move(t));
    }
  };

  start_more();
  while (in_flight > 0) {
    int running = 0;
    if (curl_multi_perform(multi.get(), &running) != CURLM_OK) break;
    int left = 0;
    while (CURLMsg* msg = curl_multi_info_read(multi.get(), &left)) {
      if (msg->msg != CURLMSG_DONE) continue;
      Transfer* t = nullptr;
      curl_easy_getinfo(msg->easy_handle, CURLINFO_PRIVATE, &t);
      long code = 0;
      curl_easy_getinfo(msg->easy_handle, CURLINFO_RESPONSE_CODE, &code);
      if (msg->data.result != CURLE_OK) {
        spdlog::warn("wake {}: {}; the replica will still catch up on its own", t->url,
                     t->error[0] != '\0' ? t->error.data() : curl_easy_strerror(msg->data.result));
      } else if (code < 200 || code >= 300) {
        spdlog::warn("wake {}: HTTP {}; the replica will still catch up on its own", t->url, code);
      } else {
        ++succeeded;
      }
      curl_multi_remove_handle(multi.get(), msg->easy_handle);
      t->easy.reset();
      --in_flight;
    }
    start_more();
    if (in_flight == 0) break;
    int ready = 0;
    if (curl_multi_poll(multi.get(), nullptr, 0, 100, &ready) != CURLM_OK) break;
  }
  for (auto& t : transfers) {
    if (t->easy) curl_multi_remove_handle(multi.get(), t->easy.get());
  }
  return succeeded;
}

absl::StatusOr<std::unique_ptr<Pool>> MakePool(std::string_view spec, const WakeOptions& options) {
  const absl::string_view text = AbslView(spec);
  if (absl::StartsWith(text, "static:") || absl::StartsWithIgnoreCase(text, "http://") ||
      absl::StartsWithIgnoreCase(text, "https://")) {
    auto pool = StaticPool::Parse(spec, options);
    if (!pool.ok()) return pool.status();
    return std::unique_ptr<Pool>(*std::move(pool));
  }
  if (absl::StartsWith(text, "file:")) {
    auto pool = FilePool::Parse(spec, options);
    if (!pool.ok()) return pool.status();
    return std::unique_ptr<Pool>(*std::move(pool));
  }
  if (absl::StartsWith(text, "dns:")) {
    auto pool = DnsPool::Parse(spec, options);
    if (!pool.ok()) {
      return absl::InvalidArgumentError(absl::StrCat(pool.status().message(),
                                                     " (supported: static:URL,URL,..., file:PATH, "
                                                     "dns:NAME:PORT)"));
    }
    return std::unique_ptr<Pool>(*std::move(pool));
  }
  return absl::InvalidArgumentError(
      absl::StrCat("pool spec \"", absl::CEscape(text),
                   "\" is not supported; use static:URL,URL,..., file:PATH (one URL per line), "
                   "dns:NAME:PORT, or a comma-separated list of http(s) replica URLs"));
}

int WakeDiscovered(Pool& pool, const WakeOptions& options) {
  auto urls = pool.Discover();
  if (!urls.ok()) {
    spdlog::warn("wake {}: {}; the replicas will still catch up on their own", pool.spec(),
                 std::string(urls.status().message()));
    return 0;
  }
  return WakeReplicas(*urls, options);
}

}  // namespace stitch

// OpenStore: picks the Store adapter for a URI.
//
// Text containing "://", or starting with "file:", is a URI parsed by
// Boost.URL (percent-decoding included); anything else is a plain path. A
// relative path like "runs:a" is therefore a path, not a URI with scheme
// "runs".
#include "stitch/fetch/open_store.h"

#include <boost/url/parse.hpp>
#include <boost/url/url_view.hpp>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "stitch/core/errors.h"
#include "stitch/fetch/cached_store.h"
#include "stitch/store/fs_store.h"
#include "stitch/store/mem_store.h"
#include "stitch/store/s3/s3_store.h"

namespace stitch {
namespace {

constexpr absl::string_view kSupported =
    "supported: a plain path, file:///abs/path, mem://NAME or "
    "s3://BUCKET/PREFIX[?endpoint=URL&region=R]";

absl::StatusOr<std::unique_ptr<Store>> Upcast(absl::StatusOr<std::unique_ptr<FsStore>> s) {
  if (!s.ok()) return s.status();
  return std::unique_ptr<Store>(*std::move(s));
}

absl::StatusOr<std::unique_ptr<Store>> Upcast(absl::StatusOr<std::unique_ptr<MemStore>> s) {
  if (!s.ok()) return s.status();
  return std::unique_ptr<Store>(*std::move(s));
}

// The S3 store behind its verified version cache.
absl::StatusOr<std::unique_ptr<Store>> OpenS3(std::string_view uri, const StoreOptions& options) {
  S3StoreOptions s3;
  s3.index_bounds = options.index_bounds;
  auto remote = S3Store::Open(uri, options.run_id, S3Environment::FromProcess(), s3);
  if (!remote.ok()) return remote.status();
  auto cached = CachedStore::Open(*std::move(remote), options.cache_dir, options.peers, nullptr,
                                  s3.parallelism);
  if (!cached.ok()) return cached.status();
  return std::unique_ptr<Store>(*std::move(cached));
}

}  // namespace

absl::StatusOr<std::unique_ptr<Store>> OpenStore(std::string_view uri,
                                                 const StoreOptions& options) {
  const absl::string_view text = AbslView(uri);
  if (absl::StripAsciiWhitespace(text).empty()) {
    return absl::InvalidArgumentError(absl::StrCat("store URI is empty; ", kSupported));
  }
  bool is_uri = absl::StrContains(text, "://") || absl::StartsWithIgnoreCase(text, "file:");
  if (!is_uri)
    return Upcast(FsStore::Open(std::filesystem::path(uri), options.run_id, options.index_bounds));

  auto parsed = boost::urls::parse_uri(uri);
  if (!parsed) {
    return absl::InvalidArgumentError(
        absl::StrCat("store URI \"", absl::CEscape(text),
                     "\" is not a valid URI: ", parsed.error().message(), "; ", kSupported));
  }
  const boost::urls::url_view& u = *parsed;
  std::string scheme = absl::AsciiStrToLower(std::string(u.scheme()));
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(
        absl::StrCat("store URI \"", absl::CEscape(text), "\" ", why, "; ", kSupported));
  };
  if (u.has_query() || u.has_fragment()) {
    if (scheme == "file" || scheme == "mem") return bad("has a query or fragment");
  }
  if (scheme == "file") {
    std::string host = u.host();
    if (!host.empty() && !absl::EqualsIgnoreCase(host, "localhost")) {
      return bad(absl::StrCat("names host \"", host, "\"; only local paths are supported"));
    }
    std::string path = u.path();
    if (path.empty() || path.front() != '/') return bad("has no absolute path");
    return Upcast(FsStore::Open(std::filesystem::path(path), options.run_id, options.index_bounds));
  }
  if (scheme == "mem") {
    std::string name = absl::StrCat(std::string(u.host()), std::string(u.path()));
    if (name.empty()) return bad("has no name (mem://NAME)");
    return Upcast(MemStore::Open(std::move(name), options.run_id, options.cache_dir));
  }
  if (scheme == "s3") return OpenS3(uri, options);
  return bad(absl::StrCat("has an unsupported scheme \"", scheme, "\""));
}

}  // namespace stitch

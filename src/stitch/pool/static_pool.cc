#include "stitch/pool/static_pool.h"

#include <boost/url/parse.hpp>
#include <boost/url/url_view.hpp>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "stitch/core/errors.h"

namespace stitch {

absl::StatusOr<std::string> NormalizeReplicaUrl(std::string_view entry_view) {
  const absl::string_view entry = AbslView(entry_view);
  auto bad = [&](absl::string_view why) {
    return absl::InvalidArgumentError(absl::StrCat("pool spec: \"", absl::CEscape(entry), "\" ",
                                                   why, "; expected http://host:port"));
  };
  auto parsed = boost::urls::parse_absolute_uri(entry_view);
  if (!parsed) return bad(absl::StrCat("is not a URL (", parsed.error().message(), ")"));
  std::string scheme = absl::AsciiStrToLower(std::string(parsed->scheme()));
  if (scheme != "http" && scheme != "https") return bad("is not an http(s) URL");
  if (!parsed->has_authority() || parsed->encoded_host().empty()) return bad("has no host");
  if (parsed->has_query() || parsed->has_fragment()) return bad("has a query or fragment");
  std::string url(parsed->buffer());
  while (url.ends_with('/')) url.pop_back();
  return url;
}

absl::StatusOr<std::unique_ptr<StaticPool>> StaticPool::Parse(std::string_view spec,
                                                              const WakeOptions& options) {
  absl::string_view list = AbslView(spec);
  absl::ConsumePrefix(&list, "static:");
  std::vector<std::string> urls;
  for (absl::string_view entry : absl::StrSplit(list, ',')) {
    entry = absl::StripAsciiWhitespace(entry);
    if (entry.empty()) continue;
    auto url = NormalizeReplicaUrl(std::string_view(entry.data(), entry.size()));
    if (!url.ok()) return url.status();
    if (std::find(urls.begin(), urls.end(), *url) == urls.end()) urls.push_back(*std::move(url));
  }
  if (urls.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("pool spec \"", absl::CEscape(AbslView(spec)),
                     "\" lists no replica URLs; use static:URL,URL,..."));
  }
  return std::make_unique<StaticPool>(std::move(urls), options);
}

StaticPool::StaticPool(std::vector<std::string> urls, const WakeOptions& options)
    : urls_(std::move(urls)), options_(options) {}

std::string StaticPool::spec() const { return absl::StrCat("static:", absl::StrJoin(urls_, ",")); }

absl::StatusOr<std::vector<std::string>> StaticPool::Discover() { return urls_; }

int StaticPool::Wake() { return WakeReplicas(urls_, options_); }

}  // namespace stitch

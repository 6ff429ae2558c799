#include "stitch/pool/file_pool.h"

#include <spdlog/spdlog.h>

#include <algorithm>
#include <fstream>
#include <sstream>
#include <system_error>

#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "stitch/core/errors.h"
#include "stitch/pool/static_pool.h"

namespace stitch {

absl::StatusOr<std::unique_ptr<FilePool>> FilePool::Parse(std::string_view spec,
                                                          const WakeOptions& options) {
  absl::string_view path = AbslView(spec);
  absl::ConsumePrefix(&path, "file:");
  path = absl::StripAsciiWhitespace(path);
  if (path.empty()) {
    return absl::InvalidArgumentError(
        absl::StrCat("pool spec \"", absl::CEscape(AbslView(spec)),
                     "\" names no file; use file:PATH (one replica URL per line)"));
  }
  return std::make_unique<FilePool>(std::filesystem::path(std::string(path)), options);
}

FilePool::FilePool(std::filesystem::path path, const WakeOptions& options)
    : path_(std::move(path)), options_(options) {}

std::string FilePool::spec() const { return absl::StrCat("file:", path_.string()); }

absl::StatusOr<std::vector<std::string>> FilePool::Discover() {
  std::error_code ec;
  if (!std::filesystem::exists(path_, ec)) {
    if (!ec) {
      return absl::NotFoundError(absl::StrCat("pool file ", path_.string(),
                                              " does not exist; create it with one replica URL "
                                              "per line"));
    }
    return absl::UnavailableError(absl::StrCat("pool file ", path_.string(), ": ", ec.message()));
  }
  std::ifstream in(path_);
  if (!in) {
    return absl::UnavailableError(absl::StrCat("pool file ", path_.string(), " cannot be read"));
  }
  std::stringstream text;
  text << in.rdbuf();
  std::vector<std::string> urls;
  int line_number = 0;
  for (absl::string_view line : absl::StrSplit(text.str(), '\n')) {
    ++line_number;
    line = absl::StripAsciiWhitespace(line);
    if (line.empty() || absl::StartsWith(line, "#")) continue;
    auto url = NormalizeReplicaUrl(std::string_view(line.data(), line.size()));
    if (!url.ok()) {
      return absl::InvalidArgumentError(absl::StrCat("pool file ", path_.string(), " line ",
                                                     line_number, ": ", url.status().message()));
    }
    if (std::find(urls.begin(), urls.end(), *url) == urls.end()) urls.push_back(*std::move(url));
  }
  return urls;
}

int FilePool::Wake() { return WakeDiscovered(*this, options_); }

}  // namespace stitch

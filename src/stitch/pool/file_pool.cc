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
  const auto mtime = std::filesystem::last_write_time(path_, ec);
  if (ec) {
    if (ec == std::errc::no_such_file_or_directory) {
      return absl::NotFoundError(absl::StrCat("pool file ", path_.string(),
                                              " does not exist; create it with one replica URL "
                                              "per line"));
    }
    return absl::UnavailableError(absl::StrCat("pool file ", path_.string(), ": ", ec.message()));
  }
  const uintmax_t size = std::filesystem::file_size(path_, ec);
  if (ec) {
    return absl::UnavailableError(absl::StrCat("pool file ", path_.string(), ": ", ec.message()));
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (cached_ && mtime == mtime_ && size == size_) return urls_;

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
  // A file rewritten within the clock's granularity keeps its mtime; the size
  // usually changes with it, and a later rewrite is picked up regardless.
  cached_ = true;
  mtime_ = mtime;
  size_ = size;
  urls_ = urls;
  return urls;
}

int FilePool::Wake() { return WakeDiscovered(*this, options_); }

}  // namespace stitch

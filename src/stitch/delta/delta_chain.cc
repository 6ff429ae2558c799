#include "stitch/delta/delta_chain.h"

#include <algorithm>

#include "absl/strings/str_cat.h"
#include "stitch/core/errors.h"
#include "stitch/core/version.h"

namespace stitch {
namespace fs = std::filesystem;

absl::StatusOr<DeltaChain> OpenDeltaChain(std::span<const fs::path> dirs, std::string_view run_id) {
  DeltaChain chain;
  chain.run_id = std::string(run_id);
  for (const fs::path& dir : dirs) {
    absl::StatusOr<DeltaVersion> d = DeltaVersion::Open(dir);
    if (!d.ok()) return d.status();
    chain.deltas.push_back(*std::move(d));
  }
  std::stable_sort(
      chain.deltas.begin(), chain.deltas.end(),
      [](const DeltaVersion& a, const DeltaVersion& b) { return a.version() < b.version(); });
  // The run: the caller's, else the first one a version names.
  std::string_view named_by;
  if (chain.run_id.empty()) {
    for (const DeltaVersion& d : chain.deltas) {
      if (!d.run_id().empty()) {
        chain.run_id = d.run_id();
        named_by = d.dir().native();
        break;
      }
    }
  }
  for (size_t i = 0; i < chain.deltas.size(); ++i) {
    const DeltaVersion& d = chain.deltas[i];
    if (!d.run_id().empty() && d.run_id() != chain.run_id) {
      return absl::FailedPreconditionError(absl::StrCat(
          "delta ", d.dir().string(), " belongs to run \"", d.run_id(), "\", not \"", chain.run_id,
          "\"", named_by.empty() ? "" : absl::StrCat(" (named by ", AbslView(named_by), ")"),
          "; a lineage cannot mix runs"));
    }
    if (d.base_version() != d.version() - 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "delta ", d.dir().string(), " (version ", d.version(), ") says base_version ",
          d.base_version(), "; a delta must apply to the version just before it (", d.version() - 1,
          ")"));
    }
    if (i == 0) continue;
    const DeltaVersion& prev = chain.deltas[i - 1];
    if (d.version() == prev.version()) {
      return absl::InvalidArgumentError(absl::StrCat("version ", d.version(),
                                                     " is given twice: ", prev.dir().string(),
                                                     " and ", d.dir().string()));
    }
    if (d.version() != prev.version() + 1) {
      return absl::InvalidArgumentError(absl::StrCat(
          "the lineage has a gap: ", prev.dir().string(), " is version ", prev.version(), ", ",
          d.dir().string(), " is version ", d.version(), "; the deltas for versions ",
          prev.version() + 1,
          d.version() - 1 > prev.version() + 1 ? absl::StrCat("..", d.version() - 1) : "",
          " are missing"));
    }
  }
  return chain;
}

std::map<std::string, TensorChange, std::less<>> PlanChanges(const DeltaChain& chain,
                                                             size_t first) {
  std::map<std::string, TensorChange, std::less<>> plan;
  for (size_t i = first; i < chain.deltas.size(); ++i) {
    const DeltaVersion& d = chain.deltas[i];
    for (const DeltaEntry& e : d.entries()) {
      TensorChange& c = plan[e.tensor];
      c.frames.push_back(d.Frame(e));
      c.expected = e.checksum;
      if (e.content_size) c.content_size = e.content_size;
    }
  }
  return plan;
}

absl::Status CheckChainAgainst(
    const DeltaChain& chain,
    const std::function<std::optional<uint64_t>(std::string_view)>& size_of) {
  for (const DeltaVersion& d : chain.deltas) {
    for (const DeltaEntry& e : d.entries()) {
      std::optional<uint64_t> n = size_of(e.tensor);
      if (!n) {
        return absl::InvalidArgumentError(
            absl::StrCat("delta ", d.dir().string(), " changes tensor \"", e.tensor,
                         "\", which the checkpoint it applies to does not have"));
      }
      if (e.content_size && *e.content_size != *n) {
        return absl::DataLossError(absl::StrCat("tensor \"", e.tensor, "\": zstd frame in ",
                                                d.files()[e.file].path.string(), " (version ",
                                                d.version(), ") decodes to ", *e.content_size,
                                                " bytes, the tensor has ", *n));
      }
    }
  }
  return absl::OkStatus();
}

}  // namespace stitch

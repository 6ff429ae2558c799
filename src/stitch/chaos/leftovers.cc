#include "stitch/chaos/leftovers.h"

#include <unistd.h>

#include <fstream>

#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_format.h"
#include "absl/strings/str_split.h"

namespace stitch {
namespace fs = std::filesystem;
namespace {

bool LooksTemporary(const std::string& name) {
  return absl::StrContains(name, ".tmp") || absl::StartsWith(name, "tmp");
}

}  // namespace

std::vector<std::string> LeftoverProcesses(const std::set<int>& groups) {
  std::vector<std::string> out;
  const int self = ::getpid();
  std::error_code ec;
  for (auto it = fs::directory_iterator("/proc", ec); !ec && it != fs::directory_iterator();
       it.increment(ec)) {
    int pid = 0;
    if (!absl::SimpleAtoi(it->path().filename().string(), &pid) || pid == self) continue;
    std::ifstream in(it->path() / "stat");
    std::string line;
    if (!std::getline(in, line)) continue;
    const size_t open = line.find('(');
    const size_t close = line.rfind(')');
    if (open == std::string::npos || close == std::string::npos) continue;
    std::vector<std::string> rest = absl::StrSplit(line.substr(close + 2), ' ');
    if (rest.size() < 3) continue;
    int ppid = 0;
    int pgrp = 0;
    if (!absl::SimpleAtoi(rest[1], &ppid) || !absl::SimpleAtoi(rest[2], &pgrp)) continue;
    if (rest[0] == "Z" || (ppid != self && !groups.contains(pgrp))) continue;
    out.push_back(absl::StrFormat("pid %d (%s), parent %d, process group %d", pid,
                                  line.substr(open + 1, close - open - 1), ppid, pgrp));
  }
  return out;
}

std::vector<std::string> LeftoverTemp(const fs::path& dir, const std::vector<fs::path>& skip) {
  std::vector<std::string> out;
  std::error_code ec;
  for (auto it = fs::directory_iterator(dir / "tmp", ec); !ec && it != fs::directory_iterator();
       it.increment(ec)) {
    out.push_back(fs::relative(it->path(), dir, ec).string());
  }
  for (auto it = fs::recursive_directory_iterator(dir, ec);
       !ec && it != fs::recursive_directory_iterator(); it.increment(ec)) {
    const fs::path& p = it->path();
    bool skipped = false;
    for (const fs::path& s : skip) skipped |= p == s;
    if (skipped || p == dir / "tmp") {
      it.disable_recursion_pending();
      continue;
    }
    if (LooksTemporary(p.filename().string())) {
      out.push_back(fs::relative(p, dir, ec).string());
      it.disable_recursion_pending();
    }
  }
  return out;
}

}  // namespace stitch

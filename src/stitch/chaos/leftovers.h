// What a chaos run may leave behind once it has stopped everything: live
// processes and temporary files. Read from /proc and the run directory.
#pragma once

#include <filesystem>
#include <set>
#include <string>
#include <vector>

namespace stitch {

// Processes still alive that the run started or orphaned: children of this
// process (a subreaper, so orphans come back to it) and members of the
// process groups in `groups`. One line each, naming the pid, command,
// parent and group.
std::vector<std::string> LeftoverProcesses(const std::set<int>& groups);

// Temporary files and directories left under `dir`: everything in its tmp/
// (the TMPDIR of every process of the run), and anything named like a
// temporary elsewhere, except under `skip`. Paths relative to `dir`.
std::vector<std::string> LeftoverTemp(const std::filesystem::path& dir,
                                      const std::vector<std::filesystem::path>& skip);

}  // namespace stitch

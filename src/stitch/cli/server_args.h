// The request-body limits of the commands that serve HTTP requests from
// clients (gateway, sidecar): --max-body-bytes and --max-total-body-bytes.
#pragma once

#include <CLI/CLI.hpp>
#include <cstdint>
#include <string>
#include <string_view>

#include "absl/status/statusor.h"
#include "stitch/net/server.h"

namespace stitch {

// --host, bound to `host`, with the shared default (kDefaultListenHost)
// stated in --help.
void AddHostOption(CLI::App* cmd, std::string* host);

struct BodyLimitArgs {
  uint64_t max_body_bytes = kDefaultMaxBodyBytes;
  uint64_t max_total_body_bytes = kDefaultMaxTotalBodyBytes;
};

// Adds both options to `cmd`, bound to `args`; sizes are bytes or take a
// unit (32MiB, 512M: multiples of 1024).
void AddBodyLimitOptions(CLI::App* cmd, BodyLimitArgs* args);

// `server` with the limits of `args`. InvalidArgument, one line starting
// with "<command>: " and naming the flag, for a zero limit or a total below
// the per-request limit.
[[nodiscard]] absl::StatusOr<ServerOptions> WithBodyLimits(ServerOptions server,
                                                           const BodyLimitArgs& args,
                                                           std::string_view command);

}  // namespace stitch

#include "stitch/cli/server_args.h"

#include "absl/strings/str_cat.h"
#include "stitch/core/errors.h"

namespace stitch {

void AddHostOption(CLI::App* cmd, std::string* host) {
  cmd->add_option("--host", *host,
                  "Address to listen on: 127.0.0.1 (the default) is this machine only; "
                  "0.0.0.0 listens on every interface")
      ->capture_default_str();
}

void AddBodyLimitOptions(CLI::App* cmd, BodyLimitArgs* args) {
  cmd->add_option("--max-body-bytes", args->max_body_bytes,
                  "Largest request body accepted (413 beyond); bytes, or with a unit: 32MiB")
      ->transform(CLI::AsSizeValue(false))
      ->capture_default_str();
  cmd->add_option("--max-total-body-bytes", args->max_total_body_bytes,
                  "Request bodies held at once by all requests in progress (503 with Retry-After "
                  "beyond); bytes, or with a unit: 512MiB")
      ->transform(CLI::AsSizeValue(false))
      ->capture_default_str();
}

absl::StatusOr<ServerOptions> WithBodyLimits(ServerOptions server, const BodyLimitArgs& args,
                                             std::string_view command) {
  if (args.max_body_bytes == 0 || args.max_total_body_bytes < args.max_body_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(AbslView(command),
                     ": --max-body-bytes must be above 0 and --max-total-body-bytes at least "
                     "as large (got ",
                     args.max_body_bytes, " and ", args.max_total_body_bytes, ")"));
  }
  server.max_body_bytes = args.max_body_bytes;
  server.max_total_body_bytes = args.max_total_body_bytes;
  return server;
}

}  // namespace stitch

// The store options shared by the store subcommands (claim, publish, ...).
#pragma once

#include <CLI/CLI.hpp>
#include <memory>
#include <string>

#include "absl/status/statusor.h"
#include "stitch/pool/pool.h"
#include "stitch/store/store.h"

namespace stitch {

// What --store takes, for every command's help.
inline constexpr char kStoreUriHelp[] =
    "Store URI: a path, file:///abs/path, mem://NAME or "
    "s3://BUCKET/PREFIX[?endpoint=URL&region=R&anonymous=true]";

struct StoreArgs {
  std::string store;
  std::string run_id;
  std::string pool;  // empty: wake nobody
  std::string cache_dir;
  std::string auth_token_file;  // the replicas' bearer token, for the wake
};

// Adds --store (required), --run-id (required, described by `run_id_help`),
// --pool, --cache-dir and --auth-token-file to `cmd`, bound to `args`.
void AddStoreOptions(CLI::App* cmd, StoreArgs* args, const std::string& run_id_help);

struct OpenedStore {
  std::unique_ptr<Store> store;
  std::unique_ptr<Pool> pool;  // null when no --pool was given
};

// Opens the store and, when one was named, the pool.
[[nodiscard]] absl::StatusOr<OpenedStore> OpenStoreArgs(const StoreArgs& args);

}  // namespace stitch

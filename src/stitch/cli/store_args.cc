#include "stitch/cli/store_args.h"

#include <utility>

#include "stitch/fetch/open_store.h"
#include "stitch/net/auth.h"

namespace stitch {

void AddStoreOptions(CLI::App* cmd, StoreArgs* args, const std::string& run_id_help) {
  cmd->add_option("--store", args->store, kStoreUriHelp)->required();
  cmd->add_option("--run-id", args->run_id, run_id_help)->required();
  cmd->add_option("--pool", args->pool,
                  "Replicas to wake: static:URL,URL,..., file:PATH or dns:NAME:PORT");
  cmd->add_option("--cache-dir", args->cache_dir,
                  "Where remote (s3://) stores download versions (unused by local stores)");
  cmd->add_option("--auth-token-file", args->auth_token_file,
                  "File holding the replicas' bearer token, sent with the wake (default: "
                  "$STITCH_AUTH_TOKEN when set)");
}

absl::StatusOr<OpenedStore> OpenStoreArgs(const StoreArgs& args) {
  OpenedStore opened;
  auto store = OpenStore(args.store, StoreOptions{args.run_id, args.cache_dir});
  if (!store.ok()) return store.status();
  opened.store = *std::move(store);
  if (!args.pool.empty()) {
    auto token = LoadBearerToken(args.auth_token_file, kAuthTokenEnv, "--auth-token-file");
    if (!token.ok()) return token.status();
    WakeOptions wake;
    wake.bearer_token = *token;
    auto pool = MakePool(args.pool, wake);
    if (!pool.ok()) return pool.status();
    opened.pool = *std::move(pool);
  }
  return opened;
}

}  // namespace stitch

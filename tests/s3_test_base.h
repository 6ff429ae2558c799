// The fixture of the tests against a real S3 protocol server: one moto
// server per test binary (started on first use, stopped after the last
// test), a fresh key prefix and temporary directory per test, and helpers to
// open stores on them.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <memory>
#include <string>

#include "stitch/fetch/cached_store.h"
#include "stitch/store/s3/s3_store.h"
#include "tests/s3_moto_server.h"
#include "tests/support/temp_dir.h"

namespace stitch::testing {

// The S3 store behind `store` (opened by S3Test::Open).
inline S3Store& S3(Store& store) { return static_cast<S3Store&>(*store.remote()); }

class S3Test : public ::testing::Test {
 protected:
  // Fails the test (with the reason, e.g. "run scripts/install-deps") when
  // the server cannot start.
  void SetUp() override;

  MotoServer& server() { return *server_; }
  // The URI of this test's own prefix ("s3://bucket/<test>-<hex>?endpoint=...").
  std::string Uri() const { return server_->Uri(prefix_); }
  const std::string& prefix() const { return prefix_; }
  const std::filesystem::path& tmp() const { return tmp_.path(); }

  // Options small enough to exercise multipart uploads and pagination with
  // small files, and retries that do not wait long.
  static S3StoreOptions SmallOptions();

  // Opens this test's store for `run_id` with the server's credentials, as
  // OpenStore does: the S3 store behind its version cache, under
  // tmp()/cache. S3() reaches the S3 store itself.
  std::unique_ptr<CachedStore> Open(const std::string& run_id,
                                    S3StoreOptions options = SmallOptions());
  std::unique_ptr<CachedStore> OpenAt(const std::string& uri, const std::string& run_id,
                                      const S3Environment& env,
                                      S3StoreOptions options = SmallOptions());

 private:
  MotoServer* server_ = nullptr;
  std::string prefix_;
  TempDir tmp_;
};

}  // namespace stitch::testing

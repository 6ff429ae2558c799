// A local S3 protocol server (moto) for the S3 tests, started through
// tests/s3_moto.py with the project's virtual environment (.venv, made by
// scripts/install-deps). The server checks every request's SigV4 signature
// against the credentials it hands out.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "stitch/store/s3/s3_uri.h"

namespace stitch::testing {

struct MotoServerOptions {
  // The address the server listens on.
  std::string host = "127.0.0.1";
  // Put before the helper's command line (argv[0] a path), e.g.
  // {"/usr/sbin/ip", "netns", "exec", "NS"} to run it in a network namespace;
  // the launcher must exec the helper in place (keep its pid).
  std::vector<std::string> launcher;
};

class MotoServer {
 public:
  // Starts the server and waits (bounded) until it is ready with a bucket.
  // FailedPrecondition telling to run scripts/install-deps when the virtual
  // environment is missing.
  [[nodiscard]] static absl::StatusOr<std::unique_ptr<MotoServer>> Start(
      const MotoServerOptions& options = {});
  // Stops the server and its helper (the whole process group).
  ~MotoServer();
  MotoServer(const MotoServer&) = delete;
  MotoServer& operator=(const MotoServer&) = delete;

  const std::string& endpoint() const { return endpoint_; }  // "http://HOST:PORT"
  const std::string& bucket() const { return bucket_; }
  const std::string& region() const { return region_; }

  // Long-term credentials of a user allowed everything.
  S3Environment Credentials() const;
  // Temporary credentials (with a session token) of an assumed role.
  S3Environment SessionCredentials() const;

  // "s3://BUCKET/<prefix>?endpoint=<endpoint>".
  std::string Uri(const std::string& prefix) const;

 private:
  MotoServer() = default;

  int pid_ = -1;
  int stdin_fd_ = -1;
  std::string endpoint_;
  std::string bucket_;
  std::string region_;
  std::string access_key_id_;
  std::string secret_access_key_;
  std::string session_access_key_id_;
  std::string session_secret_access_key_;
  std::string session_token_;
};

// A fresh prefix for one test: "<name>-<random hex>".
std::string UniquePrefix(const std::string& name);

}  // namespace stitch::testing

// Fakes for the publish tests: a pool that counts wakes and a store
// decorator that lets a test act in the middle of an operation.
#pragma once

#include <functional>
#include <string>
#include <vector>

#include "stitch/pool/pool.h"
#include "stitch/store/store.h"

namespace stitch::testing {

class CountingPool final : public Pool {
 public:
  std::string spec() const override { return "static:http://counting.invalid"; }
  absl::StatusOr<std::vector<std::string>> Discover() override {
    return std::vector<std::string>{"http://counting.invalid"};
  }
  int Wake() override {
    ++wakes;
    return 1;
  }
  int wakes = 0;
};

// Forwards every call to `inner`, running `after_publish_files` once
// PublishFiles has finished (to change the pointer "during the upload").
class InterferingStore final : public Store {
 public:
  explicit InterferingStore(Store& inner) : inner_(inner) {}

  std::function<void()> after_publish_files;
  int publish_files_calls = 0;
  int advance_pointer_calls = 0;

  std::string uri() const override { return inner_.uri(); }
  const std::string& run_id() const override { return inner_.run_id(); }
  absl::Status Refresh() override { return inner_.Refresh(); }
  absl::StatusOr<std::optional<VersionRef>> ReadPointer() override { return inner_.ReadPointer(); }
  absl::Status AdvancePointer(const std::optional<VersionRef>& expected,
                              const VersionRef& proposed) override {
    ++advance_pointer_calls;
    return inner_.AdvancePointer(expected, proposed);
  }
  absl::Status PublishFiles(int64_t version, const std::filesystem::path& dir) override {
    ++publish_files_calls;
    absl::Status s = inner_.PublishFiles(version, dir);
    if (after_publish_files) after_publish_files();
    return s;
  }
  absl::StatusOr<VersionManifest> ReadManifest(int64_t version) override {
    return inner_.ReadManifest(version);
  }
  absl::StatusOr<std::filesystem::path> Materialize(int64_t version) override {
    return inner_.Materialize(version);
  }

 private:
  Store& inner_;
};

}  // namespace stitch::testing

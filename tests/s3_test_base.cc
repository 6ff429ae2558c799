#include "tests/s3_test_base.h"

#include <mutex>

#include "absl/strings/str_replace.h"

namespace stitch::testing {
namespace {

struct Shared {
  std::once_flag once;
  std::unique_ptr<MotoServer> server;
  absl::Status error;
};

Shared& Get() {
  static Shared* shared = new Shared;
  return *shared;
}

// Stops the server after the last test of the binary.
class MotoEnvironment : public ::testing::Environment {
 public:
  void TearDown() override { Get().server.reset(); }
};

[[maybe_unused]] ::testing::Environment* const kEnvironment =
    ::testing::AddGlobalTestEnvironment(new MotoEnvironment);

}  // namespace

void S3Test::SetUp() {
  Shared& shared = Get();
  std::call_once(shared.once, [&] {
    auto started = MotoServer::Start();
    if (started.ok()) {
      shared.server = *std::move(started);
    } else {
      shared.error = started.status();
    }
  });
  ASSERT_NE(shared.server, nullptr) << shared.error.message();
  server_ = shared.server.get();
  const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
  prefix_ = UniquePrefix(absl::StrReplaceAll(info->name(), {{"_", "-"}, {"/", "-"}}));
}

S3StoreOptions S3Test::SmallOptions() {
  S3StoreOptions o;
  o.part_size = uint64_t{5} << 20;
  o.multipart_threshold = uint64_t{5} << 20;
  o.parallelism = 4;
  o.client.max_attempts = 3;
  o.client.initial_backoff = absl::Milliseconds(5);
  o.client.max_backoff = absl::Milliseconds(50);
  return o;
}

std::unique_ptr<CachedStore> S3Test::Open(const std::string& run_id, S3StoreOptions options) {
  return OpenAt(Uri(), run_id, server_->Credentials(), std::move(options));
}

std::unique_ptr<CachedStore> S3Test::OpenAt(const std::string& uri, const std::string& run_id,
                                            const S3Environment& env, S3StoreOptions options) {
  const int parallelism = options.parallelism;
  auto s3 = S3Store::Open(uri, run_id, env, std::move(options));
  EXPECT_TRUE(s3.ok()) << s3.status().message();
  if (!s3.ok()) return nullptr;
  auto store = CachedStore::Open(*std::move(s3), tmp_ / "cache", {}, nullptr, parallelism);
  EXPECT_TRUE(store.ok()) << store.status().message();
  return store.ok() ? *std::move(store) : nullptr;
}

}  // namespace stitch::testing

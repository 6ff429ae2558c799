// Every credential source of the S3 store against a real S3 protocol server
// that checks every signature (moto), which also serves STS and instance
// metadata: web identity (STS AssumeRoleWithWebIdentity), shared-file
// profiles (static keys, and roles assumed with STS AssumeRole), container
// credentials and EC2 instance metadata, in-process and through the
// `stitch` binary's environment; temporary credentials refreshed before
// they expire, and rotating in the middle of long transfers.
//
// moto answers an unsigned STS call (AssumeRoleWithWebIdentity, which real
// STS takes unsigned) only while its authentication is off, so the tests
// let exactly one unsigned request through just before each such call
// (AllowOneUnsignedRequest): every S3 request is still checked.
#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cstdlib>
#include <fstream>
#include <set>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_format.h"
#include "absl/synchronization/mutex.h"
#include "stitch/io/fileio.h"
#include "stitch/net/client.h"
#include "stitch/store/s3/s3_credential_chain.h"
#include "stitch/store/s3/s3_credential_sources.h"
#include "stitch/store/s3/s3_credentials.h"
#include "tests/s3_test_base.h"
#include "tests/support/loopback_http.h"
#include "tests/support/subprocess.h"
#include "tests/support/version_dirs.h"

namespace stitch::testing {
namespace {

namespace fs = std::filesystem;
using ::testing::HasSubstr;
using ::testing::StartsWith;

constexpr char kRoleArn[] = "arn:aws:iam::123456789012:role/stitch-role";

void WriteText(const fs::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::trunc);
  out << text;
}

std::string Iso(absl::Time t) {
  return absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", t, absl::UTCTimeZone());
}

// A clock tests move forward, safe to read from transfer threads.
class TestClock {
 public:
  absl::Time Now() const { return start_ + absl::Seconds(offset_s_.load()); }
  void Advance(absl::Duration d) { offset_s_ += absl::ToInt64Seconds(d); }
  AwsCredentialsOptions Options() const {
    AwsCredentialsOptions o;
    o.now = [this] { return Now(); };
    return o;
  }

 private:
  const absl::Time start_ = absl::Now();
  std::atomic<int64_t> offset_s_{0};
};

class S3CredentialsTest : public S3Test {
 protected:
  // Lets the next request to the server through unsigned (see above).
  void AllowOneUnsignedRequest() {
    FetchOptions options;
    options.headers.Set("Content-Type", "text/plain");
    auto r = HttpFetch("POST", server().endpoint() + "/moto-api/reset-auth", "1", options);
    ASSERT_TRUE(r.ok() && r->status == 200) << (r.ok() ? r->body : r.status().ToString());
  }

  // Settings that reach only moto's STS.
  AwsCredentialSettings StsSettings() {
    AwsCredentialSettings s;
    s.sts_endpoint_url = server().endpoint();
    s.region = server().region();
    return s;
  }

  std::unique_ptr<CachedStore> OpenWith(std::shared_ptr<AwsCredentialsProvider> credentials,
                                        const std::string& run_id = "run-a") {
    S3StoreOptions options = SmallOptions();
    options.client.credentials = std::move(credentials);
    return OpenAt(Uri(), run_id, S3Environment{}, std::move(options));
  }

  std::shared_ptr<AwsCredentialsProvider> Chain(const AwsCredentialSettings& settings,
                                                AwsCredentialsOptions options = {}) {
    auto chain = MakeDefaultCredentialsChain({}, settings, std::move(options));
    EXPECT_TRUE(chain.ok()) << chain.status();
    return chain.ok() ? *chain : nullptr;
  }

  static AwsCredentials Current(AwsCredentialsProvider& provider) {
    auto c = provider.Current();
    EXPECT_TRUE(c.ok() && c->has_value()) << c.status();
    return c.ok() && c->has_value() ? **c : AwsCredentials{};
  }

  // Claims, reads back and moves the pointer: three kinds of signed request.
  static void ExpectStoreWorks(Store& store, int64_t version) {
    absl::Status moved = store.AdvancePointer(
        version == 0 ? std::nullopt : std::optional<VersionRef>(VersionRef{"run-a", version - 1}),
        VersionRef{"run-a", version});
    ASSERT_TRUE(moved.ok()) << moved.message();
    auto pointer = store.ReadPointer();
    ASSERT_TRUE(pointer.ok()) << pointer.status().message();
    EXPECT_EQ(*pointer, (VersionRef{"run-a", version}));
  }

  // A credentials JSON document of `keys` as container and instance
  // metadata services serve it.
  static std::string CredentialsJson(const S3Environment& keys, absl::Time expiration) {
    return absl::StrCat(R"({"Code":"Success","AccessKeyId":")", keys.access_key_id,
                        R"(","SecretAccessKey":")", keys.secret_access_key, R"(","Token":")",
                        keys.session_token, R"(","Expiration":")", Iso(expiration), R"("})");
  }
};

TEST_F(S3CredentialsTest, WebIdentityCredentialsComeFromStsAndAreRefreshedBeforeTheyExpire) {
  WriteText(tmp() / "token", "eyJhbGciOiJSUzI1NiJ9.a-service-account-token.sig\n");
  AwsCredentialSettings s = StsSettings();
  s.web_identity_token_file = (tmp() / "token").string();
  s.role_arn = kRoleArn;
  s.role_session_name = "replica-0";
  TestClock clock;
  auto chain = Chain(s, clock.Options());
  auto store = OpenWith(chain);
  ASSERT_NE(store, nullptr);

  AllowOneUnsignedRequest();
  ExpectStoreWorks(*store, 0);
  AwsCredentials first = Current(*chain);
  EXPECT_THAT(first.access_key_id, StartsWith("ASIA"));
  EXPECT_FALSE(first.session_token.empty());
  EXPECT_EQ(first.source, absl::StrCat("web identity (role ", kRoleArn, ")"));
  ASSERT_TRUE(first.expiration.has_value());

  // 50 minutes on, with 10 of the hour left: new credentials from STS.
  clock.Advance(absl::Minutes(50));
  AllowOneUnsignedRequest();
  ExpectStoreWorks(*store, 1);
  AwsCredentials second = Current(*chain);
  EXPECT_NE(second.access_key_id, first.access_key_id);
  EXPECT_GT(*second.expiration, *first.expiration);

  // Expired, and STS refuses (moto asks for a signature): a one-line error
  // naming the source and the sources tried.
  clock.Advance(absl::Hours(2));
  auto pointer = store->ReadPointer();
  ASSERT_FALSE(pointer.ok());
  const std::string message(pointer.status().message());
  EXPECT_THAT(message, HasSubstr("S3 credentials from web identity (role "));
  EXPECT_THAT(message, HasSubstr("expired and cannot be refreshed: web identity (role "));
  EXPECT_THAT(message, HasSubstr("STS AssumeRoleWithWebIdentity at " + server().endpoint()));
  EXPECT_THAT(message, HasSubstr("(sources: environment variables, web identity"));
  EXPECT_EQ(message.find('\n'), std::string::npos);
}

TEST_F(S3CredentialsTest, ProfilesGiveStaticKeysAndAssumedRoles) {
  const S3Environment user = server().Credentials();
  WriteText(tmp() / "credentials",
            absl::StrCat("[stitch]\naws_access_key_id = ", user.access_key_id,
                         "\naws_secret_access_key = ", user.secret_access_key, "\n"));
  WriteText(tmp() / "config", absl::StrCat("[profile trainer]\nrole_arn = ", kRoleArn,
                                           "\nsource_profile = stitch\nrole_session_name = t\n"));
  AwsCredentialSettings s = StsSettings();
  s.shared_credentials_file = (tmp() / "credentials").string();
  s.config_file = (tmp() / "config").string();

  s.profile = "stitch";
  auto keys = Chain(s);
  auto store = OpenWith(keys);
  ASSERT_NE(store, nullptr);
  ExpectStoreWorks(*store, 0);
  EXPECT_EQ(Current(*keys).access_key_id, user.access_key_id);

  s.profile = "trainer";  // STS AssumeRole, signed with the stitch profile's keys
  auto role = Chain(s);
  auto assumed = OpenWith(role);
  ASSERT_NE(assumed, nullptr);
  ExpectStoreWorks(*assumed, 1);
  AwsCredentials c = Current(*role);
  EXPECT_THAT(c.access_key_id, StartsWith("ASIA"));
  EXPECT_THAT(c.source, HasSubstr(absl::StrCat("role ", kRoleArn, " assumed with profile")));
}

// Wraps a provider, making it fetch new credentials every fifth request
// (as if they had expired), and records which keys were handed out.
class RotatingProvider final : public AwsCredentialsProvider {
 public:
  explicit RotatingProvider(std::shared_ptr<AwsCredentialsProvider> inner)
      : inner_(std::move(inner)) {}
  absl::StatusOr<std::optional<AwsCredentials>> Current() override {
    if (calls_.fetch_add(1) % 5 == 4) inner_->Invalidate();
    auto c = inner_->Current();
    absl::MutexLock lock(&mu_);
    if (c.ok() && c->has_value()) keys_.insert((*c)->access_key_id);
    return c;
  }
  void Invalidate() override { inner_->Invalidate(); }
  std::string SourcesTried() const override { return inner_->SourcesTried(); }
  std::set<std::string> keys() const {
    absl::MutexLock lock(&mu_);
    return keys_;
  }
  int calls() const { return calls_.load(); }

 private:
  const std::shared_ptr<AwsCredentialsProvider> inner_;
  std::atomic<int> calls_{0};
  mutable absl::Mutex mu_;
  std::set<std::string> keys_;
};

TEST_F(S3CredentialsTest, CredentialsRotatingDuringLongTransfersNeverFailThem) {
  const S3Environment user = server().Credentials();
  WriteText(tmp() / "credentials",
            absl::StrCat("[stitch]\naws_access_key_id = ", user.access_key_id,
                         "\naws_secret_access_key = ", user.secret_access_key,
                         "\n[trainer]\nrole_arn = ", kRoleArn, "\nsource_profile = stitch\n"));
  AwsCredentialSettings s = StsSettings();
  s.shared_credentials_file = (tmp() / "credentials").string();
  s.profile = "trainer";
  auto rotating = std::make_shared<RotatingProvider>(Chain(s));
  auto store = OpenWith(rotating);
  ASSERT_NE(store, nullptr);
  // Two 6 MiB shards: multipart uploads (5 MiB parts) and four transfers
  // at once, while the credentials are replaced every fifth request; each
  // request and part is signed with the credentials current when it starts.
  TestVersionOptions big{.shards = 2, .tensors_per_shard = 1, .elements = 1600000};
  auto v1 = WriteTestVersion(tmp() / "src", 1, big);
  ASSERT_TRUE(v1.ok());
  absl::Status published = store->PublishFiles(1, *v1);
  ASSERT_TRUE(published.ok()) << published.message();
  auto dir = store->Materialize(1);
  ASSERT_TRUE(dir.ok()) << dir.status().message();
  for (int i = 0; i < 2; ++i) {
    const std::string name = TestShardName(big, i);
    EXPECT_EQ(ReadFileToString(*dir / name).value_or("a"),
              ReadFileToString(*v1 / name).value_or("b"));
  }
  EXPECT_GE(rotating->keys().size(), 4u) << rotating->calls() << " requests";
}

TEST_F(S3CredentialsTest, ContainerCredentialsCarryTheAuthorizationToken) {
  // moto's instance-metadata document has the container endpoints' form: a
  // full URI may point at it. Its keys are not moto's own, so S3 refuses
  // them, and the error names where they came from.
  AwsCredentialSettings s;
  s.container_full_uri =
      server().endpoint() + "/latest/meta-data/iam/security-credentials/default-role";
  auto from_moto = Chain(s);
  AwsCredentials fake = Current(*from_moto);
  EXPECT_EQ(fake.access_key_id, "test-key");
  ASSERT_TRUE(fake.expiration.has_value());
  EXPECT_GT(*fake.expiration, absl::Now() + absl::Hours(12));
  auto refused = OpenWith(from_moto);
  ASSERT_NE(refused, nullptr);
  auto pointer = refused->ReadPointer();
  EXPECT_TRUE(absl::IsPermissionDenied(pointer.status())) << pointer.status();
  EXPECT_THAT(std::string(pointer.status().message()),
              HasSubstr(absl::StrCat("check the credentials from container credentials (",
                                     s.container_full_uri, ")")));

  // An agent (as ECS and EKS Pod Identity run) handing out moto's
  // temporary credentials only to the holder of the token in the file.
  const S3Environment session = server().SessionCredentials();
  LoopbackHttpServer::Options o;
  o.handler = [&](const LoopbackHttpServer::Request& r) -> LoopbackHttpServer::Reply {
    if (!absl::EndsWith(r.head, "\r\nAuthorization: pod-identity-token")) return {401, ""};
    return {200, CredentialsJson(session, absl::Now() + absl::Hours(1))};
  };
  LoopbackHttpServer agent(o);
  WriteText(tmp() / "token", "pod-identity-token\n");
  AwsCredentialSettings pod;
  pod.container_full_uri = agent.url() + "/v1/credentials";
  pod.container_authorization_token_file = (tmp() / "token").string();
  auto store = OpenWith(Chain(pod));
  ASSERT_NE(store, nullptr);
  ExpectStoreWorks(*store, 0);
}

TEST_F(S3CredentialsTest, InstanceMetadataCredentialsAndRegion) {
  // moto's own instance metadata: IMDSv2 token, role, credentials, region.
  AwsCredentialSettings s;
  s.ec2_metadata_endpoint = server().endpoint();
  auto from_moto = Chain(s);
  AwsCredentials fake = Current(*from_moto);
  EXPECT_EQ(fake.access_key_id, "test-key");
  EXPECT_EQ(fake.session_token, "test-session-token");
  EXPECT_EQ(fake.source, "EC2 instance metadata (role default-role)");
  EXPECT_EQ(InstanceMetadataRegion(server().endpoint()), server().region());
  auto refused = OpenWith(from_moto);
  ASSERT_NE(refused, nullptr);
  auto pointer = refused->ReadPointer();
  EXPECT_TRUE(absl::IsPermissionDenied(pointer.status())) << pointer.status();
  EXPECT_THAT(std::string(pointer.status().message()),
              HasSubstr("check the credentials from EC2 instance metadata (role default-role)"));

  // An IMDSv2-only service (a metadata GET without the session token is
  // refused) handing out moto's temporary credentials.
  const S3Environment session = server().SessionCredentials();
  LoopbackHttpServer::Options o;
  o.handler = [&](const LoopbackHttpServer::Request& r) -> LoopbackHttpServer::Reply {
    if (r.line == "PUT /latest/api/token") return {200, "imds-session"};
    if (!absl::StrContains(r.head, "X-aws-ec2-metadata-token: imds-session")) return {401, ""};
    if (r.line == "GET /latest/meta-data/iam/security-credentials/") return {200, "replica-role"};
    if (r.line == "GET /latest/meta-data/iam/security-credentials/replica-role") {
      return {200, CredentialsJson(session, absl::Now() + absl::Hours(6))};
    }
    return {404, ""};
  };
  LoopbackHttpServer imds(o);
  AwsCredentialSettings ec2;
  ec2.ec2_metadata_endpoint = imds.url();
  auto store = OpenWith(Chain(ec2));
  ASSERT_NE(store, nullptr);
  ExpectStoreWorks(*store, 0);
}

// The `stitch` binary resolving credentials from its environment.
class S3CredentialsCliTest : public S3CredentialsTest {
 protected:
  void SetUp() override {
    S3CredentialsTest::SetUp();
    if (HasFatalFailure()) return;
    ASSERT_FALSE(StitchBinary().empty()) << "STITCH_BIN is not set";
    // Nothing from this machine: no keys, no files, no instance metadata.
    for (const char* name : kVariables) ::unsetenv(name);
    Set("AWS_SHARED_CREDENTIALS_FILE", (tmp() / "no-credentials").string());
    Set("AWS_CONFIG_FILE", (tmp() / "no-config").string());
    Set("AWS_EC2_METADATA_DISABLED", "true");
    Set("AWS_REGION", server().region());
    // The SDKs' per-service endpoint overrides.
    Set("AWS_ENDPOINT_URL_S3", server().endpoint());
    Set("AWS_ENDPOINT_URL_STS", server().endpoint());
  }
  void TearDown() override {
    for (const char* name : kVariables) ::unsetenv(name);
  }
  static void Set(const char* name, const std::string& value) { ::setenv(name, value.c_str(), 1); }
  std::string Store() { return absl::StrCat("s3://", server().bucket(), "/", prefix()); }
  static constexpr const char* kVariables[] = {"AWS_ACCESS_KEY_ID",
                                               "AWS_SECRET_ACCESS_KEY",
                                               "AWS_SESSION_TOKEN",
                                               "AWS_REGION",
                                               "AWS_DEFAULT_REGION",
                                               "AWS_PROFILE",
                                               "AWS_SHARED_CREDENTIALS_FILE",
                                               "AWS_CONFIG_FILE",
                                               "AWS_WEB_IDENTITY_TOKEN_FILE",
                                               "AWS_ROLE_ARN",
                                               "AWS_ROLE_SESSION_NAME",
                                               "AWS_ENDPOINT_URL",
                                               "AWS_ENDPOINT_URL_S3",
                                               "AWS_ENDPOINT_URL_STS",
                                               "AWS_EC2_METADATA_DISABLED",
                                               "AWS_EC2_METADATA_SERVICE_ENDPOINT",
                                               "AWS_CONTAINER_CREDENTIALS_FULL_URI"};
};

// With no credentials anywhere a store is refused before any request is
// sent, as the AWS SDKs refuse (NoCredentialsError), naming the sources
// tried; requests go unsigned only when the URI asks (anonymous=true), and
// a bucket that refuses them says so.
TEST_F(S3CredentialsCliTest,
       WithoutCredentialsTheStoreIsRefusedUnlessTheUriAsksForAnonymousAccess) {
  std::atomic<int> requests{0};
  std::atomic<bool> signed_request{false};
  LoopbackHttpServer::Options o;
  o.handler = [&](const LoopbackHttpServer::Request& r) -> LoopbackHttpServer::Reply {
    ++requests;
    if (absl::StrContains(absl::AsciiStrToLower(r.head), "\r\nauthorization:")) {
      signed_request = true;
    }
    return {403, "<Error><Code>AccessDenied</Code><Message>Access Denied</Message></Error>"};
  };
  LoopbackHttpServer s3(o);
  Set("AWS_ENDPOINT_URL_S3", s3.url());
  ProcessResult pointer = RunStitch({"pointer", "--store", Store()});
  EXPECT_EQ(requests.load(), 0);
  EXPECT_EQ(pointer.exit_code, 1);
  EXPECT_THAT(pointer.err, StartsWith("stitch: store s3://"));
  EXPECT_THAT(pointer.err,
              HasSubstr("no S3 credentials were found (sources tried: environment variables, web "
                        "identity (AWS_WEB_IDENTITY_TOKEN_FILE), profile \"default\" in "));
  EXPECT_THAT(pointer.err, HasSubstr("container credentials"));
  EXPECT_THAT(pointer.err, HasSubstr("anonymous=true"));
  EXPECT_EQ(std::count(pointer.err.begin(), pointer.err.end(), '\n'), 1) << pointer.err;

  ProcessResult anonymous = RunStitch({"pointer", "--store", Store() + "?anonymous=true"});
  EXPECT_EQ(requests.load(), 1);
  EXPECT_FALSE(signed_request.load());
  EXPECT_EQ(anonymous.exit_code, 1);
  EXPECT_THAT(anonymous.err, HasSubstr("bucket refuses anonymous access"));
  EXPECT_EQ(std::count(anonymous.err.begin(), anonymous.err.end(), '\n'), 1) << anonymous.err;
}

TEST_F(S3CredentialsCliTest, AServiceAccountRoleFromTheEnvironment) {
  WriteText(tmp() / "token", "a-projected-service-account-token");
  Set("AWS_WEB_IDENTITY_TOKEN_FILE", (tmp() / "token").string());
  Set("AWS_ROLE_ARN", kRoleArn);
  AllowOneUnsignedRequest();
  ProcessResult claim = RunStitch({"claim", "--store", Store(), "--run-id", "run-w"});
  ASSERT_EQ(claim.exit_code, 0) << claim.err;
  AllowOneUnsignedRequest();
  ProcessResult pointer = RunStitch({"pointer", "--store", Store()});
  ASSERT_EQ(pointer.exit_code, 0) << pointer.err;
  EXPECT_EQ(pointer.out, "run-w/weight_v000000\n");
}

TEST_F(S3CredentialsCliTest, AProfileFromTheEnvironment) {
  const S3Environment user = server().Credentials();
  WriteText(tmp() / "credentials",
            absl::StrCat("[ci]\naws_access_key_id = ", user.access_key_id,
                         "\naws_secret_access_key = ", user.secret_access_key, "\n"));
  Set("AWS_SHARED_CREDENTIALS_FILE", (tmp() / "credentials").string());
  Set("AWS_PROFILE", "ci");
  ProcessResult claim = RunStitch({"claim", "--store", Store(), "--run-id", "run-p"});
  ASSERT_EQ(claim.exit_code, 0) << claim.err;
  Set("AWS_PROFILE", "missing");
  ProcessResult missing = RunStitch({"pointer", "--store", Store()});
  EXPECT_EQ(missing.exit_code, 1);
  EXPECT_THAT(missing.err, HasSubstr("profile \"missing\""));
  EXPECT_THAT(missing.err, HasSubstr("sources tried: environment variables, web identity"));
}

TEST_F(S3CredentialsCliTest, InstanceMetadataAtItsEndpointOverride) {
  ::unsetenv("AWS_EC2_METADATA_DISABLED");
  Set("AWS_EC2_METADATA_SERVICE_ENDPOINT", server().endpoint());
  ProcessResult pointer = RunStitch({"pointer", "--store", Store()});
  EXPECT_EQ(pointer.exit_code, 1);
  EXPECT_THAT(pointer.err, HasSubstr("EC2 instance metadata (role default-role)"));
}

}  // namespace
}  // namespace stitch::testing

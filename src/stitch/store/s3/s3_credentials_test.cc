// The credential chain's sources and refresh rules against files in a
// temporary directory and scripted loopback credential services (container
// endpoint, instance metadata), with a manual clock. The same sources
// against a real STS and instance metadata service (moto), signing real S3
// requests: tests/s3_credentials_test.cc. Each source on its own:
// s3_credential_sources_test.cc.
#include "stitch/store/s3/s3_credentials.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <atomic>
#include <fstream>
#include <thread>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "stitch/store/s3/s3_client.h"
#include "stitch/store/s3/s3_credential_chain.h"
#include "stitch/store/s3/s3_credential_sources.h"
#include "stitch/store/s3/s3_uri.h"
#include "tests/support/loopback_http.h"
#include "tests/support/temp_dir.h"

namespace stitch {
namespace {

using ::stitch::testing::LoopbackHttpServer;
using ::stitch::testing::TempDir;
using ::testing::HasSubstr;

void WriteFile(const std::filesystem::path& path, const std::string& text) {
  std::ofstream out(path, std::ios::trunc);
  out << text;
}

std::string Iso(absl::Time t) {
  return absl::FormatTime("%Y-%m-%dT%H:%M:%SZ", t, absl::UTCTimeZone());
}

// A manual clock shared with the provider.
struct Clock {
  absl::Time now = absl::FromUnixSeconds(1'800'000'000);
  AwsCredentialsOptions Options() {
    AwsCredentialsOptions o;
    o.now = [this] { return now; };
    o.http_timeout = absl::Seconds(5);
    o.metadata_timeout = absl::Seconds(5);
    return o;
  }
};

// A credential service handing out numbered keys that expire `lifetime`
// after the clock's now; `fail` makes it answer 500.
struct KeyService {
  explicit KeyService(Clock& clock) : clock(clock) {}
  LoopbackHttpServer::Reply Keys() {
    if (fail.load()) return {500, "{}"};
    int n = ++issued;
    return {200, absl::StrCat(R"({"AccessKeyId":"AKID)", n, R"(","SecretAccessKey":"secret)", n,
                              R"(","Token":"token)", n, R"(","Expiration":")",
                              Iso(clock.now + lifetime), R"("})")};
  }
  Clock& clock;
  absl::Duration lifetime = absl::Hours(1);
  std::atomic<int> issued{0};
  std::atomic<bool> fail{false};
};

AwsCredentials Keys(std::string id, std::string secret) {
  AwsCredentials k;
  k.access_key_id = std::move(id);
  k.secret_access_key = std::move(secret);
  return k;
}

std::shared_ptr<AwsCredentialsProvider> Chain(const AwsCredentials& keys,
                                              const AwsCredentialSettings& settings,
                                              AwsCredentialsOptions options = {}) {
  auto chain = MakeDefaultCredentialsChain(keys, settings, std::move(options));
  EXPECT_TRUE(chain.ok()) << chain.status();
  return chain.ok() ? *chain : nullptr;
}

TEST(AwsCredentialsTest, NothingConfiguredMeansUnsignedAndNamesEverySource) {
  auto chain = Chain({}, {});
  auto c = chain->Current();
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->has_value());
  EXPECT_EQ(chain->SourcesTried(),
            "environment variables, web identity (AWS_WEB_IDENTITY_TOKEN_FILE), profile "
            "\"default\", container credentials (AWS_CONTAINER_CREDENTIALS_*_URI), EC2 instance "
            "metadata ()");
}

TEST(AwsCredentialsTest, HalfSetEnvironmentKeysAreRefused) {
  auto chain = MakeDefaultCredentialsChain(Keys("AKID", ""), {});
  EXPECT_TRUE(absl::IsInvalidArgument(chain.status()));
  EXPECT_THAT(std::string(chain.status().message()), HasSubstr("AWS_SECRET_ACCESS_KEY"));
}

TEST(AwsCredentialsTest, EnvironmentComesFirst) {
  TempDir tmp;
  WriteFile(tmp / "credentials",
            "[default]\naws_access_key_id = FILE\naws_secret_access_key = f\n");
  AwsCredentialSettings s;
  s.shared_credentials_file = (tmp / "credentials").string();
  auto c = Chain(Keys("ENV", "e"), s)->Current();
  ASSERT_TRUE(c.ok() && c->has_value());
  EXPECT_EQ((*c)->access_key_id, "ENV");
  EXPECT_EQ((*c)->source, "environment variables (AWS_ACCESS_KEY_ID)");
  EXPECT_FALSE((*c)->expiration.has_value());
}

TEST(AwsCredentialsTest, ProfilesComeFromTheSharedFiles) {
  TempDir tmp;
  WriteFile(tmp / "credentials",
            "# a comment\n[default]\naws_access_key_id = DEFAULT\naws_secret_access_key = d\n"
            "\n[team]\naws_access_key_id=TEAM\naws_secret_access_key=t\naws_session_token=tt\n");
  WriteFile(tmp / "config",
            "[default]\nregion = eu-west-1\ns3 =\n  addressing_style = path\n"
            "[profile team]\nregion = ap-south-1\naws_access_key_id = IGNORED\n"
            "[profile cfg]\n; keys may live in the config file too\n"
            "aws_access_key_id = CFG\naws_secret_access_key = c\n"
            "[sso-session x]\nsso_region = us-east-1\n");
  AwsCredentialSettings s;
  s.shared_credentials_file = (tmp / "credentials").string();
  s.config_file = (tmp / "config").string();

  auto def = Chain({}, s)->Current();
  ASSERT_TRUE(def.ok() && def->has_value()) << def.status();
  EXPECT_EQ((*def)->access_key_id, "DEFAULT");
  EXPECT_THAT((*def)->source, HasSubstr("profile \"default\""));

  s.profile = "team";  // the credentials file wins over the config file
  auto team = Chain({}, s)->Current();
  ASSERT_TRUE(team.ok() && team->has_value()) << team.status();
  EXPECT_EQ((*team)->access_key_id, "TEAM");
  EXPECT_EQ((*team)->session_token, "tt");

  s.profile = "cfg";
  auto cfg = Chain({}, s)->Current();
  ASSERT_TRUE(cfg.ok() && cfg->has_value()) << cfg.status();
  EXPECT_EQ((*cfg)->access_key_id, "CFG");

  EXPECT_EQ(ConfigFileValue(s.config_file, "default", "region"), "eu-west-1");
  EXPECT_EQ(ConfigFileValue(s.config_file, "team", "region"), "ap-south-1");
  EXPECT_EQ(ConfigFileValue(s.config_file, "default", "addressing_style"), "");
}

TEST(AwsCredentialsTest, ANamedProfileThatDoesNotExistNamesTheSourcesTried) {
  TempDir tmp;
  WriteFile(tmp / "credentials", "[default]\naws_access_key_id = A\naws_secret_access_key = a\n");
  AwsCredentialSettings s;
  s.shared_credentials_file = (tmp / "credentials").string();
  s.profile = "nope";
  auto c = Chain({}, s)->Current();
  ASSERT_FALSE(c.ok());
  const std::string message(c.status().message());
  EXPECT_THAT(message, HasSubstr("profile \"nope\""));
  EXPECT_THAT(message, HasSubstr("AWS_PROFILE"));
  EXPECT_THAT(message, HasSubstr("sources tried: environment variables, web identity"));
  EXPECT_EQ(message.find('\n'), std::string::npos);
}

TEST(AwsCredentialsTest, WebIdentityNeedsBothVariablesAndAReadableToken) {
  AwsCredentialSettings s;
  s.role_arn = "arn:aws:iam::123456789012:role/r";
  auto half = Chain({}, s)->Current();
  EXPECT_TRUE(absl::IsInvalidArgument(half.status())) << half.status();
  EXPECT_THAT(std::string(half.status().message()), HasSubstr("AWS_WEB_IDENTITY_TOKEN_FILE"));

  s.web_identity_token_file = "/nonexistent/token";
  auto missing = Chain({}, s)->Current();
  ASSERT_FALSE(missing.ok());
  EXPECT_THAT(std::string(missing.status().message()), HasSubstr("/nonexistent/token"));
  EXPECT_THAT(std::string(missing.status().message()),
              HasSubstr("sources tried: environment variables, web identity"));
}

TEST(AwsCredentialsTest, ContainerCredentialsSendTheTokenFromItsFileEachTime) {
  Clock clock;
  KeyService keys(clock);
  absl::Mutex mu;
  std::vector<std::string> heads;
  LoopbackHttpServer::Options o;
  o.handler = [&](const LoopbackHttpServer::Request& r) {
    absl::MutexLock lock(&mu);
    heads.push_back(r.head);
    return keys.Keys();
  };
  LoopbackHttpServer service(o);
  TempDir tmp;
  WriteFile(tmp / "token", "first-token\n");
  AwsCredentialSettings s;
  s.container_relative_uri = "/v2/credentials/abc";
  s.container_host = service.url();
  s.container_authorization_token_file = (tmp / "token").string();
  s.container_authorization_token = "ignored-when-a-file-is-set";
  auto chain = Chain({}, s, clock.Options());
  auto c = chain->Current();
  ASSERT_TRUE(c.ok() && c->has_value()) << c.status();
  EXPECT_EQ((*c)->access_key_id, "AKID1");
  EXPECT_EQ((*c)->session_token, "token1");
  EXPECT_THAT((*c)->source, HasSubstr("/v2/credentials/abc"));

  // Rotated token, expired credentials: the next fetch sends the new token.
  WriteFile(tmp / "token", "second-token");
  clock.now += absl::Hours(1);
  auto again = chain->Current();
  ASSERT_TRUE(again.ok() && again->has_value()) << again.status();
  EXPECT_EQ((*again)->access_key_id, "AKID2");
  absl::MutexLock lock(&mu);
  ASSERT_EQ(heads.size(), 2u);
  EXPECT_THAT(heads[0], HasSubstr("GET /v2/credentials/abc HTTP/1.1"));
  EXPECT_THAT(heads[0], ::testing::EndsWith("\r\nAuthorization: first-token"));
  EXPECT_THAT(heads[1], ::testing::EndsWith("\r\nAuthorization: second-token"));
}

TEST(AwsCredentialsTest, ContainerFullUriMustNotSendTheTokenInTheClear) {
  AwsCredentialSettings s;
  s.container_full_uri = "http://203.0.113.9/creds";
  auto c = Chain({}, s)->Current();
  EXPECT_TRUE(absl::IsInvalidArgument(c.status())) << c.status();
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("must be https"));
}

// An IMDSv2 service: tokens from PUT /latest/api/token, required on every
// metadata GET.
struct Imds {
  explicit Imds(Clock& clock, int token_status = 200) : keys(clock), token_status(token_status) {
    LoopbackHttpServer::Options o;
    o.handler = [this](const LoopbackHttpServer::Request& r) { return Answer(r); };
    server = std::make_unique<LoopbackHttpServer>(o);
  }
  LoopbackHttpServer::Reply Answer(const LoopbackHttpServer::Request& r) {
    absl::MutexLock lock(&mu);
    lines.push_back(r.line);
    if (r.line == "PUT /latest/api/token") {
      if (token_status != 200) return {token_status, ""};
      if (!absl::StrContains(r.head, "X-aws-ec2-metadata-token-ttl-seconds: 21600")) {
        return {400, ""};
      }
      return {200, "session-token"};
    }
    const bool has_token = absl::StrContains(r.head, "X-aws-ec2-metadata-token: session-token");
    if (token_status == 200 && !has_token) return {401, ""};
    if (r.line == "GET /latest/meta-data/iam/security-credentials/") return {200, "the-role\n"};
    if (r.line == "GET /latest/meta-data/iam/security-credentials/the-role") {
      auto reply = keys.Keys();
      if (reply.status == 200) reply.body.insert(1, R"("Code":"Success",)");
      return reply;
    }
    if (r.line == "GET /latest/meta-data/placement/region") return {200, "eu-north-1"};
    return {404, ""};
  }
  KeyService keys;
  int token_status;
  absl::Mutex mu;
  std::vector<std::string> lines;
  std::unique_ptr<LoopbackHttpServer> server;
};

TEST(AwsCredentialsTest, InstanceMetadataUsesSessionTokens) {
  Clock clock;
  Imds imds(clock);
  AwsCredentialSettings s;
  s.ec2_metadata_endpoint = imds.server->url() + "/";
  auto c = Chain({}, s, clock.Options())->Current();
  ASSERT_TRUE(c.ok() && c->has_value()) << c.status();
  EXPECT_EQ((*c)->access_key_id, "AKID1");
  EXPECT_EQ((*c)->source, "EC2 instance metadata (role the-role)");
  EXPECT_EQ(InstanceMetadataRegion(imds.server->url()), "eu-north-1");
  absl::MutexLock lock(&imds.mu);
  EXPECT_EQ(imds.lines.front(), "PUT /latest/api/token");
}

TEST(AwsCredentialsTest, InstanceMetadataFallsBackToV1WhenTokensAreRefused) {
  Clock clock;
  Imds imds(clock, /*token_status=*/403);
  AwsCredentialSettings s;
  s.ec2_metadata_endpoint = imds.server->url();
  auto c = Chain({}, s, clock.Options())->Current();
  ASSERT_TRUE(c.ok() && c->has_value()) << c.status();
  EXPECT_EQ((*c)->access_key_id, "AKID1");
}

TEST(AwsCredentialsTest, NoInstanceMetadataServiceMeansUnsigned) {
  AwsCredentialSettings s;
  s.ec2_metadata_endpoint = testing::UnreachableUrl();
  auto c = Chain({}, s)->Current();
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->has_value());
  EXPECT_EQ(InstanceMetadataRegion(s.ec2_metadata_endpoint), "");
}

class RefreshTest : public ::testing::Test {
 protected:
  RefreshTest() : imds_(clock_) {
    settings_.ec2_metadata_endpoint = imds_.server->url();
    chain_ = Chain({}, settings_, clock_.Options());
  }
  std::string CurrentKey() {
    auto c = chain_->Current();
    EXPECT_TRUE(c.ok()) << c.status();
    return c.ok() && c->has_value() ? (*c)->access_key_id : "";
  }
  size_t Asked() {
    absl::MutexLock lock(&imds_.mu);
    return imds_.lines.size();
  }
  Clock clock_;
  Imds imds_;
  AwsCredentialSettings settings_;
  std::shared_ptr<AwsCredentialsProvider> chain_;
};

TEST_F(RefreshTest, TemporaryCredentialsAreReplacedAheadOfExpiry) {
  EXPECT_EQ(CurrentKey(), "AKID1");
  clock_.now += absl::Minutes(44);  // 16 minutes left: still handed out
  EXPECT_EQ(CurrentKey(), "AKID1");
  clock_.now += absl::Minutes(2);  // 14 minutes left: replaced
  EXPECT_EQ(CurrentKey(), "AKID2");
  EXPECT_EQ(imds_.keys.issued.load(), 2);
}

TEST_F(RefreshTest, ShortLivedCredentialsAreReplacedAtHalfTheirLife) {
  imds_.keys.lifetime = absl::Minutes(10);
  EXPECT_EQ(CurrentKey(), "AKID1");
  clock_.now += absl::Minutes(4);
  EXPECT_EQ(CurrentKey(), "AKID1");
  clock_.now += absl::Minutes(2);
  EXPECT_EQ(CurrentKey(), "AKID2");
}

TEST_F(RefreshTest, AFailedRefreshKeepsValidCredentialsThenFailsNamingTheSource) {
  EXPECT_EQ(CurrentKey(), "AKID1");
  imds_.keys.fail = true;
  clock_.now += absl::Minutes(50);  // due for a refresh, 10 minutes left
  EXPECT_EQ(CurrentKey(), "AKID1");
  const size_t asked = Asked();
  clock_.now += absl::Seconds(5);  // a retry waits a little
  EXPECT_EQ(CurrentKey(), "AKID1");
  EXPECT_EQ(Asked(), asked);
  clock_.now += absl::Minutes(10);  // expired, the service still failing
  auto c = chain_->Current();
  ASSERT_FALSE(c.ok());
  EXPECT_THAT(std::string(c.status().message()),
              HasSubstr("S3 credentials from EC2 instance metadata (role the-role) expired"));
  EXPECT_THAT(std::string(c.status().message()), HasSubstr("sources: environment variables"));
  imds_.keys.fail = false;
  EXPECT_EQ(CurrentKey(), "AKID2");
}

TEST_F(RefreshTest, InvalidateFetchesNewCredentials) {
  EXPECT_EQ(CurrentKey(), "AKID1");
  chain_->Invalidate();
  EXPECT_EQ(CurrentKey(), "AKID2");
  EXPECT_EQ(CurrentKey(), "AKID2");
}

TEST_F(RefreshTest, ManyThreadsShareOneRefresh) {
  EXPECT_EQ(CurrentKey(), "AKID1");
  clock_.now += absl::Minutes(50);
  std::vector<std::thread> threads;
  std::atomic<int> fresh{0};
  for (int i = 0; i < 8; ++i) {
    threads.emplace_back([&] {
      if (CurrentKey() == "AKID2") ++fresh;
    });
  }
  for (auto& t : threads) t.join();
  EXPECT_EQ(fresh.load(), 8);
  EXPECT_EQ(imds_.keys.issued.load(), 2);
}

}  // namespace
}  // namespace stitch

namespace stitch {
namespace {

// Temporary credentials that the service calls expired are replaced once,
// and the request is sent again with the new ones.
class CountingProvider final : public AwsCredentialsProvider {
 public:
  absl::StatusOr<std::optional<AwsCredentials>> Current() override {
    AwsCredentials c;
    c.access_key_id = absl::StrCat("ASIA", generation_.load());
    c.secret_access_key = "secret";
    c.session_token = "token";
    c.expiration = absl::Now() + absl::Hours(1);
    c.source = "a test";
    return c;
  }
  void Invalidate() override { ++generation_; }
  std::string SourcesTried() const override { return "a test"; }
  std::atomic<int> generation_{1};
};

TEST(S3ClientCredentialsTest, AnExpiredTokenAnswerIsRetriedOnceWithFreshCredentials) {
  absl::Mutex mu;
  std::vector<std::string> heads;
  LoopbackHttpServer::Options o;
  o.handler = [&](const LoopbackHttpServer::Request& r) -> LoopbackHttpServer::Reply {
    absl::MutexLock lock(&mu);
    heads.push_back(r.head);
    if (heads.size() <= 2) {
      return {400, "<Error><Code>ExpiredToken</Code><Message>expired</Message></Error>"};
    }
    return {200, "ok"};
  };
  LoopbackHttpServer server(o);
  auto loc = ParseS3Uri(absl::StrCat("s3://bucket/p?endpoint=", server.url()), S3Environment{});
  ASSERT_TRUE(loc.ok());
  auto provider = std::make_shared<CountingProvider>();
  S3ClientOptions options;
  options.credentials = provider;
  options.sleep = [](absl::Duration) {};
  auto client = S3Client::Create(*loc, S3Environment{}, options);
  ASSERT_TRUE(client.ok()) << client.status();
  S3Request r;
  r.key = "p/latest";
  auto first = (*client)->Send(r);
  ASSERT_TRUE(first.ok()) << first.status();
  // Refused twice in a row: the second refusal is the answer.
  EXPECT_EQ(first->status, 400);
  EXPECT_EQ(first->attempts, 2);
  EXPECT_EQ(provider->generation_.load(), 2);
  auto second = (*client)->Send(r);
  ASSERT_TRUE(second.ok());
  EXPECT_EQ(second->status, 200);
  absl::MutexLock lock(&mu);
  ASSERT_EQ(heads.size(), 3u);
  EXPECT_THAT(heads[0], HasSubstr("Credential=ASIA1/"));
  EXPECT_THAT(heads[1], HasSubstr("Credential=ASIA2/"));
  EXPECT_THAT(heads[1], HasSubstr("x-amz-security-token: token"));
}

}  // namespace
}  // namespace stitch

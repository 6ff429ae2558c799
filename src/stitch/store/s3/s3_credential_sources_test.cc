// Each credential source on its own (s3_credential_sources.h), against
// files in a temporary directory and scripted loopback services (STS, a
// container credentials endpoint, instance metadata); and the chain over
// scripted sources. The default chain as a whole: s3_credentials_test.cc.
#include "stitch/store/s3/s3_credential_sources.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <fstream>

#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "stitch/store/s3/s3_credential_chain.h"
#include "stitch/store/s3/s3_credential_io.h"
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

std::string Message(const absl::Status& s) { return std::string(s.message()); }

constexpr char kRole[] = "arn:aws:iam::123456789012:role/r";
constexpr char kRoleEncoded[] = "arn%3Aaws%3Aiam%3A%3A123456789012%3Arole%2Fr";

// A scripted STS: answers every action with credentials STS1, STS2, ... or,
// with `status` set, with that status and an Error document. Records each
// request.
class FakeSts {
 public:
  FakeSts() {
    LoopbackHttpServer::Options o;
    o.handler = [this](const LoopbackHttpServer::Request& r) { return Answer(r); };
    server_ = std::make_unique<LoopbackHttpServer>(o);
  }

  StsEndpoint Endpoint() const {
    StsEndpoint sts;
    sts.endpoint = server_->url();
    sts.region = "eu-west-1";
    sts.timeout = absl::Seconds(5);
    return sts;
  }

  void Refuse(int status, std::string code) {
    absl::MutexLock lock(&mu_);
    status_ = status;
    code_ = std::move(code);
  }

  std::vector<LoopbackHttpServer::Request> requests() const {
    absl::MutexLock lock(&mu_);
    return requests_;
  }

 private:
  LoopbackHttpServer::Reply Answer(const LoopbackHttpServer::Request& r) {
    absl::MutexLock lock(&mu_);
    requests_.push_back(r);
    if (status_ != 200) {
      return {status_, absl::StrCat("<ErrorResponse><Error><Code>", code_,
                                    "</Code><Message>no</Message></Error></ErrorResponse>")};
    }
    const std::string action = absl::StrContains(r.body, "Action=AssumeRoleWithWebIdentity&")
                                   ? "AssumeRoleWithWebIdentity"
                                   : "AssumeRole";
    return {200, absl::StrCat("<", action, "Response><", action,
                              "Result><Credentials><AccessKeyId>STS", requests_.size(),
                              "</AccessKeyId><SecretAccessKey>secret</SecretAccessKey>"
                              "<SessionToken>session</SessionToken>"
                              "<Expiration>2027-01-15T00:00:00Z</Expiration></Credentials></",
                              action, "Result></", action, "Response>")};
  }

  mutable absl::Mutex mu_;
  int status_ ABSL_GUARDED_BY(mu_) = 200;
  std::string code_ ABSL_GUARDED_BY(mu_);
  std::vector<LoopbackHttpServer::Request> requests_ ABSL_GUARDED_BY(mu_);
  std::unique_ptr<LoopbackHttpServer> server_;
};

// ---- Environment ----

TEST(EnvironmentCredentialSourceTest, IsOffWithoutAnAccessKeyId) {
  EnvironmentCredentialSource source({});
  auto c = source.Fetch();
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->has_value());
  EXPECT_EQ(source.Name(), "environment variables");
}

TEST(EnvironmentCredentialSourceTest, HandsOutTheKeysAsGiven) {
  AwsCredentials keys;
  keys.access_key_id = "AKID";
  keys.secret_access_key = "secret";
  keys.session_token = "token";
  EnvironmentCredentialSource source(keys);
  auto c = source.Fetch();
  ASSERT_TRUE(c.ok() && c->has_value()) << c.status();
  EXPECT_EQ((*c)->access_key_id, "AKID");
  EXPECT_EQ((*c)->secret_access_key, "secret");
  EXPECT_EQ((*c)->session_token, "token");
  EXPECT_FALSE((*c)->expiration.has_value());
  EXPECT_EQ((*c)->source, "environment variables (AWS_ACCESS_KEY_ID)");
}

// ---- Web identity ----

TEST(WebIdentityCredentialSourceTest, IsOffWithoutItsVariables) {
  WebIdentityCredentialSource source({}, StsEndpoint{});
  auto c = source.Fetch();
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->has_value());
}

TEST(WebIdentityCredentialSourceTest, ExchangesTheTokenFileWithStsUnsigned) {
  FakeSts sts;
  TempDir tmp;
  WriteFile(tmp / "token", "the-token\n");
  AwsCredentialSettings s;
  s.web_identity_token_file = (tmp / "token").string();
  s.role_arn = kRole;
  s.role_session_name = "my-session";
  WebIdentityCredentialSource source(s, sts.Endpoint());
  auto c = source.Fetch();
  ASSERT_TRUE(c.ok() && c->has_value()) << c.status();
  EXPECT_EQ((*c)->access_key_id, "STS1");
  EXPECT_EQ((*c)->session_token, "session");
  ASSERT_TRUE((*c)->expiration.has_value());
  EXPECT_EQ(absl::FormatTime(absl::RFC3339_sec, *(*c)->expiration, absl::UTCTimeZone()),
            "2027-01-15T00:00:00+00:00");
  EXPECT_EQ((*c)->source, absl::StrCat("web identity (role ", kRole, ")"));
  auto requests = sts.requests();
  ASSERT_EQ(requests.size(), 1u);
  EXPECT_EQ(requests[0].line, "POST /");
  EXPECT_EQ(requests[0].authorization, "");
  EXPECT_EQ(requests[0].body,
            absl::StrCat("Action=AssumeRoleWithWebIdentity&Version=2011-06-15&RoleArn=",
                         kRoleEncoded, "&RoleSessionName=my-session&WebIdentityToken=the-token"));
}

TEST(WebIdentityCredentialSourceTest, ReadsTheTokenFileAgainAtEveryFetch) {
  FakeSts sts;
  TempDir tmp;
  WriteFile(tmp / "token", "first");
  AwsCredentialSettings s;
  s.web_identity_token_file = (tmp / "token").string();
  s.role_arn = kRole;
  WebIdentityCredentialSource source(s, sts.Endpoint());
  ASSERT_TRUE(source.Fetch().ok());
  WriteFile(tmp / "token", "second");
  auto c = source.Fetch();
  ASSERT_TRUE(c.ok() && c->has_value()) << c.status();
  EXPECT_EQ((*c)->access_key_id, "STS2");
  auto requests = sts.requests();
  ASSERT_EQ(requests.size(), 2u);
  EXPECT_THAT(requests[0].body, ::testing::EndsWith("WebIdentityToken=first"));
  EXPECT_THAT(requests[1].body, ::testing::EndsWith("WebIdentityToken=second"));
  EXPECT_THAT(requests[1].body, HasSubstr("RoleSessionName=stitch-"));
}

TEST(WebIdentityCredentialSourceTest, AnEmptyTokenFileIsAnError) {
  TempDir tmp;
  WriteFile(tmp / "token", " \n");
  AwsCredentialSettings s;
  s.web_identity_token_file = (tmp / "token").string();
  s.role_arn = kRole;
  WebIdentityCredentialSource source(s, StsEndpoint{});
  auto c = source.Fetch();
  EXPECT_TRUE(absl::IsFailedPrecondition(c.status())) << c.status();
  EXPECT_THAT(Message(c.status()), HasSubstr("is empty"));
}

TEST(WebIdentityCredentialSourceTest, StsRefusalsKeepTheirKind) {
  FakeSts sts;
  TempDir tmp;
  WriteFile(tmp / "token", "t");
  AwsCredentialSettings s;
  s.web_identity_token_file = (tmp / "token").string();
  s.role_arn = kRole;
  WebIdentityCredentialSource source(s, sts.Endpoint());

  sts.Refuse(403, "AccessDenied");
  auto denied = source.Fetch();
  EXPECT_TRUE(absl::IsPermissionDenied(denied.status())) << denied.status();
  EXPECT_THAT(Message(denied.status()), HasSubstr("answered HTTP 403 AccessDenied (no)"));
  EXPECT_THAT(Message(denied.status()), HasSubstr("token file"));

  sts.Refuse(503, "ServiceUnavailable");
  EXPECT_TRUE(absl::IsUnavailable(source.Fetch().status()));
  sts.Refuse(429, "Throttling");
  EXPECT_TRUE(absl::IsUnavailable(source.Fetch().status()));
}

// ---- Profiles ----

TEST(ProfileCredentialSourceTest, IsOffWithoutFilesOrADefaultProfile) {
  EXPECT_FALSE(ProfileCredentialSource({}, StsEndpoint{}).Fetch()->has_value());
  TempDir tmp;
  WriteFile(tmp / "credentials", "[other]\naws_access_key_id = A\naws_secret_access_key = a\n");
  AwsCredentialSettings s;
  s.shared_credentials_file = (tmp / "credentials").string();
  s.config_file = (tmp / "absent").string();
  ProfileCredentialSource source(s, StsEndpoint{});
  auto c = source.Fetch();
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->has_value());
  EXPECT_EQ(source.Name(), absl::StrCat("profile \"default\" in ", s.shared_credentials_file,
                                        " and ", s.config_file));
}

TEST(ProfileCredentialSourceTest, AssumesARoleWithTheSourceProfilesKeys) {
  FakeSts sts;
  TempDir tmp;
  WriteFile(tmp / "credentials", "[base]\naws_access_key_id = BASE\naws_secret_access_key = b\n");
  WriteFile(tmp / "config",
            absl::StrCat("[profile dev]\nrole_arn = ", kRole,
                         "\nsource_profile = base\nrole_session_name = dev-session\n"));
  AwsCredentialSettings s;
  s.shared_credentials_file = (tmp / "credentials").string();
  s.config_file = (tmp / "config").string();
  s.profile = "dev";
  ProfileCredentialSource source(s, sts.Endpoint());
  auto c = source.Fetch();
  ASSERT_TRUE(c.ok() && c->has_value()) << c.status();
  EXPECT_EQ((*c)->access_key_id, "STS1");
  EXPECT_THAT((*c)->source,
              HasSubstr(absl::StrCat(": role ", kRole, " assumed with profile \"base\"")));
  auto requests = sts.requests();
  ASSERT_EQ(requests.size(), 1u);
  EXPECT_EQ(requests[0].body, absl::StrCat("Action=AssumeRole&Version=2011-06-15&RoleArn=",
                                           kRoleEncoded, "&RoleSessionName=dev-session"));
  EXPECT_THAT(requests[0].authorization, HasSubstr("AWS4-HMAC-SHA256 Credential=BASE/"));
  EXPECT_THAT(requests[0].authorization, HasSubstr("/eu-west-1/sts/aws4_request"));
}

TEST(ProfileCredentialSourceTest, AWebIdentityProfileUsesItsTokenFile) {
  FakeSts sts;
  TempDir tmp;
  WriteFile(tmp / "token", "profile-token");
  WriteFile(tmp / "config",
            absl::StrCat("[default]\nrole_arn = ", kRole,
                         "\nweb_identity_token_file = ", (tmp / "token").string(), "\n"));
  AwsCredentialSettings s;
  s.config_file = (tmp / "config").string();
  auto c = ProfileCredentialSource(s, sts.Endpoint()).Fetch();
  ASSERT_TRUE(c.ok() && c->has_value()) << c.status();
  EXPECT_THAT((*c)->source, HasSubstr(absl::StrCat("web identity for role ", kRole)));
  auto requests = sts.requests();
  ASSERT_EQ(requests.size(), 1u);
  EXPECT_THAT(requests[0].body, ::testing::EndsWith("WebIdentityToken=profile-token"));
}

TEST(ProfileCredentialSourceTest, RefusesWhatItCannotUse) {
  TempDir tmp;
  WriteFile(tmp / "credentials",
            "[process]\ncredential_process = /bin/creds\n"
            "[half]\naws_access_key_id = A\n"
            "[roleonly]\nrole_arn = arn:aws:iam::1:role/x\n"
            "[loop]\nrole_arn = arn:aws:iam::1:role/x\nsource_profile = loop\n"
            "[empty]\nregion = us-east-1\n");
  AwsCredentialSettings s;
  s.shared_credentials_file = (tmp / "credentials").string();
  auto fetch = [&](const char* profile) {
    s.profile = profile;
    return ProfileCredentialSource(s, StsEndpoint{}).Fetch();
  };
  auto process = fetch("process");
  EXPECT_TRUE(absl::IsInvalidArgument(process.status())) << process.status();
  EXPECT_THAT(Message(process.status()), HasSubstr("credential_process is not supported"));
  auto half = fetch("half");
  EXPECT_TRUE(absl::IsInvalidArgument(half.status())) << half.status();
  EXPECT_THAT(Message(half.status()), HasSubstr("only one of aws_access_key_id"));
  auto role_only = fetch("roleonly");
  EXPECT_TRUE(absl::IsInvalidArgument(role_only.status())) << role_only.status();
  EXPECT_THAT(Message(role_only.status()), HasSubstr("needs web_identity_token_file"));
  auto loop = fetch("loop");
  EXPECT_TRUE(absl::IsInvalidArgument(loop.status())) << loop.status();
  EXPECT_THAT(Message(loop.status()), HasSubstr("source_profile chains"));
  auto empty = fetch("empty");
  EXPECT_TRUE(absl::IsNotFound(empty.status())) << empty.status();
  EXPECT_THAT(Message(empty.status()), HasSubstr("has no credentials"));
  auto missing = fetch("missing");
  EXPECT_TRUE(absl::IsNotFound(missing.status())) << missing.status();
  EXPECT_THAT(Message(missing.status()),
              HasSubstr(absl::StrCat("is in neither ", s.shared_credentials_file)));
}

// ---- Container credentials ----

// A container credentials endpoint answering `reply` to every request.
struct ContainerEndpoint {
  explicit ContainerEndpoint(LoopbackHttpServer::Reply reply) {
    LoopbackHttpServer::Options o;
    o.handler = [this, reply](const LoopbackHttpServer::Request& r) {
      absl::MutexLock lock(&mu);
      heads.push_back(r.head);
      return reply;
    };
    server = std::make_unique<LoopbackHttpServer>(o);
  }
  absl::Mutex mu;
  std::vector<std::string> heads ABSL_GUARDED_BY(mu);
  std::unique_ptr<LoopbackHttpServer> server;
};

constexpr char kKeysJson[] =
    R"({"AccessKeyId":"CKEY","SecretAccessKey":"c","Token":"ct","Expiration":"2027-01-15T00:00:00Z"})";

TEST(ContainerCredentialSourceTest, IsOffWithoutAUri) {
  auto c = ContainerCredentialSource({}, absl::Seconds(5)).Fetch();
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->has_value());
}

TEST(ContainerCredentialSourceTest, AsksALoopbackFullUriWithTheToken) {
  ContainerEndpoint endpoint({200, kKeysJson});
  AwsCredentialSettings s;
  s.container_full_uri = endpoint.server->url() + "/creds";
  s.container_authorization_token = "the-token";
  auto c = ContainerCredentialSource(s, absl::Seconds(5)).Fetch();
  ASSERT_TRUE(c.ok() && c->has_value()) << c.status();
  EXPECT_EQ((*c)->access_key_id, "CKEY");
  EXPECT_EQ((*c)->session_token, "ct");
  EXPECT_EQ((*c)->source, absl::StrCat("container credentials (", s.container_full_uri, ")"));
  absl::MutexLock lock(&endpoint.mu);
  ASSERT_EQ(endpoint.heads.size(), 1u);
  EXPECT_THAT(endpoint.heads[0], HasSubstr("GET /creds HTTP/1.1"));
  EXPECT_THAT(endpoint.heads[0], HasSubstr("\r\nAuthorization: the-token"));
}

TEST(ContainerCredentialSourceTest, ARefusalOrABadAnswerIsAnError) {
  ContainerEndpoint refusing({403, "not yours"});
  AwsCredentialSettings s;
  s.container_relative_uri = "v2/creds";
  s.container_host = refusing.server->url();
  auto refused = ContainerCredentialSource(s, absl::Seconds(5)).Fetch();
  EXPECT_TRUE(absl::IsPermissionDenied(refused.status())) << refused.status();
  EXPECT_THAT(Message(refused.status()),
              HasSubstr(absl::StrCat(s.container_host, "/v2/creds answered HTTP 403: not yours")));

  ContainerEndpoint garbled({200, R"({"AccessKeyId":"only"})"});
  s.container_host = garbled.server->url();
  auto bad = ContainerCredentialSource(s, absl::Seconds(5)).Fetch();
  EXPECT_TRUE(absl::IsInvalidArgument(bad.status())) << bad.status();
  EXPECT_THAT(Message(bad.status()), HasSubstr("no AccessKeyId and SecretAccessKey"));

  s.container_host = testing::UnreachableUrl();
  EXPECT_TRUE(absl::IsUnavailable(ContainerCredentialSource(s, absl::Seconds(5)).Fetch().status()));
}

TEST(ContainerCredentialSourceTest, ATokenWithALineBreakIsNeverSent) {
  ContainerEndpoint endpoint({200, kKeysJson});
  AwsCredentialSettings s;
  s.container_full_uri = endpoint.server->url();
  s.container_authorization_token = "a\r\nX-Injected: yes";
  auto c = ContainerCredentialSource(s, absl::Seconds(5)).Fetch();
  EXPECT_TRUE(absl::IsInvalidArgument(c.status())) << c.status();
  absl::MutexLock lock(&endpoint.mu);
  EXPECT_TRUE(endpoint.heads.empty());
}

// ---- Instance metadata ----

// An instance metadata service answering `token_status` for session tokens
// and `roles` for the role list, and credentials for "the-role".
struct MetadataService {
  MetadataService(int token_status, LoopbackHttpServer::Reply roles,
                  LoopbackHttpServer::Reply creds = {200, kKeysJson}) {
    LoopbackHttpServer::Options o;
    o.handler = [=](const LoopbackHttpServer::Request& r) -> LoopbackHttpServer::Reply {
      if (r.line == "PUT /latest/api/token") return {token_status, "tok"};
      if (r.line == "GET /latest/meta-data/iam/security-credentials/") return roles;
      if (r.line == "GET /latest/meta-data/iam/security-credentials/the-role") return creds;
      return {404, ""};
    };
    server = std::make_unique<LoopbackHttpServer>(o);
  }
  std::unique_ptr<LoopbackHttpServer> server;
};

TEST(InstanceMetadataCredentialSourceTest, IsOffWithoutAnEndpointOrAnAnswer) {
  EXPECT_FALSE(InstanceMetadataCredentialSource("", absl::Seconds(1)).Fetch()->has_value());
  auto unreachable =
      InstanceMetadataCredentialSource(testing::UnreachableUrl(), absl::Seconds(1)).Fetch();
  ASSERT_TRUE(unreachable.ok()) << unreachable.status();
  EXPECT_FALSE(unreachable->has_value());
}

TEST(InstanceMetadataCredentialSourceTest, AnInstanceWithoutARoleHasNoCredentials) {
  MetadataService imds(200, {404, ""});
  auto c = InstanceMetadataCredentialSource(imds.server->url(), absl::Seconds(5)).Fetch();
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_FALSE(c->has_value());
}

TEST(InstanceMetadataCredentialSourceTest, HandsOutTheFirstRolesCredentials) {
  MetadataService imds(200, {200, "the-role\nsecond-role\n"});
  InstanceMetadataCredentialSource source(imds.server->url() + "/", absl::Seconds(5));
  EXPECT_EQ(source.Name(), absl::StrCat("EC2 instance metadata (", imds.server->url(), ")"));
  auto c = source.Fetch();
  ASSERT_TRUE(c.ok() && c->has_value()) << c.status();
  EXPECT_EQ((*c)->access_key_id, "CKEY");
  EXPECT_EQ((*c)->source, "EC2 instance metadata (role the-role)");
}

TEST(InstanceMetadataCredentialSourceTest, UnexpectedAnswersAreErrors) {
  MetadataService token_refused(500, {200, "the-role"});
  auto c = InstanceMetadataCredentialSource(token_refused.server->url(), absl::Seconds(5)).Fetch();
  EXPECT_TRUE(absl::IsUnavailable(c.status())) << c.status();
  EXPECT_THAT(Message(c.status()), HasSubstr("refused a session token: HTTP 500"));

  MetadataService failing(200, {200, "the-role"},
                          {200, R"({"Code":"AssumeRoleUnauthorizedAccess","Message":"no"})"});
  auto denied = InstanceMetadataCredentialSource(failing.server->url(), absl::Seconds(5)).Fetch();
  EXPECT_TRUE(absl::IsPermissionDenied(denied.status())) << denied.status();
  EXPECT_THAT(Message(denied.status()), HasSubstr("instance metadata role the-role"));
}

// ---- The chain over any sources ----

// A source that answers what it is told and counts its fetches.
class ScriptedSource final : public AwsCredentialSource {
 public:
  ScriptedSource(std::string name, absl::StatusOr<std::optional<AwsCredentials>> answer,
                 int* fetches)
      : name_(std::move(name)), answer_(std::move(answer)), fetches_(fetches) {}
  std::string Name() const override { return name_; }
  absl::StatusOr<std::optional<AwsCredentials>> Fetch() override {
    ++*fetches_;
    return answer_;
  }

 private:
  const std::string name_;
  const absl::StatusOr<std::optional<AwsCredentials>> answer_;
  int* const fetches_;
};

AwsCredentials Keys(std::string id) {
  AwsCredentials k;
  k.access_key_id = std::move(id);
  k.secret_access_key = "s";
  k.source = "scripted";
  return k;
}

TEST(CredentialsChainTest, TheFirstConfiguredSourceDecides) {
  int fetches[3] = {0, 0, 0};
  std::vector<std::unique_ptr<AwsCredentialSource>> sources;
  sources.push_back(std::make_unique<ScriptedSource>("a", std::nullopt, &fetches[0]));
  sources.push_back(std::make_unique<ScriptedSource>("b", Keys("B"), &fetches[1]));
  sources.push_back(std::make_unique<ScriptedSource>("c", Keys("C"), &fetches[2]));
  auto chain = MakeCredentialsChain(std::move(sources), {});
  EXPECT_EQ(chain->SourcesTried(), "a, b, c");
  for (int i = 0; i < 2; ++i) {
    auto c = chain->Current();
    ASSERT_TRUE(c.ok() && c->has_value()) << c.status();
    EXPECT_EQ((*c)->access_key_id, "B");
  }
  // Long-term keys are cached: each source was asked once at most.
  EXPECT_EQ(fetches[0], 1);
  EXPECT_EQ(fetches[1], 1);
  EXPECT_EQ(fetches[2], 0);
}

TEST(CredentialsChainTest, AFailingSourceStopsTheWalkAndNamesTheSourcesTried) {
  int fetches[2] = {0, 0};
  std::vector<std::unique_ptr<AwsCredentialSource>> sources;
  sources.push_back(
      std::make_unique<ScriptedSource>("a", absl::PermissionDeniedError("a refused"), &fetches[0]));
  sources.push_back(std::make_unique<ScriptedSource>("b", Keys("B"), &fetches[1]));
  auto c = MakeCredentialsChain(std::move(sources), {})->Current();
  EXPECT_TRUE(absl::IsPermissionDenied(c.status())) << c.status();
  EXPECT_EQ(Message(c.status()), "S3 credentials: a refused (sources tried: a)");
  EXPECT_EQ(fetches[1], 0);
}

// ---- Shared pieces ----

TEST(CredentialIoTest, CredentialDocumentsAreChecked) {
  auto c = CredentialsFromJson(kKeysJson);
  ASSERT_TRUE(c.ok()) << c.status();
  EXPECT_EQ(c->access_key_id, "CKEY");
  EXPECT_TRUE(absl::IsInvalidArgument(CredentialsFromJson("[]").status()));
  EXPECT_TRUE(absl::IsInvalidArgument(
      CredentialsFromJson(R"({"AccessKeyId":"a","SecretAccessKey":"b","Expiration":"soon"})")
          .status()));
  EXPECT_TRUE(absl::IsPermissionDenied(CredentialsFromJson(R"({"Code":"Failure"})").status()));
}

TEST(CredentialIoTest, StsEndpointDefaultsToAwsInTheRegion) {
  AwsCredentialSettings s;
  AwsCredentialsOptions o;
  o.http_timeout = absl::Seconds(3);
  StsEndpoint aws = StsEndpoint::From(s, o);
  EXPECT_EQ(aws.endpoint, "https://sts.us-east-1.amazonaws.com");
  EXPECT_EQ(aws.region, "us-east-1");
  EXPECT_EQ(aws.timeout, absl::Seconds(3));
  s.region = "eu-west-1";
  s.sts_endpoint_url = "http://127.0.0.1:5000//";
  StsEndpoint local = StsEndpoint::From(s, o);
  EXPECT_EQ(local.endpoint, "http://127.0.0.1:5000");
  EXPECT_EQ(local.region, "eu-west-1");
}

}  // namespace
}  // namespace stitch

// S3Client against a scripted loopback server: request shape (signing
// inputs, encoded and sorted queries), retries and their limits, and the
// one-line errors.
#include "stitch/store/s3/s3_client.h"

#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/synchronization/mutex.h"
#include "stitch/core/errors.h"
#include "stitch/io/sha256.h"
#include "tests/support/loopback_http.h"
#include "tests/support/loopback_listener.h"

namespace stitch {
namespace {

// Answers each connection with the next scripted response (raw HTTP text;
// an empty one closes the connection without answering), recording each
// request's head and body. Runs out of script: 500.
class ScriptedServer {
 public:
  explicit ScriptedServer(std::vector<std::string> script)
      : script_(std::move(script)), listener_([this](int conn) { Serve(conn); }) {}
  std::string url() const { return listener_.url(); }
  std::vector<std::string> heads() {
    absl::MutexLock lock(&mu_);
    return heads_;
  }
  std::vector<std::string> bodies() {
    absl::MutexLock lock(&mu_);
    return bodies_;
  }

 private:
  void Serve(int conn) {
    std::string data;
    size_t end = std::string::npos;
    size_t length = 0;
    char buf[65536];
    while (end == std::string::npos || data.size() < end + 4 + length) {
      if (!listener_.Readable(conn)) break;
      ssize_t n = ::read(conn, buf, sizeof buf);
      if (n <= 0) break;
      data.append(buf, static_cast<size_t>(n));
      if (end == std::string::npos && (end = data.find("\r\n\r\n")) != std::string::npos) {
        std::string lower = absl::AsciiStrToLower(data.substr(0, end));
        size_t at = lower.find("\r\ncontent-length:");
        if (at != std::string::npos) {
          (void)absl::SimpleAtoi(absl::StripAsciiWhitespace(
                                     lower.substr(at + 17, lower.find("\r\n", at + 2) - at - 17)),
                                 &length);
        }
      }
    }
    size_t next = 0;
    {
      absl::MutexLock lock(&mu_);
      next = heads_.size();
      heads_.push_back(end == std::string::npos ? data : data.substr(0, end));
      bodies_.push_back(end == std::string::npos ? "" : data.substr(end + 4));
    }
    std::string reply = next < script_.size() ? script_[next] : Reply(500, "");
    for (std::string_view rest = reply; !rest.empty();) {
      ssize_t n = ::write(conn, rest.data(), rest.size());
      if (n <= 0) break;
      rest.remove_prefix(static_cast<size_t>(n));
    }
  }

 public:
  static std::string Reply(int status, const std::string& body, const std::string& headers = "") {
    return absl::StrCat("HTTP/1.1 ", status, " X\r\nContent-Length: ", body.size(), "\r\n", headers,
                        "Connection: close\r\n\r\n", body);
  }
  static std::string Error(int status, const std::string& code) {
    return Reply(status,
                 absl::StrCat("<Error><Code>", code, "</Code><Message>m</Message></Error>"));
  }

 private:
  std::vector<std::string> script_;
  absl::Mutex mu_;
  std::vector<std::string> heads_ ABSL_GUARDED_BY(mu_);
  std::vector<std::string> bodies_ ABSL_GUARDED_BY(mu_);
  testing::LoopbackListener listener_;  // last: it serves as soon as it is made
};

struct Fixture {
  std::vector<absl::Duration> sleeps;
  std::unique_ptr<S3Client> client;
};

Fixture MakeClient(const std::string& endpoint, int attempts = 3, std::string token = "") {
  Fixture f;
  S3Environment env;
  env.access_key_id = "AKIDEXAMPLE";
  env.secret_access_key = "secret";
  env.session_token = std::move(token);
  auto loc = ParseS3Uri(absl::StrCat("s3://bucket/p?endpoint=", endpoint), env);
  EXPECT_TRUE(loc.ok()) << loc.status().message();
  S3ClientOptions options;
  options.max_attempts = attempts;
  options.initial_backoff = absl::Milliseconds(10);
  options.max_backoff = absl::Milliseconds(40);
  auto* sleeps = &f.sleeps;
  options.sleep = [sleeps](absl::Duration d) { sleeps->push_back(d); };
  auto client = S3Client::Create(*loc, env, options);
  EXPECT_TRUE(client.ok());
  f.client = *std::move(client);
  return f;
}

TEST(S3ClientTest, SignsWithThePayloadHashAndSendsSortedEncodedQueries) {
  ScriptedServer server({ScriptedServer::Reply(200, "listing"), ScriptedServer::Reply(200, "")});
  Fixture f = MakeClient(server.url(), 3, "token/with+chars=");
  S3Request list;
  list.key = "p/a b";
  list.query = {{"prefix", "p/x y"}, {"list-type", "2"}};
  auto r = f.client->Send(list);
  ASSERT_TRUE(r.ok()) << r.status().message();
  EXPECT_EQ(r->body, "listing");
  S3Request put;
  put.method = "PUT";
  put.key = "p/obj";
  put.body = std::string(100000, 'z');
  put.headers = {{"If-None-Match", "*"}};
  ASSERT_TRUE(f.client->Send(put).ok());

  auto heads = server.heads();
  ASSERT_EQ(heads.size(), 2u);
  std::string get = absl::AsciiStrToLower(heads[0]);
  EXPECT_TRUE(
      absl::StartsWith(heads[0], "GET /bucket/p/a%20b?list-type=2&prefix=p%2Fx%20y HTTP/1.1"))
      << heads[0];
  EXPECT_TRUE(
      absl::StrContains(get, absl::StrCat("x-amz-content-sha256: ", AbslView(kEmptySha256))))
      << get;
  EXPECT_TRUE(absl::StrContains(get, "authorization: aws4-hmac-sha256 credential=akidexample/"))
      << get;
  EXPECT_TRUE(absl::StrContains(get, "/us-east-1/s3/aws4_request")) << get;
  EXPECT_TRUE(absl::StrContains(get, "x-amz-date:")) << get;
  EXPECT_TRUE(absl::StrContains(heads[0], "x-amz-security-token: token/with+chars=")) << heads[0];

  std::string put_head = absl::AsciiStrToLower(heads[1]);
  EXPECT_TRUE(absl::StartsWith(heads[1], "PUT /bucket/p/obj HTTP/1.1")) << heads[1];
  EXPECT_TRUE(
      absl::StrContains(put_head, absl::StrCat("x-amz-content-sha256: ", Sha256Hex(put.body))));
  EXPECT_TRUE(absl::StrContains(put_head, "if-none-match: *"));
  EXPECT_EQ(server.bodies()[1], put.body);
}

TEST(S3ClientTest, RetriesServerErrorsAndThrottlingWithBoundedBackoff) {
  ScriptedServer server({ScriptedServer::Error(503, "SlowDown"), ScriptedServer::Error(429, "x"),
                         ScriptedServer::Error(500, "InternalError"),
                         ScriptedServer::Reply(200, "done")});
  Fixture f = MakeClient(server.url(), 4);
  S3Request r;
  r.key = "p/k";
  auto response = f.client->Send(r);
  ASSERT_TRUE(response.ok());
  EXPECT_EQ(response->status, 200);
  EXPECT_EQ(response->body, "done");
  EXPECT_EQ(response->attempts, 4);
  EXPECT_EQ(f.client->attempts_sent(), 4);
  ASSERT_EQ(f.sleeps.size(), 3u);
  const absl::Duration caps[] = {absl::Milliseconds(10), absl::Milliseconds(20),
                                 absl::Milliseconds(40)};
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_GE(f.sleeps[i], absl::ZeroDuration());
    EXPECT_LE(f.sleeps[i], caps[i]);
  }
}

TEST(S3ClientTest, GivesUpAfterMaxAttemptsWithAClearError) {
  ScriptedServer server({ScriptedServer::Error(503, "SlowDown"),
                         ScriptedServer::Error(503, "SlowDown"),
                         ScriptedServer::Error(503, "SlowDown")});
  Fixture f = MakeClient(server.url(), 2);
  S3Request r;
  r.key = "p/k";
  auto response = f.client->Send(r);
  ASSERT_TRUE(response.ok());
  EXPECT_EQ(response->status, 503);
  EXPECT_EQ(response->attempts, 2);
  absl::Status e = f.client->ErrorFor(*response, "read", "p/k");
  EXPECT_TRUE(absl::IsUnavailable(e)) << e.message();
  EXPECT_TRUE(absl::StrContains(e.message(), "s3://bucket/p/k")) << e.message();
  EXPECT_TRUE(absl::StrContains(e.message(), "after 2 attempts")) << e.message();
  EXPECT_EQ(server.heads().size(), 2u);
}

TEST(S3ClientTest, ClientErrorsAreNotRetried) {
  ScriptedServer server({ScriptedServer::Error(403, "SignatureDoesNotMatch"),
                         ScriptedServer::Error(404, "NoSuchBucket"),
                         ScriptedServer::Error(404, "NoSuchKey"),
                         ScriptedServer::Error(412, "PreconditionFailed"),
                         ScriptedServer::Reply(301, "", "x-amz-bucket-region: eu-west-3\r\n")});
  Fixture f = MakeClient(server.url(), 5);
  std::vector<absl::Status> errors;
  for (int i = 0; i < 5; ++i) {
    S3Request r;
    r.key = "p/k";
    auto response = f.client->Send(r);
    ASSERT_TRUE(response.ok());
    EXPECT_EQ(response->attempts, 1);
    errors.push_back(f.client->ErrorFor(*response, "read", "p/k"));
  }
  EXPECT_TRUE(f.sleeps.empty());
  EXPECT_TRUE(absl::IsPermissionDenied(errors[0]));
  EXPECT_TRUE(absl::StrContains(errors[0].message(), "AWS_SECRET_ACCESS_KEY")) << errors[0];
  EXPECT_TRUE(absl::IsNotFound(errors[1]));
  EXPECT_TRUE(absl::StrContains(errors[1].message(), "bucket \"bucket\" does not exist"));
  EXPECT_TRUE(absl::IsNotFound(errors[2]));
  EXPECT_TRUE(absl::IsFailedPrecondition(errors[3]));
  EXPECT_TRUE(absl::IsFailedPrecondition(errors[4]));
  EXPECT_TRUE(absl::StrContains(errors[4].message(), "eu-west-3")) << errors[4];
}

TEST(S3ClientTest, DroppedConnectionsAreRetriedAndDownloadsStartOver) {
  // The first answer promises 10 bytes and delivers 3, then the connection
  // drops; the second is whole.
  std::string partial = "HTTP/1.1 200 X\r\nContent-Length: 10\r\nConnection: close\r\n\r\nabc";
  ScriptedServer server({"", partial, ScriptedServer::Reply(200, "0123456789")});
  Fixture f = MakeClient(server.url(), 3);
  struct Sink : ByteSink {
    std::string data;
    int restarts = 0;
    absl::Status Restart() override {
      ++restarts;
      data.clear();
      return absl::OkStatus();
    }
    absl::Status Write(std::string_view bytes) override {
      data.append(bytes);
      return absl::OkStatus();
    }
  } sink;
  S3Request r;
  r.key = "p/k";
  r.sink = &sink;
  auto response = f.client->Send(r);
  ASSERT_TRUE(response.ok()) << response.status().message();
  EXPECT_EQ(response->attempts, 3);
  EXPECT_EQ(sink.restarts, 3);
  EXPECT_EQ(sink.data, "0123456789");
  EXPECT_TRUE(response->body.empty());
}

// A request's limit on the body it buffers holds before any of the body is
// held when the answer declares its length, and as the body arrives when it
// does not; neither is retried.
TEST(S3ClientTest, ABufferedBodyOverTheRequestsLimitIsRefused) {
  ScriptedServer server(
      {"HTTP/1.1 200 X\r\nContent-Length: 1073741824\r\nConnection: close\r\n\r\nabc",
       absl::StrCat("HTTP/1.1 200 X\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n",
                    "7d0\r\n", std::string(2000, 'c'), "\r\n0\r\n\r\n"),
       ScriptedServer::Reply(200, std::string(900, 'f'))});
  Fixture f = MakeClient(server.url(), 3);
  S3Request r;
  r.key = "p/k";
  r.max_buffered_body = 1000;
  auto declared = f.client->Send(r);
  EXPECT_TRUE(absl::IsOutOfRange(declared.status())) << declared.status();
  EXPECT_EQ(declared.status().message(), "it is 1073741824 bytes, above the limit of 1000 bytes");
  auto chunked = f.client->Send(r);
  EXPECT_TRUE(absl::IsOutOfRange(chunked.status())) << chunked.status();
  EXPECT_EQ(chunked.status().message(), "it is above the limit of 1000 bytes");
  auto fits = f.client->Send(r);
  ASSERT_TRUE(fits.ok()) << fits.status();
  EXPECT_EQ(fits->body, std::string(900, 'f'));
  EXPECT_EQ(server.heads().size(), 3u);
}

TEST(S3ClientTest, UnreachableEndpointIsUnavailableAfterRetries) {
  std::string url = testing::UnreachableUrl();
  Fixture f = MakeClient(url, 2);
  S3Request r;
  r.key = "p/latest";
  auto response = f.client->Send(r);
  EXPECT_TRUE(absl::IsUnavailable(response.status())) << response.status().message();
  EXPECT_TRUE(absl::StrContains(response.status().message(), "cannot reach " + url));
  EXPECT_TRUE(absl::StrContains(response.status().message(), "s3://bucket/p/latest"));
  EXPECT_TRUE(absl::StrContains(response.status().message(), "after 2 attempts"));
  EXPECT_EQ(f.sleeps.size(), 1u);
}

// As the AWS SDKs do (NoCredentialsError), a request with no credentials
// anywhere is refused before it is sent, naming the sources tried and the
// way to ask for unsigned access; asked for, it goes unsigned.
TEST(S3ClientTest, WithoutCredentialsRequestsAreRefusedUnlessTheUriAsksForAnonymousAccess) {
  ScriptedServer server({ScriptedServer::Reply(200, "run-a/weight_v000001")});
  S3Environment none;
  auto loc = ParseS3Uri(absl::StrCat("s3://bucket/p?endpoint=", server.url()), none);
  ASSERT_TRUE(loc.ok()) << loc.status().message();
  auto client = S3Client::Create(*loc, none);
  ASSERT_TRUE(client.ok()) << client.status().message();
  S3Request get;
  get.key = "p/latest";
  auto refused = (*client)->Send(get);
  EXPECT_TRUE(absl::IsUnauthenticated(refused.status())) << refused.status().message();
  EXPECT_TRUE(absl::StrContains(refused.status().message(),
                                "no S3 credentials were found (sources tried: environment "
                                "variables"))
      << refused.status().message();
  EXPECT_TRUE(absl::StrContains(refused.status().message(), "anonymous=true"))
      << refused.status().message();
  EXPECT_EQ(refused.status().message().find('\n'), std::string::npos);
  EXPECT_TRUE(server.heads().empty());

  auto anonymous =
      ParseS3Uri(absl::StrCat("s3://bucket/p?endpoint=", server.url(), "&anonymous=true"), none);
  ASSERT_TRUE(anonymous.ok()) << anonymous.status().message();
  auto unsigned_client = S3Client::Create(*anonymous, none);
  ASSERT_TRUE(unsigned_client.ok());
  auto answer = (*unsigned_client)->Send(get);
  ASSERT_TRUE(answer.ok()) << answer.status().message();
  EXPECT_EQ(answer->status, 200);
  EXPECT_EQ(answer->credentials_source, "");
  ASSERT_EQ(server.heads().size(), 1u);
  EXPECT_FALSE(absl::StrContains(absl::AsciiStrToLower(server.heads()[0]), "\r\nauthorization:"))
      << server.heads()[0];
}

TEST(S3ClientTest, RefusesHalfSetCredentials) {
  auto loc = ParseS3Uri("s3://bucket/p", S3Environment{});
  ASSERT_TRUE(loc.ok());
  S3Environment env;
  env.access_key_id = "AKID";
  auto client = S3Client::Create(*loc, env);
  EXPECT_TRUE(absl::IsInvalidArgument(client.status()));
  EXPECT_TRUE(absl::StrContains(client.status().message(), "AWS_SECRET_ACCESS_KEY"));
}

}  // namespace
}  // namespace stitch

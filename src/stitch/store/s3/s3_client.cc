#include "stitch/store/s3/s3_client.h"

#include <curl/curl.h>
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>

#include "absl/random/random.h"
#include "absl/strings/ascii.h"
#include "absl/strings/escaping.h"
#include "absl/strings/match.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "stitch/core/errors.h"
#include "stitch/io/fileio.h"
#include "stitch/io/sha256.h"
#include "stitch/store/s3/curl_handles.h"
#include "stitch/store/s3/s3_credential_chain.h"
#include "stitch/store/s3/s3_xml.h"

namespace stitch {

namespace {

// Answers buffered in memory (errors, listings, indexes, pointers) are small;
// anything larger than this is refused rather than held.
constexpr size_t kMaxBufferedBody = size_t{256} << 20;

bool IsRetryableCurlCode(CURLcode code) {
  switch (code) {
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_COULDNT_RESOLVE_PROXY:
    case CURLE_COULDNT_CONNECT:
    case CURLE_OPERATION_TIMEDOUT:
    case CURLE_SEND_ERROR:
    case CURLE_RECV_ERROR:
    case CURLE_GOT_NOTHING:
    case CURLE_PARTIAL_FILE:
    case CURLE_HTTP2:
    case CURLE_HTTP2_STREAM:
    case CURLE_SSL_CONNECT_ERROR:
      return true;
    default:
      return false;
  }
}

bool IsRetryableAnswer(const S3Response& r) {
  if (r.status >= 500 || r.status == 429) return true;
  // S3 answers 400 RequestTimeout when it gave up waiting for our bytes.
  return r.status == 400 && r.ErrorCode() == "RequestTimeout";
}

long Seconds(absl::Duration d) {
  return std::max<long>(1, static_cast<long>(absl::ToInt64Seconds(d)));
}

// The state one attempt's callbacks share.
// What to check when the service could not be reached, for messages.
std::string_view UnreachableHint(CURLcode code) {
  switch (code) {
    case CURLE_COULDNT_RESOLVE_HOST:
    case CURLE_COULDNT_CONNECT:
      return "; check the endpoint (?endpoint= or AWS_ENDPOINT_URL) and that the service is up";
    case CURLE_PEER_FAILED_VERIFICATION:
    case CURLE_SSL_CACERT_BADFILE:
      return "; the service's TLS certificate is not trusted by this machine";
    default:
      return "; check the network and the service";
  }
}

// Sets up `c` for `method`, with a body of `size` bytes for PUT and POST.
void SetMethod(CURL* c, const std::string& method, uint64_t size) {
  if (method == "HEAD") {
    curl_easy_setopt(c, CURLOPT_NOBODY, 1L);
  } else if (method == "PUT") {
    curl_easy_setopt(c, CURLOPT_UPLOAD, 1L);
    curl_easy_setopt(c, CURLOPT_INFILESIZE_LARGE, static_cast<curl_off_t>(size));
  } else if (method == "POST") {
    curl_easy_setopt(c, CURLOPT_POST, 1L);
    curl_easy_setopt(c, CURLOPT_POSTFIELDSIZE_LARGE, static_cast<curl_off_t>(size));
  } else if (method != "GET") {
    curl_easy_setopt(c, CURLOPT_CUSTOMREQUEST, method.c_str());
  }
}

struct SlistDeleter {
  void operator()(curl_slist* l) const { curl_slist_free_all(l); }
};
using HeaderList = std::unique_ptr<curl_slist, SlistDeleter>;

// The headers `request` is sent with, all signed by curl: its own, the
// payload hash, and the session token of temporary credentials. None may be
// empty ("Name:" would remove a header curl adds, and curl 7.88 signs the
// removal too), so empty values are left out.
HeaderList RequestHeaders(const S3Request& request, const std::string& payload_sha256,
                          const AwsCredentials* credentials) {
  HeaderList headers;
  auto add = [&](std::string_view name, std::string_view value) {
    std::string line = absl::StrCat(AbslView(name), ": ", AbslView(value));
    headers.reset(curl_slist_append(headers.release(), line.c_str()));
  };
  for (const auto& [name, value] : request.headers) {
    if (!value.empty()) add(name, value);
  }
  add("x-amz-content-sha256", payload_sha256);
  if (credentials != nullptr && !credentials->session_token.empty()) {
    add("x-amz-security-token", credentials->session_token);
  }
  return headers;
}

struct Transfer {
  CURL* curl = nullptr;
  S3Response* response = nullptr;
  ByteSink* sink = nullptr;
  absl::Status sink_status;
  uint64_t max_buffered_body = 0;
  // The payload: a file descriptor range, or bytes in memory.
  int fd = -1;
  const std::filesystem::path* file = nullptr;
  uint64_t file_offset = 0;
  std::string_view memory;
  uint64_t size = 0;
  uint64_t sent = 0;
  absl::Status read_status;
};

size_t OnHeader(char* buffer, size_t size, size_t count, void* user) {
  auto* t = static_cast<Transfer*>(user);
  std::string_view line(buffer, size * count);
  while (!line.empty() && (line.back() == '\r' || line.back() == '\n')) line.remove_suffix(1);
  if (line.substr(0, 5) == "HTTP/") {
    // A new status line (after a 100 Continue, say): earlier headers were
    // for an interim answer.
    t->response->headers.clear();
    return size * count;
  }
  size_t colon = line.find(':');
  if (colon == std::string_view::npos) return size * count;
  std::string name = absl::AsciiStrToLower(AbslView(line.substr(0, colon)));
  std::string value(absl::StripAsciiWhitespace(AbslView(line.substr(colon + 1))));
  t->response->headers[std::move(name)] = std::move(value);
  return size * count;
}

size_t OnBody(char* buffer, size_t size, size_t count, void* user) {
  auto* t = static_cast<Transfer*>(user);
  size_t n = size * count;
  long code = 0;
  curl_easy_getinfo(t->curl, CURLINFO_RESPONSE_CODE, &code);
  if (t->sink != nullptr && code >= 200 && code < 300) {
    t->sink_status = t->sink->Write(std::string_view(buffer, n));
    return t->sink_status.ok() ? n : 0;
  }
  std::string& body = t->response->body;
  if (body.empty()) {
    // A declared length is judged before any of the body is held, and then
    // held in one buffer of that size.
    curl_off_t declared = -1;
    curl_easy_getinfo(t->curl, CURLINFO_CONTENT_LENGTH_DOWNLOAD_T, &declared);
    if (declared > 0 && static_cast<uint64_t>(declared) > t->max_buffered_body) {
      t->sink_status = absl::OutOfRangeError(absl::StrCat(
          "it is ", declared, " bytes, above the limit of ", t->max_buffered_body, " bytes"));
      return 0;
    }
    if (declared > 0) body.reserve(static_cast<size_t>(declared));
  }
  if (body.size() + n > t->max_buffered_body) {
    t->sink_status = absl::OutOfRangeError(
        absl::StrCat("it is above the limit of ", t->max_buffered_body, " bytes"));
    return 0;
  }
  body.append(buffer, n);
  return n;
}

size_t OnRead(char* buffer, size_t size, size_t count, void* user) {
  auto* t = static_cast<Transfer*>(user);
  size_t want = static_cast<size_t>(std::min<uint64_t>(size * count, t->size - t->sent));
  if (want == 0) return 0;
  if (t->fd < 0) {
    std::memcpy(buffer, t->memory.data() + t->sent, want);
    t->sent += want;
    return want;
  }
  while (true) {
    ssize_t n = ::pread(t->fd, buffer, want, static_cast<off_t>(t->file_offset + t->sent));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      t->read_status = ErrnoStatus(errno, "read", *t->file);
      return CURL_READFUNC_ABORT;
    }
    if (n == 0) {
      t->read_status = absl::DataLossError(
          absl::StrCat("read ", t->file->string(), ": the file shrank while being uploaded"));
      return CURL_READFUNC_ABORT;
    }
    t->sent += static_cast<uint64_t>(n);
    return static_cast<size_t>(n);
  }
}

}  // namespace

struct S3Client::Handle {
  CURL* curl = nullptr;
  char error[CURL_ERROR_SIZE] = {};
  ~Handle() {
    if (curl != nullptr) curl_easy_cleanup(curl);
  }
};

std::string S3Response::Header(std::string_view name) const {
  auto it = headers.find(std::string(name));
  return it == headers.end() ? std::string() : it->second;
}

std::string S3Response::MetaHeader(std::string_view name) {
  return absl::StrCat("x-amz-meta-", AbslView(name));
}

std::string S3Response::ErrorCode() const {
  if (body.empty()) return "";
  auto doc = ParseS3Error(body);
  return doc.ok() ? doc->code : std::string();
}

absl::StatusOr<std::string> RecordedSha256(const S3Response& response) {
  std::string current = absl::AsciiStrToLower(response.Metadata(kSha256MetadataKey));
  std::string legacy = absl::AsciiStrToLower(response.Metadata(kLegacySha256MetadataKey));
  if (!current.empty() && !legacy.empty() && current != legacy) {
    return absl::DataLossError(absl::StrCat(
        "the object records two different SHA-256s (", S3Response::MetaHeader(kSha256MetadataKey),
        " ", current, ", ", S3Response::MetaHeader(kLegacySha256MetadataKey), " ", legacy,
        "); it was changed by something other than stitch: republish the version"));
  }
  return current.empty() ? legacy : current;
}

absl::StatusOr<S3ObjectInfo> S3ObjectInfo::FromResponse(const S3Response& response) {
  S3ObjectInfo info;
  if (!absl::SimpleAtoi(response.Header("content-length"), &info.size)) {
    return absl::DataLossError("the service's answer has no valid Content-Length");
  }
  info.etag = response.Header("etag");
  auto sha256 = RecordedSha256(response);
  if (!sha256.ok()) return sha256.status();
  info.sha256 = *std::move(sha256);
  info.checksum_sha256 = response.Header("x-amz-checksum-sha256");
  return info;
}

S3Client::S3Client(S3Location location, S3ClientOptions options)
    : location_(std::move(location)),
      options_(std::move(options)),
      sigv4_(absl::StrCat("aws:amz:", location_.region, ":s3")) {}

S3Client::~S3Client() = default;

absl::StatusOr<std::unique_ptr<S3Client>> S3Client::Create(S3Location location,
                                                           const S3Environment& env,
                                                           S3ClientOptions options) {
  if (options.max_attempts < 1) {
    return absl::InvalidArgumentError("S3 client: max_attempts must be at least 1");
  }
  if (!options.credentials) {
    AwsCredentials keys;
    keys.access_key_id = env.access_key_id;
    keys.secret_access_key = env.secret_access_key;
    keys.session_token = env.session_token;
    AwsCredentialSettings settings = env.credentials;
    if (settings.region.empty()) settings.region = location.region;
    auto chain = MakeDefaultCredentialsChain(keys, settings);
    if (!chain.ok()) return Annotate(chain.status(), absl::StrCat("store ", location.Display()));
    options.credentials = *std::move(chain);
  }
  CurlGlobalInitOnce();
  return std::unique_ptr<S3Client>(new S3Client(std::move(location), std::move(options)));
}

std::unique_ptr<S3Client::Handle> S3Client::Acquire() {
  {
    absl::MutexLock lock(&mu_);
    if (!idle_.empty()) {
      std::unique_ptr<Handle> h = std::move(idle_.back());
      idle_.pop_back();
      return h;
    }
  }
  auto h = std::make_unique<Handle>();
  h->curl = curl_easy_init();
  return h;
}

void S3Client::Release(std::unique_ptr<Handle> handle) {
  absl::MutexLock lock(&mu_);
  idle_.push_back(std::move(handle));
}

absl::Duration S3Client::Backoff(int retry) {
  thread_local absl::BitGen gen;
  double cap = absl::ToDoubleSeconds(options_.initial_backoff) * std::ldexp(1.0, retry - 1);
  cap = std::min(cap, absl::ToDoubleSeconds(options_.max_backoff));
  if (cap <= 0) return absl::ZeroDuration();
  return absl::Seconds(absl::Uniform(gen, 0.0, cap));
}

absl::StatusOr<S3Response> S3Client::Send(const S3Request& request) {
  std::string payload_sha256 = request.payload_sha256;
  if (payload_sha256.empty()) payload_sha256 = Sha256Hex(request.body);
  const std::string url = location_.RequestUrl(request.key, request.query);
  bool refreshed = false;
  for (int attempt = 1;; ++attempt) {
    if (attempt > 1) {
      absl::Duration wait = Backoff(attempt - 1);
      if (options_.sleep) {
        options_.sleep(wait);
      } else {
        absl::SleepFor(wait);
      }
    }
    if (request.sink != nullptr) {
      if (absl::Status s = request.sink->Restart(); !s.ok()) return s;
    }
    // Signed with what is current now: a retry after the credentials
    // rotated carries the new ones. Unsigned only when the URI asks for it,
    // as the AWS SDKs go unsigned only when told to: a process that merely
    // lost its credentials must not read a bucket as an anonymous stranger.
    std::optional<AwsCredentials> credentials;
    if (!location_.anonymous) {
      absl::StatusOr<std::optional<AwsCredentials>> current = options_.credentials->Current();
      if (!current.ok()) return current.status();
      if (!current->has_value()) return NoCredentialsError();
      credentials = **std::move(current);
    }
    const AwsCredentials* signer = credentials.has_value() ? &*credentials : nullptr;
    S3Response response;
    if (signer != nullptr) response.credentials_source = signer->source;
    bool retryable = false;
    std::unique_ptr<Handle> handle = Acquire();
    if (handle->curl == nullptr) return absl::ResourceExhaustedError("cannot create a curl handle");
    absl::Status status =
        Perform(*handle, request, url, payload_sha256, signer, response, retryable);
    Release(std::move(handle));
    attempts_.fetch_add(1);
    response.attempts = attempt;
    if (!status.ok()) {
      if (retryable && attempt < options_.max_attempts) continue;
      if (!retryable) return status;
      return absl::Status(status.code(), absl::StrCat(status.message(), " (after ", attempt,
                                                      attempt == 1 ? " attempt)" : " attempts)"));
    }
    if (IsRetryableAnswer(response) && attempt < options_.max_attempts) continue;
    // Temporary credentials the service calls expired (a clock ahead of
    // ours, or revoked early): once, with fresh ones.
    if (signer != nullptr && signer->expiration && !refreshed &&
        (response.status == 400 || response.status == 403) && attempt < options_.max_attempts) {
      const std::string code = response.ErrorCode();
      if (code == "ExpiredToken" || code == "TokenRefreshRequired" || code == "RequestExpired") {
        options_.credentials->Invalidate();
        refreshed = true;
        continue;
      }
    }
    return response;
  }
}

absl::Status S3Client::Perform(Handle& h, const S3Request& request, const std::string& url,
                               const std::string& payload_sha256, const AwsCredentials* credentials,
                               S3Response& response, bool& retryable) {
  CURL* c = h.curl;
  curl_easy_reset(c);
  h.error[0] = '\0';
  Transfer t;
  t.curl = c;
  t.response = &response;
  t.sink = request.sink;
  t.max_buffered_body =
      request.max_buffered_body == 0 ? kMaxBufferedBody : request.max_buffered_body;
  UniqueFd fd;
  if (request.body_file) {
    fd = UniqueFd(::open(request.body_file->c_str(), O_RDONLY | O_CLOEXEC));
    if (!fd) return ErrnoStatus(errno, "open", *request.body_file);
    t.fd = fd.get();
    t.file = &*request.body_file;
    t.file_offset = request.body_offset;
    t.size = request.body_size;
  } else {
    t.memory = request.body;
    t.size = request.body.size();
  }

  curl_easy_setopt(c, CURLOPT_URL, url.c_str());
  curl_easy_setopt(c, CURLOPT_PROTOCOLS_STR, "http,https");
  curl_easy_setopt(c, CURLOPT_NOSIGNAL, 1L);
  curl_easy_setopt(c, CURLOPT_ERRORBUFFER, h.error);
  curl_easy_setopt(c, CURLOPT_SSL_VERIFYPEER, 1L);
  curl_easy_setopt(c, CURLOPT_SSL_VERIFYHOST, 2L);
  curl_easy_setopt(c, CURLOPT_CONNECTTIMEOUT_MS,
                   static_cast<long>(absl::ToInt64Milliseconds(options_.connect_timeout)));
  curl_easy_setopt(c, CURLOPT_LOW_SPEED_LIMIT, 1024L);
  curl_easy_setopt(c, CURLOPT_LOW_SPEED_TIME, Seconds(options_.stall_timeout));
  curl_easy_setopt(c, CURLOPT_HEADERFUNCTION, &OnHeader);
  curl_easy_setopt(c, CURLOPT_HEADERDATA, &t);
  curl_easy_setopt(c, CURLOPT_WRITEFUNCTION, &OnBody);
  curl_easy_setopt(c, CURLOPT_WRITEDATA, &t);
  if (credentials != nullptr) {
    curl_easy_setopt(c, CURLOPT_AWS_SIGV4, sigv4_.c_str());
    curl_easy_setopt(c, CURLOPT_USERNAME, credentials->access_key_id.c_str());
    curl_easy_setopt(c, CURLOPT_PASSWORD, credentials->secret_access_key.c_str());
  }

  const std::string& method = request.method;
  SetMethod(c, method, t.size);
  if (method == "PUT" || method == "POST") {
    curl_easy_setopt(c, CURLOPT_READFUNCTION, &OnRead);
    curl_easy_setopt(c, CURLOPT_READDATA, &t);
  }

  HeaderList headers = RequestHeaders(request, payload_sha256, credentials);
  // No "Expect:" override to skip "100 Continue": curl 7.88 would sign the
  // removed header, and S3 answers 100 Continue anyway.
  curl_easy_setopt(c, CURLOPT_HTTPHEADER, headers.get());

  CURLcode code = curl_easy_perform(c);
  long status = 0;
  curl_easy_getinfo(c, CURLINFO_RESPONSE_CODE, &status);
  response.status = status;
  if (code == CURLE_OK) return absl::OkStatus();
  if (!t.read_status.ok()) return t.read_status;
  if (!t.sink_status.ok()) return t.sink_status;
  retryable = IsRetryableCurlCode(code);
  std::string detail = h.error[0] != '\0' ? std::string(h.error) : curl_easy_strerror(code);
  std::string service = location_.endpoint.empty() ? absl::StrCat("AWS S3 (", location_.region, ")")
                                                   : location_.endpoint;
  return absl::UnavailableError(absl::StrCat(method, " ", location_.DisplayKey(request.key),
                                             ": cannot reach ", service, ": ", detail,
                                             AbslView(UnreachableHint(code))));
}

absl::Status S3Client::NoCredentialsError() const {
  return absl::UnauthenticatedError(absl::StrCat(
      "no S3 credentials were found (sources tried: ", options_.credentials->SourcesTried(),
      "); set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY, give the process a role "
      "(docs/deploy.md), or add anonymous=true to the store URI for unsigned access to a public "
      "bucket"));
}

absl::Status S3Client::ErrorFor(const S3Response& r, std::string_view operation,
                                std::string_view key) const {
  std::string code;
  std::string message;
  if (!r.body.empty()) {
    auto doc = ParseS3Error(r.body);
    if (doc.ok()) {
      code = doc->code;
      message = doc->message;
    }
  }
  std::string what = absl::StrCat(AbslView(operation), " ", location_.DisplayKey(key), ": HTTP ",
                                  r.status, code.empty() ? "" : " ", code,
                                  message.empty() ? "" : " (", message, message.empty() ? "" : ")");
  if (r.status == 403) {
    std::string hint;
    const std::string& source = r.credentials_source;
    const bool from_environment = absl::StartsWith(source, "environment");
    if (source.empty()) {
      hint =
          "the request was unsigned (the store URI says anonymous=true) and the bucket refuses "
          "anonymous access: drop anonymous=true and give the process credentials";
    } else if (!from_environment) {
      hint = code == "AccessDenied"
                 ? absl::StrCat("the credentials from ", source, " lack permission on this bucket")
                 : absl::StrCat("check the credentials from ", source,
                                " and the bucket's permissions");
    } else if (code == "AccessDenied") {
      hint = "the credentials in AWS_ACCESS_KEY_ID lack permission on this bucket";
    } else if (code.empty()) {
      hint =
          "check AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN and the "
          "bucket's permissions";
    } else {
      hint = "check AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY and AWS_SESSION_TOKEN";
    }
    return absl::PermissionDeniedError(absl::StrCat(what, "; access denied: ", hint));
  }
  if (r.status == 404) {
    if (code == "NoSuchBucket") {
      return absl::NotFoundError(absl::StrCat(what, "; bucket \"", location_.bucket,
                                              "\" does not exist: create it or fix the store URI"));
    }
    return absl::NotFoundError(absl::StrCat(what, "; the object (or its bucket) does not exist"));
  }
  if (r.status == 301 || r.status == 307 || code == "PermanentRedirect" ||
      code == "AuthorizationHeaderMalformed") {
    std::string region = r.Header("x-amz-bucket-region");
    return absl::FailedPreconditionError(
        absl::StrCat(what, "; the bucket is in ", region.empty() ? "another region" : region,
                     ": set ?region= in the store URI or AWS_REGION"));
  }
  if (r.status == 412) {
    return absl::FailedPreconditionError(absl::StrCat(what, "; precondition failed"));
  }
  if (r.status == 409) return absl::AbortedError(absl::StrCat(what, "; concurrent change"));
  if (r.status >= 500 || r.status == 429) {
    return absl::UnavailableError(
        absl::StrCat(what, "; the service kept failing after ", r.attempts,
                     r.attempts == 1 ? " attempt" : " attempts", "; retry later"));
  }
  return absl::InvalidArgumentError(what);
}

}  // namespace stitch

#include "stitch/fetch/peer_client.h"

#include <algorithm>
#include <chrono>
#include <optional>
#include <utility>

#include <boost/url/encode.hpp>
#include <boost/url/rfc/unreserved_chars.hpp>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "stitch/api/routes.h"
#include "stitch/core/errors.h"
#include "stitch/net/client.h"

namespace stitch {

absl::Status HttpPeerSource::Fetch(const std::string& peer, int64_t version, const StoredFile& want,
                                   int64_t wait_ms, ByteSink& sink) {
  const std::string url =
      absl::StrCat(peer, AbslView(kPeerFileRoute), "?version=", version,
                   "&name=", boost::urls::encode(want.name, boost::urls::unreserved_chars),
                   wait_ms > 0 ? absl::StrCat("&wait_ms=", wait_ms) : std::string());
  const std::string source = absl::StrCat("peer ", url);
  const std::chrono::milliseconds deadline = PeerTransferDeadline(peers_, want.size, wait_ms);
  StreamedFetchOptions options;
  if (!peers_.token.empty()) {
    options.headers.Add("Authorization", absl::StrCat("Bearer ", peers_.token));
  }
  if (!peers_.self_id.empty()) options.headers.Add(kPeerIdHeader, peers_.self_id);
  options.connect_timeout = std::max(std::chrono::milliseconds(1), peers_.connect_timeout);
  options.timeout = deadline;
  options.stall_timeout = std::max(std::chrono::milliseconds(1), peers_.stall_timeout);

  std::optional<absl::Status> answered;  // the peer's refusal, when it refused
  const absl::Status status = HttpFetchStreamed(
      url, options,
      [&](int code, const HttpHeaders& headers) -> absl::Status {
        if (code == 404) {
          answered = absl::NotFoundError(absl::StrCat(source, ": the peer does not hold it"));
        } else if (code == 409) {
          answered = absl::FailedPreconditionError(absl::StrCat(source, ": that is this replica"));
        } else if (code < 200 || code >= 300) {
          answered = absl::UnavailableError(absl::StrCat(source, ": answered ", code));
        }
        if (answered.has_value()) return *answered;
        // A sidecar streams its files chunked, without a Content-Length.
        const std::optional<std::string_view> length = headers.Get("Content-Length");
        uint64_t declared = 0;
        if (length.has_value() &&
            (!absl::SimpleAtoi(AbslView(*length), &declared) || declared != want.size)) {
          answered = WithKind(
              absl::DataLossError(absl::StrCat(source, ": declared a body of ", AbslView(*length),
                                               " bytes but the store records ", want.size)),
              ErrorKind::kChecksumMismatch);
          return *answered;
        }
        return absl::OkStatus();
      },
      [&](std::string_view bytes) -> absl::Status {
        absl::Status s = sink.Write(bytes);
        if (!s.ok()) answered = Annotate(s, source);
        return s;
      });
  if (answered.has_value()) return *answered;
  if (absl::IsDeadlineExceeded(status)) {
    return absl::UnavailableError(absl::StrCat(
        source, ": ", status.message(), "; a peer has ", deadline.count(), " ms for this ",
        want.size, "-byte file (--peer-min-rate, --peer-allowance) and must not stall"));
  }
  if (!status.ok()) return absl::UnavailableError(absl::StrCat(source, ": ", status.message()));
  return absl::OkStatus();
}

}  // namespace stitch

// Which header fields each hop of the rollout API passes on (the gateway to
// a replica, a sidecar to its engine, and the answers back).
//
// Never passed on, by any hop: the framing fields (net/http.h, which the
// HTTP library owns), `Host` (the next hop's is not the client's) and
// `Expect` (the library answers it). Beyond those, it depends on what the
// hop does with bodies:
//   kUnchanged  bodies pass as they are (the gateway), so their type and
//               encoding fields pass with them;
//   kRewritten  JSON bodies are parsed and written again (the sidecar tags
//               requests and stamps responses), so a request's
//               `Content-Type` is the hop's to set, `Accept-Encoding` is
//               dropped (a compressed answer could not be stamped), and a
//               response's `Content-Encoding` is dropped.
// A response's `Content-Length` is always the library's to set.
#pragma once

#include "stitch/net/http.h"

namespace stitch {

enum class BodyRelay { kUnchanged, kRewritten };

// The fields of a client's request to send on to the next hop.
HttpHeaders RequestHeadersToForward(const HttpHeaders& from, BodyRelay relay);

// The fields of the next hop's response to relay to the client.
HttpHeaders ResponseHeadersToRelay(const HttpHeaders& from, BodyRelay relay);
HttpHeaders ResponseHeadersToRelay(HttpHeaders&& from, BodyRelay relay);

// Whether a response is a stream of server-sent events (its Content-Type is
// text/event-stream), relayed event by event rather than whole.
bool IsEventStream(const HttpHeaders& response_headers);

}  // namespace stitch

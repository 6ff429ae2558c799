// A versioned response on its way back from an engine: the weight label the
// engine put on it, the versions the sidecar stamps on it, and the client's
// own request id restored (docs/sidecar.md, "HTTP API"). Each function
// takes one response document (an object, or an array for a batched
// /generate) or one streamed event's.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

#include "stitch/api/routes.h"

namespace boost::json {
class object;
class value;
}  // namespace boost::json

namespace stitch {

// The versions a response reports: the version at generation start
// (captured at admission) and at its end.
struct VersionStamp {
  int64_t start = 0;
  int64_t end = 0;
};

// Stamps a response object (or one streamed event) with `stamp`:
// `weight_version_start` and `weight_version_end` as integers, inside
// `meta_info` for /generate (where `meta_info.weight_version` becomes the
// start version, the one the request was admitted on, as a string, as the
// original Python Stitch reports it), at the top level for the OpenAI
// routes.
void StampResponse(ApiRoute route, boost::json::object& item, VersionStamp stamp);

// The end version StampResponse stamped on a response body:
// meta_info.weight_version_end (/generate) or weight_version_end (OpenAI
// routes), of the first document of a batch; nullopt when there is none.
std::optional<int64_t> StampedEndVersion(std::string_view body);

// The weight label an engine put on a generation response (or one streamed
// event): `meta_info.weight_version` on /generate (the first document of a
// batch), `metadata.weight_version` on the OpenAI routes; nullopt when it
// carries none (OpenAI streams of SGLang, engines that report nothing).
std::optional<std::string> ResponseWeightLabel(const boost::json::value& body);

// Gives a response object the client's own request id back where it names
// the id the engine was given (`upstream`): `meta_info.id` on /generate, the
// OpenAI `id` ("cmpl-<rid>", "chatcmpl-<rid>") on the other routes.
void RestoreRid(ApiRoute route, boost::json::object& item, std::string_view upstream,
                std::string_view client);

}  // namespace stitch

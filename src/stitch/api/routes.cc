#include "stitch/api/routes.h"

#include <algorithm>
#include <iterator>
#include <vector>

#include <boost/url/parse.hpp>

#include "absl/strings/ascii.h"
#include "absl/strings/match.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/str_split.h"
#include "stitch/core/errors.h"

namespace stitch {
namespace {

// SGLang's control surface, vLLM's (its development and RL routes), and
// Stitch's own staging routes. Sorted.
constexpr std::string_view kBlockedRoutes[] = {
    "/abort_request",
    "/abort_requests",
    "/begin_weight_update",
    "/collective_rpc",
    "/continue_generation",
    "/end_weight_update",
    "/finish_weight_update",
    "/flush_cache",
    "/inference/v1/abort_requests",
    "/init_weight_transfer_engine",
    "/init_weights_update_group",
    "/load_lora_adapter",
    "/pause",
    "/pause_generation",
    "/reconfigure",
    "/release_memory_occupation",
    "/reset_mm_cache",
    "/reset_prefix_cache",
    "/resume",
    "/resume_memory_occupation",
    "/scale_elastic_ep",
    "/set_internal_state",
    "/sleep",
    "/stage_weight_update",
    "/start_draft_weight_update",
    "/start_profile",
    "/start_weight_update",
    "/stop_profile",
    "/unload_lora_adapter",
    "/update_weight_version",
    "/update_weights",
    "/update_weights_from_cpu",
    "/update_weights_from_disk",
    "/update_weights_from_distributed",
    "/update_weights_from_ipc",
    "/update_weights_from_tensor",
    "/v1/load_lora_adapter",
    "/v1/unload_lora_adapter",
    "/wake_up",
    "/weight_checker",
};

// The engines' read-only routes, from their route tables (SGLang 0.5.23's
// http_server.py, vLLM 0.32's api_server.py and serving routers; the
// real-engine suites check them against the running engines). Sorted.
constexpr std::string_view kSglangReadOnly[] = {
    "/",
    "/get_model_info",
    "/get_server_info",
    "/health",
    "/health_generate",
    "/metrics",
    "/model_info",
    "/ping",
    "/ready",
    "/server_info",
    "/v1/models",
    "/v1/models/",
};
constexpr std::string_view kVllmReadOnly[] = {
    "/detokenize", "/health", "/load", "/metrics", "/ping", "/tokenize", "/v1/models", "/version",
};

// Routes on which the engines generate without a version that Stitch could
// constrain or stamp. Sorted.
constexpr std::string_view kUnversionedGeneration[] = {
    "/classify",
    "/encode",
    "/generate_from_file",
    "/invocations",
    "/pooling",
    "/rerank",
    "/score",
    "/v1/audio/transcriptions",
    "/v1/audio/translations",
    "/v1/embeddings",
    "/v1/messages",
    "/v1/rerank",
    "/v1/responses",
    "/v1/score",
    "/v2/rerank",
    "/vertex_generate",
};

// Kept sorted, so that a reader finds a route (or its absence) at a glance:
// checked when this file compiles.
static_assert(std::is_sorted(std::begin(kBlockedRoutes), std::end(kBlockedRoutes)));
static_assert(std::is_sorted(std::begin(kSglangReadOnly), std::end(kSglangReadOnly)));
static_assert(std::is_sorted(std::begin(kVllmReadOnly), std::end(kVllmReadOnly)));
static_assert(std::is_sorted(std::begin(kUnversionedGeneration), std::end(kUnversionedGeneration)));

// The versioned routes, for messages: "POST /generate, /v1/completions, ...".
std::string VersionedRoutesText() {
  std::vector<std::string> paths;
  for (ApiRoute route : kVersionedRoutes) paths.emplace_back(RoutePath(route));
  return absl::StrCat("POST ", absl::StrJoin(paths, ", "));
}

bool ReadOnlyMatch(std::string_view path, std::string_view route) {
  if (route.ends_with('/') && route.size() > 1) {
    return path.starts_with(route) && path.size() > route.size();
  }
  return path == route;
}

// The longest target quoted back in a refusal.
constexpr size_t kMaxQuoted = 200;

std::string Quoted(std::string_view target) {
  return absl::StrCat("\"", AbslView(target.substr(0, kMaxQuoted)),
                      target.size() > kMaxQuoted ? "...\"" : "\"");
}

// Which path bytes go on the wire unescaped: RFC 3986's unreserved and
// sub-delimiters, ':', '@' and the separator '/'. Everything else, '%' and
// '?' included, is escaped, so the engine decodes exactly `path`.
bool PathByteIsPlain(unsigned char c) {
  return absl::ascii_isalnum(c) || absl::StrContains("-._~!$&'()*+,;=:@/", static_cast<char>(c));
}

std::string EncodePath(std::string_view path) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  out.reserve(path.size());
  for (const char ch : path) {
    const auto c = static_cast<unsigned char>(ch);
    if (PathByteIsPlain(c)) {
      out.push_back(ch);
    } else {
      out.push_back('%');
      out.push_back(kHex[c >> 4]);
      out.push_back(kHex[c & 0xF]);
    }
  }
  return out;
}

}  // namespace

std::string_view DialectName(EngineDialect dialect) {
  return dialect == EngineDialect::kVllm ? "vllm" : "sglang";
}

std::span<const std::string_view> ReadOnlyRoutes(EngineDialect dialect) {
  if (dialect == EngineDialect::kVllm) return kVllmReadOnly;
  return kSglangReadOnly;
}

std::optional<std::string> NotForwardedWhy(std::string_view path,
                                           std::span<const EngineDialect> dialects) {
  // A forwarded route (the common case) costs only the comparisons; the
  // list of routes to use is written for a refusal alone.
  for (EngineDialect dialect : dialects) {
    for (std::string_view route : ReadOnlyRoutes(dialect)) {
      if (ReadOnlyMatch(path, route)) return std::nullopt;
    }
  }
  for (std::string_view generation : kUnversionedGeneration) {
    if (path == generation) {
      return absl::StrCat(AbslView(path),
                          " generates without a weight version, which Stitch can neither "
                          "constrain nor stamp, so it is not forwarded; generate through ",
                          VersionedRoutesText());
    }
  }
  std::vector<std::string> allowed;
  for (EngineDialect dialect : dialects) {
    for (std::string_view route : ReadOnlyRoutes(dialect)) {
      allowed.push_back(route.ends_with('/') && route.size() > 1
                            ? absl::StrCat(AbslView(route), "<id>")
                            : std::string(route));
    }
  }
  std::sort(allowed.begin(), allowed.end());
  allowed.erase(std::unique(allowed.begin(), allowed.end()), allowed.end());
  return absl::StrCat(AbslView(path),
                      " is not forwarded to the engine: only Stitch's versioned routes (",
                      VersionedRoutesText(), ") and the engine's read-only routes (",
                      absl::StrJoin(allowed, ", "), ") are");
}

absl::StatusOr<CanonicalTarget> CanonicalizeTarget(std::string_view target) {
  if (target.find('#') != std::string_view::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat("request target ", Quoted(target),
                     " has a fragment ('#'); a fragment is not sent to a server: remove it"));
  }
  auto parsed = boost::urls::parse_origin_form(target);
  if (!parsed) {
    return absl::InvalidArgumentError(absl::StrCat(
        "request target ", Quoted(target),
        " is not a valid path and query (a '%' must begin an escape of two hex digits, and "
        "spaces and other special characters must be escaped)"));
  }
  const std::string decoded = parsed->path();
  for (const char ch : decoded) {
    const auto c = static_cast<unsigned char>(ch);
    if (c < 0x20 || c == 0x7F) {
      return absl::InvalidArgumentError(absl::StrCat(
          "request target ", Quoted(target), " decodes to a path with a control character"));
    }
  }
  // Segments as an engine's router would resolve them once decoded: an
  // escaped '/' separates like a plain one.
  std::vector<absl::string_view> segments;
  for (absl::string_view segment : absl::StrSplit(decoded, '/', absl::SkipEmpty())) {
    if (segment == ".") continue;
    if (segment == "..") {
      if (segments.empty()) {
        return absl::InvalidArgumentError(
            absl::StrCat("request target ", Quoted(target), " climbs above the root with \"..\""));
      }
      segments.pop_back();
      continue;
    }
    segments.push_back(segment);
  }
  CanonicalTarget out;
  out.path = absl::StrCat("/", absl::StrJoin(segments, "/"));
  const bool trailing = decoded.size() > 1 && decoded.back() == '/';
  const bool dot_end = absl::EndsWith(decoded, "/.") || absl::EndsWith(decoded, "/..");
  if ((trailing || dot_end) && !segments.empty()) out.path.push_back('/');
  out.target = EncodePath(out.path);
  if (parsed->has_query()) {
    const auto query = parsed->encoded_query();
    absl::StrAppend(&out.target, "?", AbslView(std::string_view(query.data(), query.size())));
  }
  return out;
}

std::string_view RoutePath(ApiRoute route) {
  switch (route) {
    case ApiRoute::kGenerate:
      return "/generate";
    case ApiRoute::kCompletions:
      return "/v1/completions";
    case ApiRoute::kChatCompletions:
      return "/v1/chat/completions";
    case ApiRoute::kTokens:
      return "/inference/v1/generate";
  }
  return "";
}

ClassifiedRoute ClassifyRoute(std::string_view path) {
  for (ApiRoute route : kVersionedRoutes) {
    if (path == RoutePath(route)) return {RouteClass::kVersioned, route};
  }
  while (path.size() > 1 && path.back() == '/') path.remove_suffix(1);
  for (std::string_view blocked : kBlockedRoutes) {
    if (absl::EqualsIgnoreCase(AbslView(path), AbslView(blocked))) return {RouteClass::kBlocked};
  }
  return {RouteClass::kOther};
}

}  // namespace stitch

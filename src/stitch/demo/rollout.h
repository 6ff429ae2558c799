// The demo's rollouts on the wire: the /generate request a rollout worker
// sends (through the gateway or a sidecar) and what it reads back.
#pragma once

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "absl/status/statusor.h"
#include "stitch/api/response.h"

namespace stitch {

struct RolloutRequest {
  std::vector<int32_t> prompt;  // input_ids, BOS first
  int64_t max_new_tokens = 8;
  double temperature = 1.0;
  uint64_t seed = 0;
  std::optional<int64_t> min_version;  // weight_version.min_version
};

// The SGLang /generate body: input_ids, sampling_params (max_new_tokens,
// temperature, seed, ignore_eos), return_logprob and weight_version.
std::string GenerateRequestBody(const RolloutRequest& request);

struct GeneratedRollout {
  std::vector<int32_t> output_ids;
  std::vector<double> logprobs;  // behaviour log-probabilities, one per output id
  int64_t version_start = 0;     // meta_info.weight_version_start (stamped by the sidecar)
  int64_t version_end = 0;       // meta_info.weight_version_end
  // meta_info.weight_version_spans: which version generated which tokens;
  // nullopt when the sidecar could not tell ("unknown") or sent none.
  std::optional<VersionSpans> spans;
};

// Parses a /generate response. InvalidArgument, naming the field, when the
// body is not JSON, lacks output_ids or the sidecar's version stamps, or has
// a different number of log-probabilities than output ids.
[[nodiscard]] absl::StatusOr<GeneratedRollout> ParseGenerateResponse(std::string_view body);

// The same rollout as a /v1/completions body for vLLM's API: the prompt as
// token ids, `logprobs: 0` and `return_tokens_as_token_ids`.
std::string CompletionRequestBody(const RolloutRequest& request);

// Reads a stamped /v1/completions response: the ids from the
// "token_id:<id>" tokens of the choice's logprobs, their log-probabilities,
// and the top-level weight_version_start/end. InvalidArgument naming what
// is missing otherwise.
[[nodiscard]] absl::StatusOr<GeneratedRollout> ParseCompletionResponse(std::string_view body);

}  // namespace stitch
